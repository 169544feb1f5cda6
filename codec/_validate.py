"""Validation of trajectory groups that come from outside (a writer, a Flight stream, a file).

Every check is vectorised (no Python loop per row) and raises :class:`~trajflight.errors.SchemaError`
naming the column and, where one row is at fault, the first such row. Nothing is modified, and the payload
is not copied (the cheap checks below copy at most a few KiB of offsets and key values).

Storage servers validate every group they receive, so each check has two tiers: a cheap one that can only
accept (null counts, key columns compared as raw bytes, list offsets compared through numpy views of the
Arrow buffers), and the precise one (``pyarrow.compute``), run only when the cheap one does not accept, that
finds the first offending row and words the error. The cheap tier never decides a refusal, so errors are
those of the precise checks; where it is not sure (an unusual type, a null) it defers to them. The one
null it accepts is a sample without top-p candidates: None in top_p_ids and top_p_probs alike, a null row
spanning no token (its validity bitmaps and offsets compared, a few bytes a row). Its byte-level checks
live in :mod:`trajflight.codec._validate_cheap`; the plan that orders them is below, remembered with the
trajectory schema per Arrow schema. Both stay because they pay on the standard workload (BENCHMARKS.md,
"The codec").

It does not check semantic plausibility (token ids inside a vocabulary, logprobs <= 0): NaN and inf
logprobs are legal data and round-trip unchanged. It does not refuse what decode alone refuses in columns
the schema lets hold it: null entries inside rows of user columns and null rows of nullable ``list<T>``
user columns are valid groups, which decode takes with ``columns=[...]``. A null row of a nullable list of
lists (a sample without top-p candidates) is valid too, and decode reads it as a sample of zero tokens;
where both top-p columns are present it must be null in both (decode would otherwise misalign them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajflight.codec._schema import KEY_COLUMNS, RAGGED_TOKEN_COLUMNS, STANDARD_SCHEMA, TrajectorySchema
from trajflight.codec._validate_cheap import UNSURE, Same, ragged_agree, same_for, same_offsets
from trajflight.errors import SchemaError
from trajflight.keys import Partition

__all__ = [
    "NO_NULL_ENTRY_COLUMNS",
    "check_null_entries",
    "check_nulls",
    "check_ragged_lengths",
    "check_same_null_rows",
    "ragged_columns_agree",
    "validate_group",
]

# The standard ragged columns whose entries decode hands to torch and numpy, which have no nulls: a null
# entry inside one of their rows (where the leaf type is numeric) is refused, by encode_group and here alike.
# User columns keep theirs (every user column round-trips, nulls included).
NO_NULL_ENTRY_COLUMNS: tuple[str, ...] = ("prompt_ids", *RAGGED_TOKEN_COLUMNS)


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
    if column.null_count:  # only a custom schema can declare a key column nullable
        row = _first_false(pc.is_valid(column))
        raise SchemaError(
            f"column {name!r} row {row} is null: every sample carries its group's key; fill it",
            column=name,
            row=row,
        )
    value = column[0].as_py() if expected is None else expected
    bounds = pc.min_max(column)  # one pass; constant iff min == max == value (nulls refused above)
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
    for name in batch.schema.names:  # in column order: the same column is named on every run
        if name not in schema.non_nullable:
            continue
        column = batch.column(name)
        if column.null_count:
            row = _first_false(pc.is_valid(column))
            raise SchemaError(
                f"column {name!r} row {row} is null; the column is not nullable", column=name, row=row
            )


def _numeric_list_depth(type_: pa.DataType) -> int:
    """1 for ``list<T>``, 2 for ``list<list<T>>`` (large lists alike) with numeric T; 0 for any other type."""
    depth = 0
    while depth < 2 and (pa.types.is_list(type_) or pa.types.is_large_list(type_)):
        type_, depth = type_.value_type, depth + 1
    return depth if pa.types.is_integer(type_) or pa.types.is_floating(type_) else 0


def _entries_valid(array: pa.Array, nested: bool) -> bool:
    """Whether ``array``'s children hold no null at all: Arrow's kept null counts, no pass over the data.

    The whole child, not only the part the rows span: False means "not sure", as a slice or a null row
    may cover the null (:func:`_refuse_null_entry` then looks at the rows).
    """
    tokens = array.values
    return not tokens.null_count and not (nested and tokens.values.null_count)


def check_null_entries(array: pa.Array, *, column: str) -> None:
    """No null entry inside a row of ``array`` (nor, nested, a null token or candidate) where it is a
    ``list<T>`` or ``list<list<T>>`` (or large list) with numeric T; any other type passes.

    decode hands these columns' values to torch and numpy, which have no nulls, and refuses them: a group
    holding one in a standard column could be stored but never trained on. The caller decides which
    columns the rule applies to (:data:`NO_NULL_ENTRY_COLUMNS`). Null rows are the schema's to allow or
    refuse (:func:`check_nulls`), and entries under a null row or outside a slice are not in any row.
    Cheap where there is none: the children's null counts, which Arrow keeps; only then are rows read.

    Raises:
        SchemaError: naming the column, the row and the entry (or token and candidate).
    """
    depth = _numeric_list_depth(array.type)
    if depth and not _entries_valid(array, depth == 2):
        _refuse_null_entry(array, column=column, nested=depth == 2)


def _refuse_null_entry(array: pa.Array, *, column: str, nested: bool) -> None:
    """The precise :func:`check_null_entries` (``nested`` for a list of lists): raises on the first null
    entry inside a row, or returns where the children's nulls lie outside every row."""
    rows = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)  # the row of each entry
    entries = pc.list_flatten(array)  # the rows' entries in order (a null row holds none)

    def locate(index: int) -> tuple[int, int]:
        """(row, position in the row) of entry ``index``."""
        row = int(rows[index])
        return row, index - int(np.searchsorted(rows, row))

    if entries.null_count:
        row, entry = locate(int(pc.index(pc.is_null(entries), True).as_py()))
        what, hint = ("token", "pass [] for a token without candidates") if nested else ("entry", "fill it")
        raise SchemaError(
            f"column {column!r} row {row} {what} {entry} is null: {hint}, or drop the sample (decode "
            "refuses nulls inside ragged rows)",
            column=column,
            row=row,
        )
    if nested:
        candidates = pc.list_flatten(entries)
        if candidates.null_count:
            at = int(pc.index(pc.is_null(candidates), True).as_py())
            token_of = pc.list_parent_indices(entries).to_numpy(zero_copy_only=False)
            token = int(token_of[at])
            row, entry = locate(token)
            candidate = at - int(np.searchsorted(token_of, token))
            raise SchemaError(
                f"column {column!r} row {row} token {entry} candidate {candidate} is null: give every "
                "candidate a value or leave it out (decode refuses nulls inside ragged rows)",
                column=column,
                row=row,
            )


def _check_null_entries_of(batch: pa.RecordBatch) -> None:
    """:func:`check_null_entries` of the batch's :data:`NO_NULL_ENTRY_COLUMNS`, in column order."""
    for i, name in enumerate(batch.schema.names):
        if name in NO_NULL_ENTRY_COLUMNS:
            check_null_entries(batch.column(i), column=name)


def _lengths(column: pa.Array) -> np.ndarray:
    offsets = column.offsets.to_numpy(zero_copy_only=False)  # respects a slice; rows + 1 integers
    return np.diff(offsets)


def check_ragged_lengths(batch: pa.RecordBatch) -> None:
    """Per-token columns agree in length per sample, and top-p candidate sets per token; top_p_ids and
    top_p_probs (where both are present) are null, a sample without candidates, for the same samples.

    Raises:
        SchemaError: naming the column and the first row (and token) that disagree.
    """
    names = batch.schema.names
    present = [n for n in RAGGED_TOKEN_COLUMNS if n in names]
    if "response_ids" not in present:
        return
    try:
        columns = [batch.column(n) for n in present]
    except KeyError:  # a name repeated: the precise check meets it where it always did
        _check_ragged_precisely(batch)
        return
    pair = None
    if _has_candidates(names):
        pair = (columns[present.index("top_p_ids")], columns[present.index("top_p_probs")])
    # encode_group calls this on batches whose per-token columns share response_ids' offsets buffer.
    if not ragged_agree(columns, pair, try_shared=True):
        _check_ragged_precisely(batch)


def ragged_columns_agree(columns: Mapping[str, pa.Array]) -> bool:
    """The cheap tier of :func:`check_ragged_lengths` over a group's columns by name, before the batch.

    True only where the per-token columns certainly agree (the zero-copy encode path: one offsets buffer
    shared by all of them); False means "not sure": run :func:`check_ragged_lengths` on the batch.
    """
    if "response_ids" not in columns:
        return True  # nothing to compare, as check_ragged_lengths finds
    present = [columns[n] for n in RAGGED_TOKEN_COLUMNS if n in columns]
    pair = None
    if "top_p_ids" in columns and "top_p_probs" in columns:
        pair = (columns["top_p_ids"], columns["top_p_probs"])
    return bool(ragged_agree(present, pair, try_shared=True))  # bool(): mypy sees the import as Any


def _has_candidates(names: Sequence[str]) -> bool:
    return "top_p_ids" in names and "top_p_probs" in names


def _check_ragged_precisely(batch: pa.RecordBatch) -> None:
    names = batch.schema.names
    present = [n for n in RAGGED_TOKEN_COLUMNS if n in names]
    if "response_ids" not in present:
        return
    response = batch.column("response_ids")
    reference: np.ndarray | None = None
    for name in present[1:]:
        column = batch.column(name)
        if same_offsets(column, response):
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
    if _has_candidates(names):
        _check_candidate_sets(batch.column("top_p_ids"), batch.column("top_p_probs"))


def _check_candidate_sets(ids: pa.Array, probs: pa.Array) -> None:
    """top_p_ids and top_p_probs null (no candidates) for the same samples, then candidate sets of equal
    size per token in the other samples. Without null rows (Arrow's kept null counts) the first part costs
    nothing; with them it reads the validity of both columns, and the second filters both (a copy)."""
    rows = np.arange(len(ids))
    valid = check_same_null_rows(ids, probs)
    if valid is not None:
        ids, probs = ids.filter(valid), probs.filter(valid)
        rows = rows[valid]
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


def check_same_null_rows(ids: pa.Array, probs: pa.Array) -> np.ndarray | None:
    """top_p_ids and top_p_probs (arrays of equal length) null, a sample without candidates, for the
    same rows: decode reads a null row as zero tokens, so a row null in one alone misaligns the two.

    Returns:
        The rows' validity (a new numpy bool array), or None where neither column has a null row (Arrow's
        kept null counts: O(1), nothing read).

    Raises:
        SchemaError: naming the column that is null alone and the first such row.
    """
    if not (ids.null_count or probs.null_count):
        return None
    valid: np.ndarray = ids.is_valid().to_numpy(zero_copy_only=False)
    disagree = valid != probs.is_valid().to_numpy(zero_copy_only=False)
    if disagree.any():
        row = int(np.argmax(disagree))
        _refuse_lone_null_row(row, ids_valid=bool(valid[row]))
    return valid


def _refuse_lone_null_row(row: int, *, ids_valid: bool) -> None:
    """Raise for a sample that is null (None, no candidates) in one top-p column and not in the other:
    decode reads a null row as zero tokens, so the two columns' samples would no longer line up."""
    name, other = ("top_p_probs", "top_p_ids") if ids_valid else ("top_p_ids", "top_p_probs")
    raise SchemaError(
        f"column {name!r} row {row} is None but {other} row {row} is not: both must be None for the same "
        "samples (a sample without candidates is None in top_p_ids and top_p_probs alike); pass None in "
        "both, or the candidates and their probabilities in both",
        column=name,
        row=row,
    )


def validate_group(
    batch: pa.RecordBatch,
    schema: TrajectorySchema = STANDARD_SCHEMA,
    *,
    expect: Partition | None = None,
    full: bool = True,
) -> Partition | None:
    """Check that ``batch`` is one well-formed trajectory group.

    Checks, in order: Arrow's own ``RecordBatch.validate(full=...)`` (offsets in range, UTF-8, ...);
    required columns present and standard columns of the declared types; no nulls in non-nullable
    columns; no null entry inside a row of the standard numeric ragged columns (``prompt_ids`` and the
    per-token ones below: decode could not decode the group; user columns keep theirs, as in
    ``encode_group``); every row carrying the same ``job_id``/``epoch``/``group_id`` (and equal to
    ``expect`` when given); per-token columns of equal length per sample (``response_ids``,
    ``response_logprobs``, ``loss_mask``, ``top_p_ids``, ``top_p_probs``) and top-p candidate sets of equal
    size per token. Only Arrow's own validation depends on ``full``.

    A null row of a nullable column (``top_p_ids``/``top_p_probs`` in the standard schema: a sample without
    candidates, as ``encode_group`` writes ``None``) is valid; decode reads it as a sample of zero tokens.
    Where both top-p columns are present it must be null in both (decode would give the two columns
    different outer offsets); either column alone may have null rows. Checked only where a column has
    null rows (Arrow's kept null counts: O(1) without); rows null in both columns and spanning no token,
    as ``encode_group`` and pyarrow build them, cost a comparison of the two validity bitmaps and
    offsets (no ``pyarrow.compute`` pass), any other null row the precise checks.

    Args:
        batch: The group.
        schema: The job's schema.
        expect: The partition the group is meant for; rows naming another partition are refused.
        full: Run Arrow's full (O(n)) structural validation; keep True for data from outside. The
            checks after it run either way (the null entries' by Arrow's kept null counts, O(1) per
            column where there is none).

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
    names = batch.schema.names
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise SchemaError(
            f"column {twice!r} appears more than once; give every column its own name", column=twice
        )
    schema.check(batch.schema)
    plan = _plan(schema, batch.schema)
    if plan is None or batch.num_rows == 0:  # an unusual layout, or nothing to check: the precise path
        check_nulls(batch, schema)
        _check_null_entries_of(batch)
        values = [
            _check_constant(batch, name, None if expect is None else getattr(expect, name))
            for name in KEY_COLUMNS[:3]
        ]
        check_ragged_lengths(batch)
    else:
        values = _checks_by_plan(batch, schema, plan, expect)
    if values[0] is None:
        return None
    return Partition(str(values[0]), int(values[1]), int(values[2]))  # type: ignore[call-overload]


# --- The cheap tier -------------------------------------------------------------------------------------
#
# The plan below, and the byte-level checks of trajflight.codec._validate_cheap that it calls, answer
# "certainly fine?" (False or UNSURE when not sure); the caller then runs the precise check of that step,
# which raises or passes. Steps run in validate_group's order, so the error is the one the precise checks
# alone would raise.


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where the checks find their columns in one Arrow schema (column indices), worked out once.

    Attributes:
        non_nullable: Columns the trajectory schema declares non-nullable.
        keys: ``(name, index, same)`` of job_id, epoch and group_id, ``same`` being the cheap "every row
            holds one value" of the column's type.
        ragged: The per-token columns present, response_ids first; empty without response_ids.
        candidates: top_p_ids and top_p_probs, when both are present (and response_ids is).
        entries: ``(name, index, nested)`` of the :data:`NO_NULL_ENTRY_COLUMNS` present whose leaf type is
            numeric, in column order; ``nested`` for a list of lists.
    """

    non_nullable: tuple[int, ...]
    keys: tuple[tuple[str, int, Same], ...]
    ragged: tuple[int, ...]
    candidates: tuple[int, int] | None
    entries: tuple[tuple[str, int, bool], ...]


def _plan(schema: TrajectorySchema, arrow: pa.Schema) -> _Plan | None:
    """The plan of ``arrow`` under ``schema``, or None where the precise path is the one; remembered with
    ``schema`` (equal Arrow schemas share a plan: it reads names, types and nullability only)."""
    plan: _Plan | None = schema._derived("validation plan", arrow, _make_plan, schema, arrow)
    return plan


def _make_plan(schema: TrajectorySchema, arrow: pa.Schema) -> _Plan | None:
    names = arrow.names
    if len(set(names)) != len(names):
        return None  # a repeated name: the precise path, which looks columns up by name, decides
    where = {name: i for i, name in enumerate(names)}
    keys = []
    for name in KEY_COLUMNS[:3]:
        index = where.get(name)
        same = None if index is None else same_for(arrow.field(index).type)
        if index is None or same is None:
            return None
        keys.append((name, index, same))
    ragged = tuple(where[n] for n in RAGGED_TOKEN_COLUMNS if n in where) if "response_ids" in where else ()
    candidates = (where["top_p_ids"], where["top_p_probs"]) if ragged and _has_candidates(names) else None
    non_nullable = tuple(i for i, name in enumerate(names) if name in schema.non_nullable)
    entries = tuple(
        (name, i, depth == 2)
        for i, name in enumerate(names)
        if name in NO_NULL_ENTRY_COLUMNS and (depth := _numeric_list_depth(arrow.field(i).type))
    )
    return _Plan(non_nullable, tuple(keys), ragged, candidates, entries)


def _checks_by_plan(
    batch: pa.RecordBatch, schema: TrajectorySchema, plan: _Plan, expect: Partition | None
) -> list[object]:
    """validate_group's checks after the schema's, for a batch of at least one row; the key values."""
    # Each column is wrapped once (a Python object per call) and shared by the steps.
    columns: dict[int, pa.Array] = {}
    for i in plan.non_nullable:
        column = columns[i] = batch.column(i)
        if column.null_count:
            check_nulls(batch, schema)  # raises, naming the first null
    for name, i, nested in plan.entries:
        column = columns.get(i)
        if column is None:
            column = columns[i] = batch.column(i)
        if not _entries_valid(column, nested):
            _refuse_null_entry(column, column=name, nested=nested)  # raises, or finds the nulls in no row
    values: list[object] = []
    for name, i, same in plan.keys:
        column = columns.get(i)
        if column is None:
            column = columns[i] = batch.column(i)
        expected = None if expect is None else getattr(expect, name)
        value = UNSURE if column.null_count else same(column, expected)
        if value is UNSURE:
            value = _check_constant(batch, name, expected)  # raises, or finds the cheap check was unsure
        values.append(value)
    if plan.ragged:
        ragged = [columns[i] if i in columns else batch.column(i) for i in plan.ragged]
        pair = None
        if plan.candidates is not None:
            ids, probs = plan.candidates
            pair = (ragged[plan.ragged.index(ids)], ragged[plan.ragged.index(probs)])
        # Batches from IPC (all that servers see) carry one offsets buffer per column.
        if not ragged_agree(ragged, pair, try_shared=False):
            _check_ragged_precisely(batch)
    return values
