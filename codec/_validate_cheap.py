"""The cheap tier of :func:`~trajflight.codec.validate_group`: byte-level checks that can only accept.

Each check reads Arrow buffers through read-only numpy views or ``memoryview`` (no pass of
``pyarrow.compute``, no copy beyond a few KiB of offsets and key bytes) and answers "certainly fine?":
the value every row holds, or True, only where the precise check in :mod:`trajflight.codec._validate`
would accept too; :data:`UNSURE` or False wherever it is not sure (an unusual type, a null, a buffer
shorter than its array, as ``full=False`` validation lets through, offsets not starting at 0).

It does not guarantee anything beyond that: it never refuses, never words an error, does not look at
Arrow's structural validity (``RecordBatch.validate`` does) nor at nulls, but for one case: top_p_ids and
top_p_probs null for the same samples, rows that span no token (a sample without candidates, as Arrow and
``encode_group`` build it), whose validity bitmaps and offsets it compares. It is correct only as a filter
in front of the precise checks, which :func:`validate_group` runs whenever an answer here is not a
certain yes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import pyarrow as pa

__all__ = ["UNSURE", "Same", "ragged_agree", "same_for", "same_offsets"]

# same(column, expected or None) -> the value every row holds (expected, or the first row's), or UNSURE.
Same = Callable[[pa.Array, object], object]
UNSURE = object()

# Arrow types whose buffers()[1] holds len + 1 offsets (from array.offset), by type id.
_OFFSET_DTYPES: dict[int, np.dtype] = {
    t.id: np.dtype(d)
    for t, d in (
        (pa.list_(pa.null()), np.int32),
        (pa.large_list(pa.null()), np.int64),
        (pa.string(), np.int32),
        (pa.large_string(), np.int64),
        (pa.binary(), np.int32),
        (pa.large_binary(), np.int64),
    )
}
_LIST_TYPE_IDS = frozenset({pa.list_(pa.null()).id, pa.large_list(pa.null()).id})


def same_offsets(a: pa.Array, b: pa.Array) -> bool:
    """Whether two list columns read one offsets buffer from the same position (the zero-copy encode path
    shares response_ids' offsets with the per-token columns); False says nothing about their lengths."""
    return bool(
        a.offset == b.offset and a.buffers()[1].address == b.buffers()[1].address and len(a) == len(b)
    )


def same_for(type_: pa.DataType) -> Same | None:
    """The cheap "every row holds one value" for an Arrow type, or None where only the precise one applies."""
    if pa.types.is_integer(type_):
        code = {8: "b", 16: "h", 32: "i", 64: "q"}[type_.bit_width]
        signed = pa.types.is_signed_integer(type_)
        return partial(_constant_int, packer=struct.Struct("=" + (code if signed else code.upper())))
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        dtype = _OFFSET_DTYPES[type_.id]
        return partial(_constant_str, dtype=dtype, limit=int(np.iinfo(dtype).max))
    if pa.types.is_dictionary(type_) and pa.types.is_integer(type_.index_type):
        inner = same_for(type_.value_type)
        if inner is not None and not pa.types.is_integer(type_.value_type):
            return partial(_constant_dict, index_size=type_.index_type.bit_width // 8, same=inner)
    return None


def _constant_int(column: pa.Array, value: object, *, packer: struct.Struct) -> object:
    """``value`` (the first row's when None) if every row of integer ``column`` holds it, else UNSURE.

    Compares the data bytes with the value packed n times: Arrow stores integers in native byte order, as
    ``struct`` packs with ``=``.
    """
    buffer = column.buffers()[1]
    n, size = len(column), packer.size
    start = column.offset * size
    data = memoryview(buffer)[start : start + n * size].tobytes() if buffer is not None else b""
    if len(data) != n * size:
        return UNSURE
    if value is None:
        value = packer.unpack_from(data)[0]
    elif type(value) is not int:  # bool, float, numpy scalars: the precise check compares them as before
        return UNSURE
    try:
        packed = packer.pack(value)
    except struct.error:  # outside the type's range: the precise check words the mismatch
        return UNSURE
    return value if data == packed * n else UNSURE


def _constant_str(column: pa.Array, value: object, *, dtype: np.dtype, limit: int) -> object:
    """``value`` (the first row's when None) if every row of string ``column`` holds it, else UNSURE.

    Every row holds it when the offsets step by its UTF-8 length and the bytes they span repeat it.
    """
    buffers = column.buffers()
    n = len(column)
    offsets = _view(buffers[1], dtype, n + 1, column.offset)
    if offsets is None or buffers[2] is None:
        return UNSURE
    first = int(offsets[0])
    if value is None:
        try:
            value = memoryview(buffers[2])[first : int(offsets[1])].tobytes().decode()
        except UnicodeDecodeError:  # only when full=False let bad UTF-8 through
            return UNSURE
    elif type(value) is not str:
        return UNSURE
    try:
        encoded = value.encode()
    except UnicodeEncodeError:  # a lone surrogate
        return UNSURE
    width = len(encoded)
    last = first + width * n
    if width == 0 or first < 0 or last > limit:
        return UNSURE
    if offsets.tobytes() != np.arange(first, last + 1, width, dtype=dtype).tobytes():
        return UNSURE
    return value if memoryview(buffers[2])[first:last].tobytes() == encoded * n else UNSURE


def _constant_dict(column: pa.Array, value: object, *, index_size: int, same: Same) -> object:
    """``value`` (the first row's when None) if every row of dictionary ``column`` holds it, else UNSURE.

    Every row holds it when the dictionary has one entry, that entry is the value, and every index is 0
    (indices are read, not trusted: ``full=False`` lets indices out of range through).
    """
    dictionary = column.dictionary
    if len(dictionary) != 1 or dictionary.null_count:
        return UNSURE
    value = same(dictionary, value)
    buffer = column.buffers()[1]
    n = len(column)
    start = column.offset * index_size
    indices = memoryview(buffer)[start : start + n * index_size].tobytes() if buffer is not None else b""
    return value if indices == bytes(n * index_size) else UNSURE


def _view(buffer: pa.Buffer | None, dtype: np.dtype, count: int, offset: int) -> np.ndarray | None:
    """``count`` values of ``dtype`` from element ``offset`` of ``buffer``: a read-only numpy view, no copy.

    It aliases the Arrow buffer (CPU memory the array owns). None where the buffer is missing or too short,
    which only an array validated with ``full=False`` (or not at all) can present.
    """
    if buffer is None or offset < 0 or count < 0:
        return None
    try:
        return np.frombuffer(buffer, dtype, count, offset * dtype.itemsize)
    except ValueError:
        return None


def _offsets(array: pa.Array) -> np.ndarray | None:
    """The ``len + 1`` offsets of a list or string ``array``, or None for other types.

    A read-only numpy view of the array's Arrow offsets buffer (no copy; it aliases memory the array owns,
    on the CPU), from ``array.offset``: a slice's offsets need not start at 0.
    """
    dtype = _OFFSET_DTYPES.get(array.type.id)
    if dtype is None:
        return None
    return _view(array.buffers()[1], dtype, len(array) + 1, array.offset)


def _same_lengths(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two offsets arrays give the same row lengths (lengths are differences of offsets)."""
    if len(a) != len(b):
        return False
    if a.dtype == b.dtype and a[0] == b[0]:  # the usual case: both start at 0, so compare bytes
        return a.tobytes() == b.tobytes()
    return bool(np.array_equal(a - a[0], b - b[0]))  # each rebased in its own dtype, as np.diff would


def _inner_offsets(column: pa.Array) -> np.ndarray | None:
    """Offsets of the lists nested in a list-of-lists ``column``'s rows: one per token, plus one."""
    if column.type.id not in _LIST_TYPE_IDS:
        return None
    outer = _offsets(column)
    child = column.values  # the whole child, not sliced by column.offset
    dtype = _OFFSET_DTYPES.get(child.type.id)
    if outer is None or dtype is None:
        return None
    start, stop = child.offset + int(outer[0]), child.offset + int(outer[-1])
    return _view(child.buffers()[1], dtype, stop - start + 1, start)


def _validity(array: pa.Array) -> np.ndarray | None:
    """One bool per row of ``array`` (True: not null), unpacked from its validity bitmap (a copy of
    ``len(array)`` bools; the bitmap itself is read through a view). None where the array has no bitmap
    or one too short for its rows, which only ``full=False`` validation lets through."""
    buffer = array.buffers()[0]
    start, n = array.offset, len(array)
    if buffer is None or start < 0 or buffer.size * 8 < start + n:
        return None
    first = start // 8
    bytes_ = np.frombuffer(buffer, np.uint8, (start + n + 7) // 8 - first, first)
    skip = start - first * 8
    return np.unpackbits(bytes_, count=skip + n, bitorder="little")[skip:].view(np.bool_)


def _null_rows_agree(ids: pa.Array, probs: pa.Array, reference: np.ndarray) -> bool:
    """Whether top_p_ids and top_p_probs, each with null rows, are null for the same rows, those rows
    span no token in either column, and every other row spans as many tokens as response_ids' row
    (``reference``: its offsets). What the precise checks accept, as Arrow and ``encode_group`` build a
    sample without candidates; False where not sure (a null row spanning tokens, one column null alone).

    Reads the two validity bitmaps and the three offsets buffers (views; copies of a few bools and
    lengths per row), never the tokens.
    """
    if not ids.null_count or not probs.null_count:
        return False  # null rows in one column only: the precise check names the first
    valid, other = _validity(ids), _validity(probs)
    if valid is None or other is None or valid.tobytes() != other.tobytes():
        return False
    if len(valid) + 1 != len(reference):  # before the batch (ragged_columns_agree): no broadcasting
        return False
    ids_offsets, probs_offsets = _offsets(ids), _offsets(probs)
    if ids_offsets is None or probs_offsets is None or not _same_lengths(ids_offsets, probs_offsets):
        return False
    # Lengths in each column's own offsets dtype, as the precise check's np.diff takes them (slices
    # subtracted: the same values, without np.diff's fixed cost at a group's few rows).
    lengths = ids_offsets[1:] - ids_offsets[:-1]
    return bool((lengths == (reference[1:] - reference[:-1]) * valid).all())


def ragged_agree(
    columns: Sequence[pa.Array], candidates: tuple[pa.Array, pa.Array] | None, *, try_shared: bool
) -> bool:
    """The cheap check_ragged_lengths: ``columns`` (response_ids first) and the top-p candidate sets.

    ``try_shared`` first asks whether a column shares response_ids' offsets buffer (a few attribute reads):
    worth it only where that is likely. A per-token column with null rows is not sure, except the two of
    ``candidates`` (the same array objects as in ``columns``) null for the same rows that span no token
    (:func:`_null_rows_agree`).
    """
    response = columns[0]
    pair = () if candidates is None else candidates
    reference: np.ndarray | None = None
    for column in columns[1:]:
        if column.null_count:
            if any(column is c for c in pair):
                continue  # samples without candidates: the pair's rows are compared below
            return False  # null rows are exempt: the precise check masks them
        if try_shared and same_offsets(column, response):
            continue
        if reference is None:
            reference = _offsets(response)
        lengths = _offsets(column)
        if reference is None or lengths is None or not _same_lengths(lengths, reference):
            return False
    if candidates is None:
        return True
    ids, probs = candidates
    if ids.null_count or probs.null_count:  # Arrow keeps the counts: O(1) without null rows
        if reference is None:
            reference = _offsets(response)
        if reference is None or not _null_rows_agree(ids, probs, reference):
            return False
    # Null rows that span no token leave in both columns the valid rows' tokens alone, in order.
    inner_ids, inner_probs = _inner_offsets(ids), _inner_offsets(probs)
    return inner_ids is not None and inner_probs is not None and _same_lengths(inner_ids, inner_probs)
