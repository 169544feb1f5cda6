"""Validation of many trajectory groups at once: :func:`validate_group` of each, with one pass of
Python for the lot instead of one per group.

A storage server receives a ``put_many`` as one stream, the groups one after another; checking them one
``validate_group`` call at a time costs a few tens of microseconds of Python per group, far more than
Arrow's own validation of its rows. :func:`validate_groups` runs the same checks over the stream's table at
once: Arrow's full validation of every batch (the very call ``validate_group`` makes), the schema and the
plan of checks once, null counts summed over the chunks, each key column compared with the expected keys
in one vectorised pass, and per-token lengths compared for every row in one pass of ``pyarrow.compute``.
Like the cheap tier of :mod:`trajflight.codec._validate`, the pass only ever accepts: wherever it is not
sure (a null in a checked column, an unusual type, any error), it falls back to ``validate_group`` group by
group, so a refusal and its message are exactly ``validate_group``'s, naming the group's own row.

It guarantees nothing more than ``validate_group(batch, schema, expect=key, full=True)`` of each group's
batches; it modifies nothing and copies only key values and row lengths (a few bytes a row).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajflight.codec._schema import KEY_COLUMNS, TrajectorySchema
from trajflight.codec._validate import _entries_valid, _plan, validate_group
from trajflight.errors import SchemaError
from trajflight.keys import Partition

__all__ = ["validate_groups"]

# What the pass may meet on data that validate_group then refuses, or on types it does not expect: the
# group-by-group path decides then. Any other exception is a bug and propagates.
_UNSURE = (
    SchemaError,
    pa.ArrowInvalid,
    pa.ArrowTypeError,
    pa.ArrowNotImplementedError,
    OverflowError,
    ValueError,
)


def validate_groups(
    table: pa.Table, schema: TrajectorySchema, keys: Sequence[Partition], rows: Sequence[int]
) -> None:
    """``validate_group(batch, schema, expect=key, full=True)`` of every batch of every group of ``table``.

    ``table`` holds the groups one after another: ``keys[i]`` is the key of the ``rows[i]`` rows after
    those of the groups before it (``sum(rows)`` must be ``table.num_rows``). Its chunks may hold one group
    each, several, or one group in several: each group's rows are validated as the batches they lie in
    (a chunk holding several groups is checked as ``validate_group`` of each group's slice would). Zero
    copy of the payload; the table is read, never modified.

    Raises:
        SchemaError: ``validate_group``'s refusal of the first invalid group (its own message and row).
        ValueError: ``rows`` does not add up to the table's rows, or is not one count per key.
    """
    if len(rows) != len(keys) or sum(rows) != table.num_rows:
        raise ValueError(
            f"validate_groups: {len(rows)} row counts for {len(keys)} groups of {table.num_rows} rows"
        )
    try:
        if _accepts(table, schema, keys, rows):
            return
    except _UNSURE:
        pass
    offset = 0
    for key, n in zip(keys, rows, strict=True):  # the precise error, group by group
        for batch in table.slice(offset, n).to_batches():
            if batch.num_rows:
                validate_group(batch, schema, expect=key, full=True)
        offset += n


def _accepts(
    table: pa.Table, schema: TrajectorySchema, keys: Sequence[Partition], rows: Sequence[int]
) -> bool:
    """Whether every group certainly passes ``validate_group``; False (or an :data:`_UNSURE` error)
    where not sure."""
    if not keys or 0 in rows:
        return False
    for batch in table.to_batches():
        batch.validate(full=True)  # Arrow's own checks, batch by batch, as validate_group makes them
    names = table.schema.names
    if len(set(names)) != len(names):
        return False
    schema.check(table.schema)  # one schema for the table: checked once
    plan = _plan(schema, table.schema)
    if plan is None:
        return False
    columns = table.columns
    if any(columns[i].null_count for i in plan.non_nullable):
        return False
    for _, i, nested in plan.entries:
        if not all(_entries_valid(chunk, nested) for chunk in columns[i].chunks):
            return False
    counts = np.asarray(rows, dtype=np.int64)
    for name, i, _ in plan.keys:
        if not _holds_keys(columns[i], name, keys, counts):
            return False
    if plan.ragged:
        ragged = [columns[i] for i in plan.ragged]
        if any(c.null_count for c in ragged):
            return False  # null rows (samples without candidates): the per-group checks look at them
        reference = _lengths(ragged[0])
        if any(not np.array_equal(_lengths(c), reference) for c in ragged[1:]):
            return False
        if plan.candidates is not None:
            ids, probs = (columns[i] for i in plan.candidates)
            if not np.array_equal(_lengths(pc.list_flatten(ids)), _lengths(pc.list_flatten(probs))):
                return False
    return True


def _lengths(column: pa.ChunkedArray) -> np.ndarray:
    """Row lengths of a list column without nulls, every chunk (a copy of 4 bytes a row)."""
    lengths: np.ndarray = pc.list_value_length(column).to_numpy()
    return lengths


def _holds_keys(
    column: pa.ChunkedArray | pa.Array, name: str, keys: Sequence[Partition], rows: np.ndarray
) -> bool:
    """Whether key column ``name`` holds, with no null, the keys of groups ``keys`` of ``rows`` rows
    each, one after another. Raises OverflowError for a key beyond int64 (the caller then checks group by
    group)."""
    if column.null_count:
        return False
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()  # a few bytes a row: the key values alone
    if name == KEY_COLUMNS[0]:  # job_id: string, or a dictionary of strings
        want = pa.array(np.repeat(np.array([k.job_id for k in keys], dtype=object), rows), pa.string())
        return bool(column.cast(want.type).equals(want))
    values = np.array([k.epoch for k in keys] if name == "epoch" else [k.group_id for k in keys], np.int64)
    if column.type == pa.int64():  # the standard type: compared in place, no Arrow array built
        held = column.to_numpy()  # no nulls: a view of the column's buffer
        want = np.repeat(values, rows)
        return held.shape == want.shape and bool((held == want).all())
    return bool(column.cast(pa.int64()).equals(pa.array(np.repeat(values, rows))))
