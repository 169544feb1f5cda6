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


def with_partitions(
    groups: pa.RecordBatch | EncodedGroups, partitions: Sequence[Partition]
) -> pa.RecordBatch | EncodedGroups:
    """The groups with their key columns set to ``partitions``, one per group, in order.

    Args:
        groups: One group's record batch (one partition), or groups encoded together (one partition per
            group; their joined batch gets the key columns of every group at once).
        partitions: The groups' partitions.

    Returns:
        The same kind as ``groups``. The key columns are new arrays; every other column is the input's
        (no copy). An :class:`EncodedGroups` comes back with its ``nbytes`` counted again.

    Raises:
        InvalidRequestError: not one partition per group.
    """
    keys = [Partition(*p) for p in partitions]
    if isinstance(groups, EncodedGroups):
        if len(keys) != len(groups.rows):
            raise InvalidRequestError(
                f"with_partitions: {len(keys)} partitions for {len(groups.rows)} groups; pass one per group"
            )
        joined = _keyed(groups.joined, keys, groups.rows)
        return EncodedGroups(joined, groups.rows, group_nbytes(joined, groups.rows))
    if len(keys) != 1:
        raise InvalidRequestError(
            f"with_partitions: a record batch is one group and takes one partition, got {len(keys)}"
        )
    return _keyed(groups, keys, (groups.num_rows,))


def _keyed(batch: pa.RecordBatch, keys: Sequence[Partition], rows: Sequence[int]) -> pa.RecordBatch:
    total = batch.num_rows
    if len({(k.job_id, k.epoch) for k in keys}) == 1:
        columns = [
            pa.repeat(pa.scalar(keys[0].job_id, pa.string()), total),
            pa.repeat(pa.scalar(keys[0].epoch, pa.int64()), total),
        ]
    else:
        counts = np.asarray(rows, dtype=np.int64)
        columns = [
            pa.array(np.repeat(np.array([k.job_id for k in keys], dtype=object), counts), pa.string()),
            pa.array(np.repeat(np.array([k.epoch for k in keys], dtype=np.int64), counts)),
        ]
    gids = np.array([k.group_id for k in keys], dtype=np.int64)
    columns.append(pa.array(np.repeat(gids, np.asarray(rows, dtype=np.int64))))
    for front, ((name, type_), column) in enumerate(zip(_KEY_TYPES, columns, strict=True)):
        index = batch.schema.get_field_index(name)
        if index >= 0:
            batch = batch.set_column(index, batch.schema.field(index).with_type(type_), column)
        else:
            batch = batch.add_column(front, pa.field(name, type_, nullable=False), column)
    return batch
