"""Key columns of groups encoded elsewhere: :func:`with_partitions` sets the partitions they were granted.

A writer that is handed groups already encoded (a caller's record batch, or an :class:`EncodedGroups`)
stores them under the partitions the controller grants, whatever key they were encoded with: their
``job_id``, ``epoch`` and ``group_id`` columns are set to those partitions (added in front, in key
order, where missing; ``job_id`` becomes ``string``, as the encoder builds it). Nothing else changes and
nothing else is copied: other columns, sample ids included, stay as they were encoded.

It does not validate the groups (:func:`~trajflight.codec.validate_group` does).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from trajflight.codec._encode_many import EncodedGroups
from trajflight.codec._nbytes import group_nbytes
from trajflight.errors import InvalidRequestError
from trajflight.keys import Partition

__all__ = ["with_partitions"]

_KEY_TYPES = (("job_id", pa.string()), ("epoch", pa.int64()), ("group_id", pa.int64()))
_KEY_NAMES = [name for name, _ in _KEY_TYPES]
_KEY_TYPE_LIST = [type_ for _, type_ in _KEY_TYPES]


def with_partitions(
    groups: pa.RecordBatch | EncodedGroups | Sequence[pa.RecordBatch], partitions: Sequence[Partition]
) -> pa.RecordBatch | EncodedGroups | list[pa.RecordBatch]:
    """The groups with their key columns set to ``partitions``, one per group, in order.

    Args:
        groups: One group's record batch (one partition); groups encoded together (one partition per
            group: their joined batch gets every group's key columns at once); or a list of groups'
            record batches (one partition each).
        partitions: The groups' partitions.

    Returns:
        The same kind as ``groups`` (a list for a list). The key columns are new arrays (those of equal
        job, epoch and length shared by the batches of one call; Arrow arrays are immutable); every other
        column is the input's (no copy). An :class:`EncodedGroups` comes back with its ``nbytes`` counted
        again for the new key columns.

    Raises:
        InvalidRequestError: not one partition per group.
    """
    keys = [p if type(p) is Partition else Partition(*p) for p in partitions]
    if isinstance(groups, EncodedGroups):
        _check_count(len(keys), len(groups.rows))
        joined = _keyed(groups.joined, keys, groups.rows, {})
        changed = _changed_keys(groups.joined)
        before = _key_nbytes(groups.joined, groups.rows, changed)
        after = _key_nbytes(joined, groups.rows, changed)
        nbytes = tuple(n - b + a for n, b, a in zip(groups.nbytes, before, after, strict=True))
        return EncodedGroups(joined, groups.rows, nbytes)
    if isinstance(groups, pa.RecordBatch):
        _check_count(len(keys), 1)
        return _keyed(groups, keys, (groups.num_rows,), {})
    _check_count(len(keys), len(groups))
    shared: dict[tuple[str, int, int], tuple[pa.Array, pa.Array]] = {}
    return [_keyed(b, [k], (b.num_rows,), shared) for b, k in zip(groups, keys, strict=True)]


def _check_count(partitions: int, groups: int) -> None:
    if partitions != groups:
        raise InvalidRequestError(
            f"with_partitions: {partitions} partitions for {groups} groups; pass one partition per group"
        )


def _keyed(
    batch: pa.RecordBatch,
    keys: Sequence[Partition],
    rows: Sequence[int],
    shared: dict[tuple[str, int, int], tuple[pa.Array, pa.Array]],
) -> pa.RecordBatch:
    """``batch`` (groups of ``rows`` rows each, in order) under ``keys``; ``shared`` holds the job and
    epoch columns already built in this call, by (job, epoch, rows)."""
    total = batch.num_rows
    first = keys[0]
    if all(k.job_id == first.job_id and k.epoch == first.epoch for k in keys):
        found = shared.get((first.job_id, first.epoch, total))
        if found is None:
            epochs = np.full(total, first.epoch, dtype=np.int64)
            found = (pa.repeat(pa.scalar(first.job_id, pa.string()), total), pa.array(epochs))
            shared[first.job_id, first.epoch, total] = found
        columns = list(found)
    else:
        counts = np.asarray(rows, dtype=np.int64)
        columns = [
            pa.array(np.repeat(np.array([k.job_id for k in keys], dtype=object), counts), pa.string()),
            pa.array(np.repeat(np.array([k.epoch for k in keys], dtype=np.int64), counts)),
        ]
    if len(keys) == 1:
        columns.append(pa.array(np.full(total, first.group_id, dtype=np.int64)))
    else:
        gids = np.array([k.group_id for k in keys], dtype=np.int64)
        columns.append(pa.array(np.repeat(gids, np.asarray(rows, dtype=np.int64))))
    schema = batch.schema
    fields = [schema.field(i) for i in range(min(3, len(schema)))]
    if [f.name for f in fields] == _KEY_NAMES and [f.type for f in fields] == _KEY_TYPE_LIST:
        # The encoder's layout: the key columns lead, of the key types (set_column keeps their fields;
        # from_arrays with the schema checks every column again, ten times the cost).
        for index, (field, column) in enumerate(zip(fields, columns, strict=True)):
            batch = batch.set_column(index, field, column)
        return batch
    for front, ((name, type_), column) in enumerate(zip(_KEY_TYPES, columns, strict=True)):
        index = batch.schema.get_field_index(name)
        if index >= 0:
            batch = batch.set_column(index, batch.schema.field(index).with_type(type_), column)
        else:
            batch = batch.add_column(front, pa.field(name, type_, nullable=False), column)
    return batch


def _changed_keys(batch: pa.RecordBatch) -> list[str]:
    """The key columns whose bytes keying may change: the job id, and any other that is missing, of
    another type or holds nulls (an int64 column without nulls takes the same bytes whatever it holds)."""
    changed = ["job_id"]
    for name, type_ in _KEY_TYPES[1:]:
        index = batch.schema.get_field_index(name)
        if index < 0 or batch.schema.field(index).type != type_ or batch.column(index).null_count:
            changed.append(name)
    return changed


def _key_nbytes(batch: pa.RecordBatch, rows: Sequence[int], names: Sequence[str]) -> tuple[int, ...]:
    """Per group, the bytes of ``batch``'s columns ``names`` (as ``EncodedGroups.nbytes`` counts them;
    a missing one counts nothing)."""
    present = [name for name in names if name in batch.schema.names]
    if not present:
        return (0,) * len(rows)
    keys = pa.RecordBatch.from_arrays([batch.column(n) for n in present], names=present)
    counted: tuple[int, ...] = group_nbytes(keys, rows)
    return counted
