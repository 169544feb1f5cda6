"""Bytes per group of a joined record batch: what each group's rows occupy in its buffers, vectorised.

``RecordBatch.nbytes`` of each slice walks every column once per group; ``get_total_buffer_size``
of a slice counts the whole parent buffers. :func:`group_nbytes` reads the offsets at the groups'
boundaries once per column with numpy (read-only views of the Arrow buffers, no copy of the payload).

What it counts, per group and column: the validity bytes the rows cover (where the column has a bitmap),
the fixed-width values, ``rows + 1`` offsets of each list/string level and the child entries or bytes
those offsets span, the whole dictionary of a dictionary column. Each column counts its own buffers (a
buffer two columns share counts for each). That is Arrow's ``RecordBatch.nbytes`` of the slice plus the
one offset per level Arrow leaves out (it counts ``rows`` offsets, and a copy of the rows needs
``rows + 1``), so it is never smaller than what a copy of the group's rows alone holds.

It does not count exactly for types it does not walk (unions, list and string views, run-end encoded):
those take ``get_total_buffer_size()`` of the slice, the whole buffers, an upper bound.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["group_nbytes"]

# Offsets dtype of the variable-size types, by type id.
_OFFSETS: dict[int, np.dtype] = {
    t.id: np.dtype(d)
    for t, d in (
        (pa.list_(pa.null()), np.int32),
        (pa.large_list(pa.null()), np.int64),
        (pa.map_(pa.int8(), pa.null()), np.int32),
        (pa.string(), np.int32),
        (pa.large_string(), np.int64),
        (pa.binary(), np.int32),
        (pa.large_binary(), np.int64),
    )
}
_NESTED = frozenset(
    t.id for t in (pa.list_(pa.null()), pa.large_list(pa.null()), pa.map_(pa.int8(), pa.null()))
)


def group_nbytes(batch: pa.RecordBatch, rows: Sequence[int]) -> tuple[int, ...]:
    """The bytes of each group's rows in ``batch``, for groups of ``rows`` consecutive rows each.

    Reads ``batch``'s offsets buffers through read-only numpy views (no copy); the module docstring says
    what is counted.

    Raises:
        ValueError: ``rows`` do not add up to the batch's rows.
    """
    bounds = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(rows, out=bounds[1:])
    if bounds[-1] != batch.num_rows:
        raise ValueError(f"rows add up to {int(bounds[-1])}, the batch has {batch.num_rows}")
    total = np.zeros(len(rows), dtype=np.int64)
    for column in batch.columns:
        total += _column_bytes(column, bounds)
    return tuple(total.tolist())


def _column_bytes(array: pa.Array, bounds: np.ndarray) -> np.ndarray:
    """Bytes of each row range ``bounds[i]:bounds[i + 1]`` (logical rows of ``array``) in its buffers."""
    type_ = array.type
    if isinstance(type_, pa.BaseExtensionType):
        array, type_ = array.storage, type_.storage_type
    if type_.id == pa.null().id:
        return np.zeros(len(bounds) - 1, dtype=np.int64)
    rows: np.ndarray = np.diff(bounds)
    buffers = array.buffers()
    size: np.ndarray = _validity(buffers[0], array.offset, bounds)
    offsets_dtype = _OFFSETS.get(type_.id)
    if offsets_dtype is not None:
        start = array.offset * offsets_dtype.itemsize
        offsets = np.frombuffer(buffers[1], offsets_dtype, len(array) + 1, start)
        at = offsets[bounds].astype(np.int64)
        size += (rows + 1) * offsets_dtype.itemsize
        if type_.id in _NESTED:
            size += _column_bytes(array.values, at)  # .values: the whole child, which the offsets index
        else:
            size += np.diff(at)  # string and binary data: one byte an entry
    elif pa.types.is_boolean(type_):
        size += _validity(buffers[1], array.offset, bounds)  # bit-packed, as a bitmap
    elif pa.types.is_fixed_size_list(type_):
        size += _column_bytes(array.values, (bounds + array.offset) * type_.list_size)  # whole child
    elif pa.types.is_struct(type_):
        for i in range(type_.num_fields):
            size += _column_bytes(array.field(i), bounds)  # .field applies the slice
    elif pa.types.is_dictionary(type_):
        whole = _column_bytes(array.dictionary, np.array([0, len(array.dictionary)], dtype=np.int64))
        size += rows * (type_.index_type.bit_width // 8) + int(whole[0])
    elif _fixed_width(type_):
        size += rows * (type_.bit_width // 8)
    else:  # a type not walked here: the whole buffers the slice references, an upper bound
        starts = bounds[:-1].tolist()
        size = np.array(
            [array.slice(s, n).get_total_buffer_size() for s, n in zip(starts, rows.tolist(), strict=True)],
            dtype=np.int64,
        )
    return size


def _fixed_width(type_: pa.DataType) -> bool:
    """Whether ``type_`` is one buffer of whole bytes per value (numbers, temporal, decimal, fixed binary)."""
    fixed = pa.types.is_primitive(type_) or pa.types.is_decimal(type_) or pa.types.is_fixed_size_binary(type_)
    return bool(fixed and type_.bit_width % 8 == 0)


def _validity(bitmap: pa.Buffer | None, offset: int, bounds: np.ndarray) -> np.ndarray:
    """Bytes of ``bitmap`` each row range covers (Arrow's covering bytes); 0 without a bitmap."""
    if bitmap is None:
        return np.zeros(len(bounds) - 1, dtype=np.int64)
    starts: np.ndarray = bounds[:-1] + offset
    stops: np.ndarray = bounds[1:] + offset
    covering: np.ndarray = (stops + 7) // 8 - starts // 8
    return covering
