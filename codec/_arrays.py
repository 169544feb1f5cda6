"""Input normalisation: what rollout code holds -> Arrow arrays of the schema's types.

Accepted inputs for a ragged (``list<T>``) column, checked in this order:

* a ``pyarrow`` list array (or chunked array), cast to the column's type if it differs;
* :class:`~trajflight.codec.Ragged` or a ``tuple`` ``(values, offsets)`` of arrays/tensors;
* :class:`~trajflight.codec.Padded` (``[rows, max_len]`` plus ``lengths``);
* a torch nested tensor (jagged layout: its values and offsets are used as they are);
* a 2-D numpy array or torch tensor: every row has the full width;
* a ``list`` of per-sample numpy arrays or torch tensors (concatenated: one copy, Arrow needs the
  values contiguous);
* a ``list`` of per-sample Python sequences (one ``pyarrow.array`` conversion; Python bools are
  accepted for ``uint8`` columns such as the loss mask, as numpy and torch bools are). For integer
  columns the values are first proven integers (cheaply, in C), so that
  a float, numpy float16 included, is refused rather than truncated (:mod:`trajflight.codec._pylists`).

Standard numeric ragged columns built from Python lists or pyarrow arrays are refused where a row holds a
null entry (decode could not decode them); null rows are left to the schema, user columns keep theirs.

A ``tuple`` is always read as ``(values, offsets)`` and a ``list`` always as per-sample rows.

Zero-copy contract: contiguous numpy arrays and CPU tensors of the column's exact dtype become Arrow
arrays that alias their memory (the Arrow array keeps the source alive). A dtype conversion, packing a
padded array or concatenating per-sample arrays costs one copy of the payload. Offsets are converted
to int32 (a copy of ``rows + 1`` integers, not of payload). CUDA tensors must have been staged to host
memory first (:mod:`trajflight.codec._device`).

Each builder has two tiers, as :mod:`trajflight.codec._validate` does: a cheap one (``_fast_*``) that
wraps known-good numpy memory with ``pa.Array.from_buffers`` and lets Arrow's own offset validation
accept it, and the precise one (numpy checks, ``pyarrow.array``), run whenever the cheap one is not sure.
The cheap tier never refuses: it returns None and the precise tier builds the same array or words the
error, so results and errors are those of the precise tier alone. It does not guarantee that it applies
(another dtype, strided or int64 offsets past int32, zero rows: the precise tier builds them); it stays
because it pays on the standard workload (BENCHMARKS.md, "The codec").
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from trajflight.codec._containers import DoublyRagged, Padded, Ragged
from trajflight.codec._pylists import from_python, not_integers
from trajflight.codec._validate import check_null_entries
from trajflight.errors import SchemaError

__all__ = [
    "as_numpy",
    "doubly_ragged_array",
    "is_tensor",
    "ragged_array",
    "repeated_row",
    "scalar_array",
]

_INT32_MIN, _INT32_MAX = np.iinfo(np.int32).min, np.iinfo(np.int32).max


def is_tensor(obj: object) -> bool:
    """Whether ``obj`` is a torch tensor (without importing torch when it is not loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def as_numpy(obj: Any, *, column: str) -> np.ndarray:
    """View ``obj`` (numpy array, CPU tensor, sequence) as a numpy array, without copying arrays.

    Raises:
        SchemaError: ``obj`` is a tensor on a non-CPU device (stage it first) or cannot be an array.
    """
    if isinstance(obj, np.ndarray):
        return obj
    if is_tensor(obj):
        tensor = obj.detach()
        if tensor.device.type != "cpu":
            raise SchemaError(
                f"column {column!r}: tensor on {tensor.device} reached the host path; pass it to "
                "encode_group, which stages device tensors through one pinned buffer",
                column=column,
            )
        if tensor.dtype == sys.modules["torch"].bfloat16:
            tensor = tensor.float()  # numpy has no bfloat16: one conversion, as for any dtype change
        array: np.ndarray = tensor.resolve_conj().resolve_neg().numpy()
        return array
    try:
        return np.asarray(obj)
    except (TypeError, ValueError) as exc:
        raise SchemaError(
            f"column {column!r}: cannot read {type(obj).__name__} as an array: {exc}", column=column
        ) from exc


def _row_of_value(offsets: np.ndarray | None, index: int) -> int | None:
    if offsets is None:
        return index
    return int(np.searchsorted(offsets, index, side="right") - 1)


def _convert_values(
    values: np.ndarray, target: pa.DataType, *, column: str, offsets: np.ndarray | None = None
) -> np.ndarray:
    """Check ``values``' dtype against the Arrow ``target`` and convert it (a copy) only if needed.

    Rules: integer targets take integers (range-checked); float targets take floats or integers;
    ``uint8`` takes booleans (viewed, no copy) or integers in 0..255. Anything else is a wrong dtype.
    """
    values = np.ravel(values) if values.ndim != 1 else values
    kind = values.dtype.kind
    want = np.dtype(target.to_pandas_dtype())
    if values.dtype == want:
        return np.ascontiguousarray(values)
    if want == np.uint8 and kind == "b":
        return np.ascontiguousarray(values).view(np.uint8)
    if want.kind in "iu":
        if kind not in "iu":
            raise SchemaError(
                f"column {column!r}: wrong dtype {values.dtype}, expected integers ({target}); "
                "token ids and masks must be integer arrays",
                column=column,
            )
        info = np.iinfo(want)
        if values.size and (values.min() < info.min or values.max() > info.max):
            bad = int(np.argmax((values < info.min) | (values > info.max)))
            row = _row_of_value(offsets, bad)
            raise SchemaError(
                f"column {column!r} row {row}: value {values[bad]} does not fit {target} "
                f"(range {info.min}..{info.max})",
                column=column,
                row=row,
            )
        return values.astype(want)
    if want.kind == "f" and kind in "fiu":
        return values.astype(want)
    raise SchemaError(f"column {column!r}: wrong dtype {values.dtype}, expected {target}", column=column)


def _offsets_int32(offsets: np.ndarray, num_values: int, *, column: str) -> np.ndarray:
    if offsets.ndim != 1 or offsets.size == 0 or offsets.dtype.kind not in "iu":
        raise SchemaError(
            f"column {column!r}: offsets must be a non-empty 1-D integer array (rows + 1 entries), got "
            f"shape {offsets.shape} dtype {offsets.dtype}",
            column=column,
        )
    steps = np.diff(offsets)
    if steps.size and steps.min() < 0:
        row = int(np.argmax(steps < 0))
        raise SchemaError(f"column {column!r} row {row}: offsets decrease", column=column, row=row)
    if offsets[0] < 0 or offsets[-1] > num_values:
        raise SchemaError(
            f"column {column!r}: offsets span {offsets[0]}..{offsets[-1]} but there are {num_values} values",
            column=column,
        )
    if offsets[-1] > _INT32_MAX:
        raise SchemaError(f"column {column!r}: more than 2**31 - 1 values in one group", column=column)
    return offsets if offsets.dtype == np.int32 else offsets.astype(np.int32)


def _list_from_values(
    values: np.ndarray, offsets: np.ndarray, value_type: pa.DataType, *, column: str
) -> pa.ListArray:
    offsets = as_numpy(offsets, column=column)
    fast = _fast_ragged(values, offsets, value_type)
    if fast is not None:
        return fast
    if values.ndim == 0:
        raise SchemaError(
            f"column {column!r}: the values of (values, offsets) must be a 1-D array of every row's "
            f"entries, got {values.dtype} scalar {values!r}",
            column=column,
        )
    offsets = _offsets_int32(offsets, len(values), column=column)
    converted = _convert_values(values, value_type, column=column, offsets=offsets)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(converted, type=value_type))


# --- The cheap tier ------------------------------------------------------------------------------------
#
# Each _fast_* function returns what its precise counterpart would build, or None where it is not sure;
# it never raises a SchemaError of its own. Arrow's validation stands in for the numpy offset checks:
# for one row or more, from_buffers refuses a negative first offset and a first or last one past the
# values, validate(full=True) offsets that decrease: with int32 offsets, exactly what _offsets_int32
# accepts.

# Arrow types that numpy holds in the same layout (fixed width, native byte order): pyarrow.array wraps
# such numpy arrays without a copy, as from_buffers does. Not bool (Arrow packs bits) nor temporal types.
_FAST_DTYPES: dict[int, np.dtype] = {
    t.id: np.dtype(t.to_pandas_dtype())
    for t in (
        pa.int8(),
        pa.int16(),
        pa.int32(),
        pa.int64(),
        pa.uint8(),
        pa.uint16(),
        pa.uint32(),
        pa.uint64(),
        pa.float32(),
        pa.float64(),
    )
}
_INT64_ID = pa.int64().id
_OFFSET_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))  # native order; int64 is narrowed when it fits
_NULL_LIST = pa.list_(pa.null())
# list<T> of the types above, by T's id: built once, not per column.
_LIST_TYPES: dict[int, pa.ListType] = {
    t.id: pa.list_(t) for t in (pa.from_numpy_dtype(d) for d in _FAST_DTYPES.values())
}


def _fast_numpy(values: np.ndarray, value_type: pa.DataType) -> np.ndarray | None:
    """Cheap tier of :func:`_convert_values` for 1-D arrays: the same result, or None where it would raise.

    The result is ``values`` itself when it is contiguous and of the exact dtype (so Arrow aliases it),
    otherwise :func:`_convert_values`' one copy.
    """
    dtype = _FAST_DTYPES.get(value_type.id)
    if dtype is None or values.ndim != 1:
        return None
    if values.dtype == dtype and values.flags.c_contiguous:
        return values  # what _convert_values returns for it, for a third of the cost
    try:
        return _convert_values(values, value_type, column="")
    except SchemaError:
        return None  # the precise tier words it, after the checks that come first there


def _fast_values(values: np.ndarray, value_type: pa.DataType) -> pa.Array | None:
    """Cheap tier of ``pa.array(_convert_values(values, value_type), type=value_type)`` (aliasing alike)."""
    converted = _fast_numpy(values, value_type)
    if converted is None:
        return None
    buffers = [None, pa.py_buffer(converted)]
    return pa.Array.from_buffers(value_type, len(converted), buffers, null_count=0)


def _fast_list(child: pa.Array, offsets: np.ndarray, list_type: pa.DataType) -> pa.ListArray | None:
    """Cheap tier of ``pa.ListArray.from_arrays(pa.array(_offsets_int32(offsets, len(child))), child)``.

    Zero rows are left to the precise tier: Arrow does not bound the one offset of an empty list array.
    """
    if offsets.ndim != 1 or offsets.size < 2 or not offsets.flags.c_contiguous:
        return None
    if offsets.dtype not in _OFFSET_DTYPES:
        return None
    if offsets.dtype != np.int32:
        narrow = offsets.astype(np.int32)
        if not np.array_equal(narrow, offsets):
            return None  # past int32: the precise tier names the problem
        offsets = narrow
    rows, buffers = offsets.size - 1, [None, pa.py_buffer(offsets)]
    try:
        array = pa.Array.from_buffers(list_type, rows, buffers, null_count=0, children=[child])
        # Full validation recurses into the child: a nested child (already validated when it was built,
        # its offsets one per token) is stood in for by nulls of its length, so only these offsets are read.
        probe = array if not child.type.num_fields else _null_list(rows, buffers, len(child))
        probe.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return array


def _null_list(rows: int, buffers: list[pa.Buffer | None], length: int) -> pa.ListArray:
    return pa.Array.from_buffers(_NULL_LIST, rows, buffers, null_count=0, children=[pa.nulls(length)])


def _fast_ragged(values: np.ndarray, offsets: np.ndarray, value_type: pa.DataType) -> pa.ListArray | None:
    """Cheap tier of :func:`_list_from_values` (after its ``as_numpy``)."""
    list_type = _LIST_TYPES.get(value_type.id)
    if list_type is None or offsets.dtype not in _OFFSET_DTYPES or not offsets.flags.c_contiguous:
        return None  # checked before any conversion of the values is paid for
    child = _fast_values(values, value_type)
    return None if child is None else _fast_list(child, offsets, list_type)


def _fast_int64(value: int, rows: int) -> pa.Array | None:
    """Cheap tier of :func:`scalar_array` for a Python int in an int64 column (``policy_version``)."""
    values = np.empty(rows, dtype=np.int64)
    try:
        values.fill(value)
    except OverflowError:
        return None
    return pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(values)], null_count=0)


def _pack_padded(padded: Padded[Any], value_type: pa.DataType, *, column: str) -> pa.ListArray:
    values = as_numpy(padded.values, column=column)
    lengths = as_numpy(padded.lengths, column=column)
    if values.ndim != 2 or lengths.ndim != 1 or len(lengths) != len(values):
        raise SchemaError(
            f"column {column!r}: Padded needs values [rows, max_len] and lengths [rows], got "
            f"{values.shape} and {lengths.shape}",
            column=column,
        )
    if lengths.size and (lengths.min() < 0 or lengths.max() > values.shape[1]):
        row = int(np.argmax((lengths < 0) | (lengths > values.shape[1])))
        raise SchemaError(
            f"column {column!r} row {row}: length {lengths[row]} outside 0..{values.shape[1]}",
            column=column,
            row=row,
        )
    mask = np.arange(values.shape[1]) < lengths[:, None]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return _list_from_values(values[mask], offsets, value_type, column=column)


def _from_arrow(obj: pa.Array | pa.ChunkedArray, type_: pa.DataType, *, column: str) -> pa.Array:
    array = obj.combine_chunks() if isinstance(obj, pa.ChunkedArray) else obj
    if array.type == type_:
        return array
    try:
        return array.cast(type_)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise SchemaError(
            f"column {column!r}: Arrow array of type {array.type} cannot become {type_}: {exc}", column=column
        ) from exc


def _no_null_entries(array: pa.Array, *, column: str, allowed: bool) -> pa.Array:
    """``array``, a ``list<T>`` or ``list<list<T>>`` built from Python or Arrow input, when null entries are
    ``allowed`` (a user column) or no row holds one where T is numeric: the rule validate_group applies to
    the standard ragged columns (:func:`~trajflight.codec._validate.check_null_entries`).

    Raises:
        SchemaError: naming the column, the row and the entry (or token and candidate).
    """
    if not allowed:
        check_null_entries(array, column=column)
    return array


def ragged_array(
    obj: Any, value_type: pa.DataType, *, column: str, null_entries: bool = False
) -> pa.ListArray:
    """Build a ``list<value_type>`` array from any ragged input listed in the module docstring.

    ``null_entries`` keeps nulls inside rows of a numeric column (a user column: the schema has every user
    column round-trip, nulls included); otherwise they are refused, as decode would refuse them.

    Raises:
        SchemaError: wrong dtype, values out of range, malformed offsets or lengths, a null entry; naming
            the row.
    """
    list_type = pa.list_(value_type)
    if isinstance(obj, pa.Array | pa.ChunkedArray):
        return _no_null_entries(
            _from_arrow(obj, list_type, column=column), column=column, allowed=null_entries
        )
    if isinstance(obj, Ragged):
        return _list_from_values(as_numpy(obj.values, column=column), obj.offsets, value_type, column=column)
    if isinstance(obj, tuple):
        if len(obj) != 2:
            raise SchemaError(
                f"column {column!r}: a tuple is read as (values, offsets) but has {len(obj)} items; pass "
                "per-sample rows as a list",
                column=column,
            )
        return _list_from_values(as_numpy(obj[0], column=column), obj[1], value_type, column=column)
    if isinstance(obj, Padded):
        return _pack_padded(obj, value_type, column=column)
    if is_tensor(obj) and obj.is_nested:
        if obj.layout == sys.modules["torch"].jagged:
            values = as_numpy(obj.values(), column=column)
            return _list_from_values(values, obj.offsets(), value_type, column=column)
        obj = list(obj.unbind())  # strided nested tensor: no shared values buffer to alias
    if isinstance(obj, np.ndarray) or is_tensor(obj):
        array = as_numpy(obj, column=column)
        if array.ndim != 2:
            raise SchemaError(
                f"column {column!r}: an array input must be 2-D [rows, length] (got {array.ndim}-D); pass "
                "ragged rows as a list, a Ragged, a Padded or a nested tensor",
                column=column,
            )
        rows, width = array.shape
        offsets = np.arange(rows + 1, dtype=np.int64) * width
        return _list_from_values(array.reshape(-1), offsets, value_type, column=column)
    if not isinstance(obj, Sequence) or isinstance(obj, str | bytes):
        raise SchemaError(
            f"column {column!r}: cannot read {type(obj).__name__} as ragged rows; see "
            "trajflight.codec.encode_group for accepted inputs",
            column=column,
        )
    if obj and all(isinstance(row, np.ndarray) or is_tensor(row) for row in obj):
        parts = [as_numpy(row, column=column) for row in obj]
        for i, part in enumerate(parts):
            if part.ndim != 1:
                raise SchemaError(
                    f"column {column!r} row {i}: expected a 1-D array, got shape {part.shape}",
                    column=column,
                    row=i,
                )
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        values = np.concatenate(parts) if parts else np.empty(0, dtype=value_type.to_pandas_dtype())
        return _list_from_values(values, offsets, value_type, column=column)
    return _no_null_entries(from_python(obj, list_type, column=column), column=column, allowed=null_entries)


def repeated_row(obj: Any, value_type: pa.DataType, rows: int, *, column: str) -> pa.ListArray:
    """Build a ``list<value_type>`` array of ``rows`` rows that all hold the one row ``obj``.

    ``obj`` is one row as a 1-D array, tensor or list; its values are stored once per row (one copy each),
    as the row-per-sample layout needs.

    Raises:
        SchemaError: wrong dtype or values out of range, as for one row of :func:`ragged_array`.
    """
    fast = _fast_repeated_row(obj, value_type, rows, column=column)
    if fast is not None:
        return fast
    single = ragged_array([obj], value_type, column=column)
    return pa.concat_arrays([single] * rows) if rows else single.slice(0, 0)


def _fast_repeated_row(obj: Any, value_type: pa.DataType, rows: int, *, column: str) -> pa.ListArray | None:
    """Cheap tier of :func:`repeated_row` for a numpy array or CPU tensor (the values tiled by numpy).

    A tensor is read with ``as_numpy``, the precise tier's first step too: what that raises, it raises.
    """
    if is_tensor(obj) and not obj.is_nested:
        obj = as_numpy(obj, column=column)
    list_type = _LIST_TYPES.get(value_type.id)
    if rows == 0 or list_type is None or type(obj) is not np.ndarray:
        return None
    values = _fast_numpy(obj, value_type)
    if values is None or rows * len(values) > _INT32_MAX:
        return None
    tiled = np.empty((rows, len(values)), dtype=values.dtype)
    tiled[:] = values
    offsets = np.arange(rows + 1, dtype=np.int32) * np.int32(len(values))
    child = pa.Array.from_buffers(value_type, tiled.size, [None, pa.py_buffer(tiled)], null_count=0)
    buffers = [None, pa.py_buffer(offsets)]
    return pa.Array.from_buffers(list_type, rows, buffers, null_count=0, children=[child])


def doubly_ragged_array(
    obj: Any, value_type: pa.DataType, *, column: str, null_entries: bool = False
) -> pa.ListArray:
    """Build a ``list<list<value_type>>`` array (per sample, per token, candidates).

    Accepts a pyarrow array, :class:`~trajflight.codec.DoublyRagged` (zero-copy from contiguous
    values of the right dtype) or per-sample nested Python lists (``None`` for a sample without
    candidates). A null token or candidate is refused unless ``null_entries``, as in :func:`ragged_array`.

    Raises:
        SchemaError: wrong dtype, values out of range, malformed offsets or a null token or candidate.
    """
    list_type = pa.list_(pa.list_(value_type))
    if isinstance(obj, pa.Array | pa.ChunkedArray):
        return _no_null_entries(
            _from_arrow(obj, list_type, column=column), column=column, allowed=null_entries
        )
    if isinstance(obj, DoublyRagged):
        inner = _list_from_values(
            as_numpy(obj.values, column=column), obj.inner_offsets, value_type, column=column
        )
        outer = as_numpy(obj.outer_offsets, column=column)
        fast = _fast_list(inner, outer, list_type)
        if fast is not None:
            return fast
        outer = _offsets_int32(outer, len(inner), column=column)
        return pa.ListArray.from_arrays(pa.array(outer), inner)
    if isinstance(obj, Sequence) and not isinstance(obj, str | bytes):
        return _no_null_entries(
            from_python(obj, list_type, column=column), column=column, allowed=null_entries
        )
    raise SchemaError(
        f"column {column!r}: cannot read {type(obj).__name__} as doubly ragged rows; pass nested lists, a "
        "DoublyRagged or a pyarrow list<list<...>> array",
        column=column,
    )


def scalar_array(obj: Any, type_: pa.DataType, *, column: str, rows: int) -> pa.Array:
    """Build a per-sample column of ``type_`` with ``rows`` entries.

    A Python scalar is repeated for every sample; numpy arrays and CPU tensors of the exact dtype are
    aliased, other numeric dtypes converted (one copy) under the rules of integer/float targets; Python
    sequences are converted once (``None`` becomes null); pyarrow arrays are cast if needed. Integer
    columns take integers only: a float or bool, scalar or in a sequence, is refused as an array of
    another dtype is.

    Raises:
        SchemaError: wrong dtype (a float for an integer column too), out-of-range value or a length other
            than ``rows``.
    """
    if type(obj) is int and type_.id == _INT64_ID:  # a Python int takes the last branch below
        fast = _fast_int64(obj, rows)
        if fast is not None:
            return fast
    if isinstance(obj, pa.Array | pa.ChunkedArray):
        array = _from_arrow(obj, type_, column=column)
    elif isinstance(obj, np.ndarray) or is_tensor(obj):
        values = as_numpy(obj, column=column)
        if values.ndim == 0:
            return scalar_array(values.item(), type_, column=column, rows=rows)
        if values.ndim != 1:
            raise SchemaError(
                f"column {column!r}: expected one value per sample (1-D), got shape {values.shape}",
                column=column,
            )
        fast = _fast_values(values, type_) if len(values) == rows else None
        if fast is not None:
            return fast
        if pa.types.is_primitive(type_) and not pa.types.is_boolean(type_):
            array = pa.array(_convert_values(values, type_, column=column), type=type_)
        else:
            array = from_python(values.tolist(), type_, column=column)
    elif isinstance(obj, Sequence) and not isinstance(obj, str | bytes):
        array = from_python(obj, type_, column=column)
    else:
        if pa.types.is_integer(type_) and isinstance(obj, bool | np.bool_ | float | np.floating):
            # pa.scalar truncates floats (1.5 -> 1) and takes numpy bools; arrays of either are refused.
            value = bool(obj) if isinstance(obj, bool | np.bool_) else float(obj)
            raise not_integers(value, type_, column=column, row=None)
        try:
            scalar = pa.scalar(obj, type=type_)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise SchemaError(
                f"column {column!r}: cannot convert {obj!r} to {type_}: {exc}", column=column
            ) from exc
        return pa.repeat(scalar, rows)
    if len(array) != rows:
        raise SchemaError(
            f"column {column!r} has {len(array)} entries but the group has {rows} samples", column=column
        )
    return array
