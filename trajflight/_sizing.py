"""What a put reserves: an upper bound of a group's encoded bytes, from the inputs before they are encoded.

A writer asks the controller for a partition (and capacity) before it encodes, so that the group is
encoded once, under its real key and with the default sample ids of that key. The reservation must be at
least what the encoded group will be charged (``get_total_buffer_size`` of ``encode_group``'s batch, or
its entry of ``EncodedGroups.nbytes``); publish gives the rest back.

The bound follows the shapes of the inputs and the column types of the job's schema, never their values:

* numpy arrays, tensors, ``(values, offsets)``, :class:`~trajflight.codec.Ragged`,
  :class:`~trajflight.codec.Padded`, :class:`~trajflight.codec.DoublyRagged` and nested tensors: every
  array's entries at the column's width (whole arrays, as an aliased buffer is stored whole), plus the
  offsets of each list level; exact but for the validity bitmaps, counted as if every level had one;
* Python sequences: their lengths, level by level (strings by their UTF-8 bytes; numbers of an inferred
  type at 8 bytes, the widest pyarrow infers);
* pyarrow arrays: their buffers, plus what a cast to the column's type builds;
* the key columns at their exact size, the default sample ids as for the largest group id (19 digits).

It does not check the inputs: a group the encoder refuses is refused after its partition was granted,
which then expires unused (the job's ``grant_ttl``). Nor is it the charge: a group whose bound passes the
job's ``max_group_bytes`` is refused as too large even where its encoded bytes would fit (the bound is
above them by the bitmaps and shared offsets for arrays, the padding of a ``Padded``, the inferred width
of Python numbers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from trajflight.codec import STANDARD_SCHEMA, DoublyRagged, Padded, Ragged, TrajectorySchema

__all__ = ["keyed_bound", "keyed_bounds", "reservations"]

_ID_DIGITS = len(str(np.iinfo(np.int64).max))  # the longest group id a default sample id can hold
_MASK = pa.list_(pa.uint8())  # the default loss mask: one byte per response token
_EMPTY = pa.struct([])  # the standard schema's telemetry: fields left to inference
_NUMBER = 8  # bytes of a Python number as pyarrow infers it (int64, double)


def reservations(groups: Sequence[Mapping[str, Any]], *, job_id: str, epoch: int) -> list[int]:
    """Per group, the bytes to reserve for it before it is encoded (see the module docstring).

    Each is at least what the group is charged once encoded under any group id, alone
    (``encode_group(job_id=job_id, epoch=epoch, group_id=g, **groups[i])``) or with the others
    (``encode_groups``, which gives the groups one dictionary per dictionary column: each group's bound
    counts every group's dictionary values). Columns the encoder does not know count nothing.
    """
    fixed = _Fixed(job_id, epoch)
    sizes: list[int] = []
    dictionaries = 0
    for columns in groups:
        size, dictionary = _group(columns, fixed)
        sizes.append(size - dictionary)
        dictionaries += dictionary
    return [size + dictionaries for size in sizes]


def keyed_bound(nbytes: int, rows: int, job_id: str) -> int:
    """The bound of a group already encoded (charged ``nbytes``, with ``rows`` samples) once its key
    columns are set to a partition of ``job_id`` (they are replaced, or added where missing)."""
    return keyed_bounds([nbytes], [rows], job_id)[0]


def keyed_bounds(nbytes: Sequence[int], rows: Sequence[int], job_id: str) -> list[int]:
    """:func:`keyed_bound` of each of several groups already encoded, for one job."""
    fixed = _Fixed(job_id, 0)
    return [n + fixed.keys(r) for n, r in zip(nbytes, rows, strict=True)]


class _Fixed:
    """What the key columns and the default sample ids of a group of ``rows`` samples take, for one job
    and epoch (computed once per size in a call)."""

    def __init__(self, job_id: str, epoch: int) -> None:
        self.job_bytes = len(job_id.encode(errors="replace"))
        self.id_bytes = len(f"{job_id}/{epoch}//".encode(errors="replace")) + _ID_DIGITS
        self._sizes: dict[int, tuple[int, int]] = {}

    def keys(self, rows: int) -> int:
        """job_id, epoch, group_id and sample_index."""
        return _level(rows) + rows * (self.job_bytes + 8 + 8 + 4) + 3 * _bits(rows)

    def of(self, rows: int) -> tuple[int, int]:
        """(the key columns, the default sample ids) of ``rows`` samples."""
        found = self._sizes.get(rows)
        if found is None:
            ids = _level(rows) + rows * self.id_bytes + _digits_below(rows)
            found = self._sizes[rows] = (self.keys(rows), ids)
        return found


def _group(columns: Mapping[str, Any], fixed: _Fixed) -> tuple[int, int]:
    """(the bound of one group, the part of it its dictionaries take)."""
    schema = columns.get("schema", STANDARD_SCHEMA)
    if schema is STANDARD_SCHEMA:
        plans = _STANDARD
    elif isinstance(schema, TrajectorySchema):
        plans = {name: _plan(schema.field(name).type) for name in columns if name in schema}
    else:
        plans = _STANDARD  # refused by the encoder
    extra = columns.get("extra") or {}
    responses = columns.get("response_ids")
    rows = _rows(responses)
    keys, ids = fixed.of(rows)
    given = columns.get("sample_ids")
    total = keys + (ids if given is None else _column(given, pa.string(), rows))
    if columns.get("loss_mask") is None:
        total += _column(responses, _MASK, rows)
    dictionaries = 0
    for items, known in ((columns.items(), plans), (extra.items(), None)):
        for name, value in items:
            if value is None:
                continue
            plan = plans.get(name) if known is not None else _extra_plan(name, schema)
            if plan is None:
                continue  # sample_ids, extra, schema (counted above), or refused by the encoder
            type_, list_width, width, dictionary = plan
            kind = type(value)
            # The common forms first, counted inline (a writer puts thousands of groups a second).
            if name == "prompt_ids" and known is not None and _flat(value):
                stored = rows * _entries(value)  # one prompt, stored once per sample
                size = _level(rows) + stored * 4 + (0 if kind is np.ndarray else _bits(stored))
            elif list_width and kind is tuple and len(value) == 2 and type(value[0]) is np.ndarray:
                offsets = value[1]
                if type(offsets) is np.ndarray:
                    size = (offsets.size + 1) * 4 + value[0].size * list_width
                else:
                    size = _column(value, type_, rows)
            elif width and kind is np.ndarray and value.ndim == 1:
                size = value.size * width
            elif type_ is None and kind is np.ndarray and value.ndim == 1 and value.dtype.kind in "biuf":
                size = value.nbytes  # an inferred numeric column aliases the array: what _column counts
            elif width and kind is int:
                size = rows * width + _bits(rows)
            else:
                size = _column(value, type_, rows)
            total += size
            if dictionary:
                dictionaries += size
    return total, dictionaries


# How a column's type is counted: (the type or None: inferred, the width of its values when it is a
# list of fixed-width values, its width when it is fixed-width, whether it is a dictionary).
_PlanT = tuple[pa.DataType | None, int, int, bool]


def _plan(type_: pa.DataType | None) -> _PlanT:
    if type_ is None or type_ == _EMPTY:
        return (None, 0, 0, False)
    if isinstance(type_, pa.BaseExtensionType):
        type_ = type_.storage_type
    if pa.types.is_list(type_) and not pa.types.is_boolean(type_.value_type):
        return (type_, _width(type_.value_type), 0, False)
    if pa.types.is_dictionary(type_):
        return (type_, 0, 0, True)
    return (type_, 0, 0 if pa.types.is_boolean(type_) else _width(type_), False)


def _extra_plan(name: str, schema: Any) -> _PlanT:
    """A user column's plan: its declared type, or inferred."""
    if isinstance(schema, TrajectorySchema) and name in schema:
        return _plan(schema.field(name).type)
    return _INFERRED


_INFERRED: _PlanT = (None, 0, 0, False)


def _digits_below(n: int) -> int:
    """Decimal digits of the numbers ``0 .. n - 1`` written out (the sample indices of default ids)."""
    total, low, width = 0, 0, 1
    while low < n:
        high = min(n, 10**width)
        total += (high - low) * width
        low, width = high, width + 1
    return total


def _level(n: int, offset_width: int = 4) -> int:
    """Bytes of one array level of ``n`` entries besides its values: offsets and a validity bitmap."""
    return _offsets_of(n, offset_width) + _bits(n)


def _offsets_of(n: int, offset_width: int = 4) -> int:
    """Bytes of the offsets of ``n`` entries (a level built from arrays has no validity bitmap)."""
    return (n + 1) * offset_width


def _bits(n: int) -> int:
    """Bytes a validity bitmap of ``n`` entries covers, wherever they start in it."""
    return n // 8 + 2


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "is_nested")


def _numel(value: Any) -> int:
    """Entries of an array or tensor (a nested tensor's values)."""
    if type(value) is np.ndarray:
        return int(value.size)
    if _is_tensor(value) and value.is_nested:
        try:
            return int(value.values().numel())
        except RuntimeError:  # a strided nested tensor has no values buffer
            return sum(int(t.numel()) for t in value.unbind())
    if _is_tensor(value):
        return int(value.numel())
    return int(np.size(value))


def _itemsize(value: Any) -> int:
    if _is_tensor(value):
        return int(value.element_size())
    return int(value.dtype.itemsize) if isinstance(value, np.ndarray) else _NUMBER


def _rows(responses: Any) -> int:
    """Samples of the group, as the encoder counts them from ``response_ids``."""
    if type(responses) is tuple and len(responses) == 2 and type(responses[1]) is np.ndarray:
        return max(0, responses[1].size - 1)
    if isinstance(responses, pa.Array | pa.ChunkedArray):
        return len(responses)
    if isinstance(responses, Ragged | tuple):
        offsets = responses.offsets if isinstance(responses, Ragged) else responses[1]
        return max(0, int(np.size(offsets)) - 1)
    if isinstance(responses, Padded):
        return int(np.size(responses.lengths))
    if isinstance(responses, np.ndarray) or _is_tensor(responses):
        return int(responses.shape[0]) if len(responses.shape) else 0
    try:
        return len(responses)
    except TypeError:
        return 0  # refused by the encoder


def _flat(prompt: Any) -> bool:
    """One prompt for every sample (a 1-D array or a flat list of ints), as the encoder reads it."""
    if type(prompt) is np.ndarray:
        return prompt.ndim == 1
    if isinstance(prompt, np.ndarray) or (_is_tensor(prompt) and not prompt.is_nested):
        return len(prompt.shape) == 1
    return isinstance(prompt, list) and (not prompt or isinstance(prompt[0], int | np.integer))


def _entries(value: Any) -> int:
    return _numel(value) if isinstance(value, np.ndarray) or _is_tensor(value) else len(value)


def _width(type_: pa.DataType | None) -> int:
    """Bytes a value of a fixed-width type takes (a bool: one bit, counted as a byte); 0 for others."""
    if type_ is None:
        return 0
    if isinstance(type_, pa.BaseExtensionType):
        type_ = type_.storage_type
    try:
        bits = int(type_.bit_width)
    except ValueError:
        return 0
    return max(1, bits // 8)


def _is_list(type_: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_)
    )


def _offsets(type_: pa.DataType) -> int:
    """Bytes of one offset of a list or string type (none for a fixed-size list)."""
    if pa.types.is_fixed_size_list(type_):
        return 0
    large = (
        pa.types.is_large_list(type_) or pa.types.is_large_string(type_) or pa.types.is_large_binary(type_)
    )
    return 8 if large else 4


def _column(value: Any, type_: pa.DataType | None, rows: int) -> int:
    """The bound of the column built from ``value`` (``rows`` entries) as ``type_`` (``None``: inferred)."""
    if isinstance(type_, pa.BaseExtensionType):
        type_ = type_.storage_type
    if value is None:
        return 0
    if isinstance(value, pa.Array | pa.ChunkedArray):
        return _arrow(value, type_)
    listed = type_ is None or _is_list(type_)
    if isinstance(value, Ragged) or (listed and isinstance(value, tuple) and len(value) == 2):
        values, offsets = (value.values, value.offsets) if isinstance(value, Ragged) else value
        return _offsets_of(_numel(offsets)) + _flat_values(values, _child(type_))
    if isinstance(value, DoublyRagged):
        inner = _child(_child(type_))
        return (
            _offsets_of(_numel(value.outer_offsets))
            + _offsets_of(_numel(value.inner_offsets))
            + _flat_values(value.values, inner)
        )
    if isinstance(value, Padded):
        return _offsets_of(_numel(value.lengths)) + _flat_values(value.values, _child(type_))
    if _is_tensor(value) and value.is_nested:
        return _offsets_of(int(value.size(0))) + _flat_values(value.values(), _child(type_))
    if isinstance(value, np.ndarray) or _is_tensor(value):
        if isinstance(value, np.ndarray) and value.dtype == object:
            return _python(value.tolist(), type_)
        if isinstance(value, np.ndarray) and value.dtype.kind in "US":
            return _python(value.tolist(), type_ or pa.string())
        if len(value.shape) == 0:
            return _repeated(value.item(), type_, rows)
        if len(value.shape) >= 2 or (type_ is not None and _is_list(type_)):
            return _offsets_of(int(value.shape[0])) + _flat_values(value, _child(type_))
        return _flat_values(value, type_)
    if isinstance(value, Mapping):
        fields = {f.name: f.type for f in type_} if type_ is not None and pa.types.is_struct(type_) else {}
        return _bits(rows) + sum(_column(v, fields.get(k), rows) for k, v in value.items())
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return _python(value, type_)
    return _repeated(value, type_, rows)


def _child(type_: pa.DataType | None) -> pa.DataType | None:
    return type_.value_type if type_ is not None and _is_list(type_) else None


def _flat_values(values: Any, type_: pa.DataType | None) -> int:
    """The bound of the values of an array or tensor, whole, as ``type_`` (``None``: its own dtype).

    Values of another dtype than a declared fixed-width type are converted to it, others aliased."""
    return _numel(values) * (_width(type_) or _itemsize(values))


def _repeated(value: Any, type_: pa.DataType | None, rows: int) -> int:
    """One value for every sample."""
    return _python([value] * rows, type_)


def _arrow(array: pa.Array | pa.ChunkedArray, type_: pa.DataType | None) -> int:
    """A pyarrow input: its buffers as they are, or what joining its chunks or casting it to ``type_``
    builds (the encoder keeps the array itself only when it is one array of the column's type)."""
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    size = sum(int(c.get_total_buffer_size()) for c in chunks)
    if isinstance(array, pa.Array) and (type_ is None or array.type == type_):
        return size
    try:
        whole = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
        built = whole if type_ is None or whole.type == type_ else whole.cast(type_)
    except (pa.ArrowException, ValueError, TypeError):
        return size  # refused by the encoder
    return int(built.get_total_buffer_size())


def _python(values: Sequence[Any], type_: pa.DataType | None) -> int:
    """The bound of one array level built from the Python sequence ``values`` as ``type_``."""
    n = len(values)
    first = next((v for v in values if v is not None), None)
    if type_ is not None and pa.types.is_dictionary(type_):
        return n * _width(type_.index_type) + _bits(n) + _python(values, type_.value_type)
    if (type_ is not None and _is_list(type_)) or (
        type_ is None and (isinstance(first, list | tuple | np.ndarray) or _is_tensor(first))
    ):
        child = _child(type_)
        out = _level(n, 4 if type_ is None else _offsets(type_))
        if child is not None and _width(child) and not pa.types.is_boolean(child):
            count = sum(_entries(v) for v in values if v is not None)  # converted to the child's type
            return out + count * _width(child) + _bits(count)
        flat: list[Any] = []
        for v in values:
            if v is not None:
                flat.extend(v.tolist() if isinstance(v, np.ndarray) or _is_tensor(v) else v)
        return out + _python(flat, child)
    if (type_ is not None and pa.types.is_struct(type_)) or (type_ is None and isinstance(first, Mapping)):
        declared = [f.name for f in type_] if type_ is not None else []
        names = dict.fromkeys([*declared, *(k for v in values if isinstance(v, Mapping) for k in v)])
        types = {f.name: f.type for f in type_} if type_ is not None else {}
        return _bits(n) + sum(
            _python([v.get(k) if isinstance(v, Mapping) else None for v in values], types.get(k))
            for k in names
        )
    if (type_ is not None and _offsets_of_binary(type_)) or (
        type_ is None and isinstance(first, str | bytes)
    ):
        data = sum(
            len(v.encode(errors="replace")) if isinstance(v, str) else len(v) for v in values if v is not None
        )
        return _level(n, 4 if type_ is None else _offsets(type_)) + data
    return n * max(_width(type_), _leaf(first)) + _bits(n)


def _offsets_of_binary(type_: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(type_)
        or pa.types.is_large_string(type_)
        or pa.types.is_binary(type_)
        or pa.types.is_large_binary(type_)
    )


def _leaf(value: Any) -> int:
    """Bytes pyarrow may give one Python scalar of an inferred type."""
    if isinstance(value, np.generic):
        return max(_NUMBER, int(value.nbytes))
    if type(value).__name__ == "Decimal":
        return 32  # decimal256 at most
    return _NUMBER


# The standard columns' plans; other schemas' are made per group.
_STANDARD = {name: _plan(STANDARD_SCHEMA.field(name).type) for name in STANDARD_SCHEMA.names}
