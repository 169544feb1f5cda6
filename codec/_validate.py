"""Validation of trajectory groups that come from outside (a writer, a Flight stream, a file).

Every check is vectorised with ``pyarrow.compute`` (no Python loop per row) and raises
:class:`~trajflight.errors.SchemaError` naming the column and, where one row is at fault, the first such
row. Nothing is modified or copied.

It does not check semantic plausibility (token ids inside a vocabulary, logprobs <= 0): NaN and inf
logprobs are legal data and round-trip unchanged.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajflight.codec._schema import KEY_COLUMNS, RAGGED_TOKEN_COLUMNS, STANDARD_SCHEMA, TrajectorySchema
from trajflight.errors import SchemaError

__all__ = ["GroupKey", "check_nulls", "check_ragged_lengths", "validate_group"]


class GroupKey(NamedTuple):
    """The partition key of a group: ``(job_id, epoch, group_id)``.

    A named tuple rather than a frozen dataclass: storage servers look keys up several times per group on
    every read and put, and a tuple's hash and equality run in C (a dataclass's ran in Python: ~170 us of
    the ~280 us a same-host read of 64 groups spent in the server). It equals the plain tuple, and the
    controller's ``Partition``, of the same three values.
    """

    job_id: str
    epoch: int
    group_id: int


def _first_false(mask: pa.Array | pa.ChunkedArray) -> int | None:
    """Index of the first false (or null) entry of a boolean array, or None when all are true."""
    filled = pc.fill_null(mask, False)
    if pc.all(filled).as_py() in (True, None):
        return None
    return int(pc.index(filled, False).as_py())


def _check_constant(batch: pa.RecordBatch, name: str, expected: object | None) -> object | None:
    column = batch.column(name)
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if len(column) == 0:
        return expected
    value = column[0].as_py() if expected is None else expected
    bounds = pc.min_max(column)  # one pass; constant iff min == max == value (nulls were refused)
    if bounds["min"].as_py() == value and bounds["max"].as_py() == value:
        return value
    row = _first_false(pc.equal(column, pa.scalar(value, type=column.type)))
    if row is not None:
        raise SchemaError(
            f"column {name!r} row {row} is {column[row].as_py()!r}, expected {value!r}: all samples of "
            "a group share job_id, epoch and group_id; put samples of different groups separately",
            column=name,
            row=row,
        )
    return value


def check_nulls(batch: pa.RecordBatch, schema: TrajectorySchema) -> None:
    """No nulls in columns the schema declares non-nullable.

    Raises:
        SchemaError: naming the column and its first null row.
    """
    for name in schema.non_nullable.intersection(batch.schema.names):
        column = batch.column(name)
        if column.null_count:
            row = _first_false(pc.is_valid(column))
            raise SchemaError(
                f"column {name!r} row {row} is null; the column is not nullable", column=name, row=row
            )


def _lengths(column: pa.Array) -> np.ndarray:
    offsets = column.offsets.to_numpy(zero_copy_only=False)  # respects a slice; rows + 1 integers
    return np.diff(offsets)


def _same_offsets(a: pa.Array, b: pa.Array) -> bool:
    return bool(
        a.offset == b.offset and a.buffers()[1].address == b.buffers()[1].address and len(a) == len(b)
    )


def check_ragged_lengths(batch: pa.RecordBatch) -> None:
    """Per-token columns agree in length per sample, and top-p candidate sets per token.

    Raises:
        SchemaError: naming the column and the first row (and token) that disagree.
    """
    names = batch.schema.names
    present = [n for n in RAGGED_TOKEN_COLUMNS if n in names]
    if "response_ids" not in present:
        return
    response = batch.column("response_ids")
    reference: np.ndarray | None = None
    for name in present[1:]:
        column = batch.column(name)
        if _same_offsets(column, response):
            continue  # one offsets buffer shared by both columns (the zero-copy encode path)
        if reference is None:
            reference = _lengths(response)
        lengths = _lengths(column)
        differs = lengths != reference
        if column.null_count:
            # A null top_p row means "no candidates recorded" and is exempt.
            differs &= column.is_valid().to_numpy(zero_copy_only=False)
        if differs.any():
            row = int(np.argmax(differs))
            raise SchemaError(
                f"column {name!r} row {row} has {lengths[row]} entries but response_ids has "
                f"{reference[row]}: per-token columns need one entry per response token",
                column=name,
                row=row,
            )
    if "top_p_ids" in names and "top_p_probs" in names:
        _check_candidate_sets(batch.column("top_p_ids"), batch.column("top_p_probs"))


def _check_candidate_sets(ids: pa.Array, probs: pa.Array) -> None:
    rows = np.arange(len(ids))
    if ids.null_count or probs.null_count:
        # Rows without candidates on either side are exempt (filtering copies; only with nulls).
        both = pc.and_(pc.is_valid(ids), pc.is_valid(probs))
        ids, probs = ids.filter(both), probs.filter(both)
        rows = rows[both.to_numpy(zero_copy_only=False)]
    # list_flatten of a null-free list array is a zero-copy slice of its values.
    inner_ids, inner_probs = _lengths(pc.list_flatten(ids)), _lengths(pc.list_flatten(probs))
    differs = inner_ids != inner_probs
    if differs.any():
        token = int(np.argmax(differs))
        starts = np.concatenate(([0], np.cumsum(_lengths(ids))))
        local = int(np.searchsorted(starts, token, side="right") - 1)
        row = int(rows[local])
        raise SchemaError(
            f"column 'top_p_probs' row {row} token {token - int(starts[local])} has "
            f"{inner_probs[token]} candidates but top_p_ids has {inner_ids[token]}",
            column="top_p_probs",
            row=row,
        )


def validate_group(
    batch: pa.RecordBatch,
    schema: TrajectorySchema = STANDARD_SCHEMA,
    *,
    expect: GroupKey | None = None,
    full: bool = True,
) -> GroupKey | None:
    """Check that ``batch`` is one well-formed trajectory group.

    Checks, in order: Arrow's own ``RecordBatch.validate(full=...)`` (offsets in range, UTF-8, ...);
    required columns present and standard columns of the declared types; no nulls in non-nullable
    columns; every row carrying the same ``job_id``/``epoch``/``group_id`` (and equal to ``expect`` when
    given); per-token columns of equal length per sample (``response_ids``, ``response_logprobs``,
    ``loss_mask``, ``top_p_ids``, ``top_p_probs``) and top-p candidate sets of equal size per token.

    Args:
        batch: The group.
        schema: The job's schema.
        expect: The partition the group is meant for; rows naming another partition are refused.
        full: Run Arrow's full (O(n)) structural validation; keep True for data from outside.

    Returns:
        The group's key, or None for a batch with zero rows and no ``expect``.

    Raises:
        SchemaError: naming the column and the first offending row.
    """
    if not isinstance(batch, pa.RecordBatch):
        raise SchemaError(f"expected a pyarrow.RecordBatch, got {type(batch).__name__}")
    try:
        batch.validate(full=full)
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        raise SchemaError(f"invalid Arrow data: {exc}; the writer sent a malformed record batch") from exc
    schema.check(batch.schema)
    check_nulls(batch, schema)
    values = [
        _check_constant(batch, name, None if expect is None else getattr(expect, name))
        for name in KEY_COLUMNS[:3]
    ]
    check_ragged_lengths(batch)
    if values[0] is None:
        return None
    return GroupKey(str(values[0]), int(values[1]), int(values[2]))  # type: ignore[call-overload]
