"""Per-sample Python lists -> Arrow arrays: one ``pyarrow.array`` conversion, with the checks it skips.

:func:`from_python` turns rows given as Python objects (one value per sample, per-sample lists, or lists of
lists for top-p candidates) into an Arrow array of the column's type. On top of ``pyarrow.array`` it:

* refuses floats for integer leaves rather than truncating them, with :func:`check_integers`: Python floats
  (apache/arrow GH-35584: 1.5 -> 1 even with ``safe=True``) and numpy float16, longdouble and complex
  scalars, which ``pyarrow.array`` truncates even when it infers the type itself, once they are mixed with
  Python ints (apache/arrow GH-40910: ``[np.float16(1.5), 2]`` infers int64 and gives ``[1, 2]``);
* refuses Python and numpy bools for integer leaves, except ``uint8`` (the loss mask), where they become
  0/1 as numpy and torch bools do;
* words every failure as a :class:`~trajflight.errors.SchemaError` naming the column and the first row
  that does not convert.

The check has two tiers, as the array builders do: a cheap proof that every value is a Python int (their
types for one value per sample; for lists, the type of their sum, computed in C), then, where that fails
(numpy scalars, nulls), the set of the values' types; only a set holding something other than integers
and None is searched value by value, for the error. The cheap proof stays because it pays on the standard
workload given as Python lists (BENCHMARKS.md, "The codec"); it never refuses, so it guarantees nothing
the set of types would not. Values proven
integral are converted straight to the column's type, exactly (range-checked by ``pyarrow.array``).

It does not guarantee more than that. ``None`` becomes a null, as a row or as an entry: refusing null
entries where decode cannot take them is the caller's
(:func:`~trajflight.codec._validate.check_null_entries`), as are the number of rows and the per-token
lengths. Nothing is aliased: Python objects have no buffer, so the result always owns new Arrow memory on
the CPU. Numpy arrays and tensors met inside the rows are read as ``pyarrow.array`` reads them (the ragged
builders in :mod:`trajflight.codec._arrays` send whole arrays down their zero-copy paths instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from trajflight.errors import SchemaError

__all__ = ["check_integers", "first_bad_row", "from_python", "not_integers"]

_UINT8_ID = pa.uint8().id
_NONE_TYPE = type(None)


def first_bad_row(rows: Sequence[Any], type_: pa.DataType | None) -> int | None:
    """The first of ``rows`` (one Python object per sample) that does not convert to ``type_`` on its own
    (``None``: the type pyarrow infers), or None: an error path, one conversion per row."""
    for i, row in enumerate(rows):
        try:
            pa.array([row], type=type_)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            return i
    return None


def _bool_twin(type_: pa.DataType) -> pa.DataType | None:
    """``type_`` with its uint8 leaf made bool (``list<uint8>`` -> ``list<bool>``), or None without one."""
    if type_.id == _UINT8_ID:
        return pa.bool_()
    if pa.types.is_list(type_):
        inner = _bool_twin(type_.value_type)
        return None if inner is None else pa.list_(inner)
    return None


def _bools_as_uint8(rows: Sequence[Any], type_: pa.DataType) -> pa.Array | None:
    """Python bools for a uint8 column (a loss mask), as 0/1 (one conversion and one cast), or None.

    ``pyarrow.array`` refuses bools for integer types and integers for bool, so rows that mix them are
    still refused (None), with the error of the uint8 conversion.
    """
    twin = _bool_twin(type_)
    if twin is None:
        return None
    try:
        return pa.array(rows, type=twin).cast(type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return None


def _integer_leaf(type_: pa.DataType) -> tuple[pa.DataType | None, int]:
    """The integer type at the bottom of ``type_``'s lists (``list<list<int32>>`` -> int32, or None where
    it is not an integer type) and the number of list levels above it."""
    depth = 0
    while pa.types.is_list(type_):
        type_ = type_.value_type
        depth += 1
    return (type_ if pa.types.is_integer(type_) else None), depth


def _python_ints(rows: Sequence[Any], depth: int) -> bool:
    """Cheap tier of :func:`check_integers`: whether every value of ``rows`` (``depth`` list levels below
    them; None rows skipped) is proven a Python int, or a bool that the typed conversion then refuses.

    One value per sample: their types. Lists: the type of their sum, computed in C without a Python step
    per value; a float or numpy scalar anywhere makes the sum another type, a None raises. Never refuses:
    False leaves the question to :func:`_integral`.
    """
    if depth == 0:
        return all(type(v) is int for v in rows)
    present = [row for row in rows if row is not None]
    try:
        with np.errstate(all="ignore"):  # numpy scalars summed on the way may overflow; they fail anyway
            if depth == 1:
                total = sum(map(sum, present))
            elif depth == 2:
                total = sum([sum(map(sum, row)) for row in present])
            else:
                return False
    except (TypeError, ValueError, OverflowError):
        return False
    return type(total) is int


def _leaf_types(rows: Sequence[Any], depth: int) -> set[type]:
    """The types of the values ``depth`` list levels below ``rows`` (None rows count as NoneType).

    Raises:
        TypeError: a row that is not iterable where a list is due.
    """
    if depth == 0:
        return set(map(type, rows))
    types: set[type] = set()
    for row in rows:
        if row is None:
            types.add(_NONE_TYPE)
        elif depth == 1:
            types.update(map(type, row))
        else:
            types |= _leaf_types(row, depth - 1)
    return types


def _integral(types: set[type], *, bools: bool) -> bool:
    """Whether values of these types convert to an integer type exactly: Python and numpy integers and
    None (a null); bools, Python or numpy, only where ``bools`` are allowed."""
    for t in types:
        if t is int or t is _NONE_TYPE:
            continue
        if issubclass(t, bool | np.bool_):
            if not bools:
                return False
        elif not issubclass(t, int | np.integer):
            return False
    return True


def _non_integer(obj: Any, *, bools: bool) -> bool | float | complex | None:
    """The first float or complex (or bool, unless ``bools`` are allowed) in ``obj``, a value or nested
    row, or None."""
    if isinstance(obj, bool | np.bool_):
        return None if bools else bool(obj)
    if isinstance(obj, float | np.floating):
        return float(obj)
    if isinstance(obj, complex | np.complexfloating):
        return complex(obj)
    if isinstance(obj, np.ndarray):
        return _non_integer(obj.ravel()[0], bools=bools) if obj.size and obj.dtype.kind in "bfc" else None
    if isinstance(obj, Sequence) and not isinstance(obj, str | bytes):
        for item in obj:
            found = _non_integer(item, bools=bools)
            if found is not None:
                return found
    return None


def not_integers(
    value: bool | float | complex,
    leaf: pa.DataType,
    *,
    column: str,
    row: int | None,
    field: str | None = None,
) -> SchemaError:
    """The error for ``value``, a float, complex or bool met where the integer type ``leaf`` is due
    (returned, for the caller to raise); it names the column and, when given, the struct field and the
    row (``field`` is then an attribute of the error too)."""
    where = f"column {column!r}"
    if field is not None:
        where += f" field {field!r}"
    if row is not None:
        where += f" row {row}"
    kind = "bool" if isinstance(value, bool) else type(value).__name__
    fields = {} if field is None else {"field": field}
    return SchemaError(
        f"{where}: expected integers ({leaf}), got {kind} {value!r}; pass ints (int(x) where x is meant to "
        "be whole: a float is neither rounded nor truncated for you)",
        column=column,
        row=row,
        **fields,
    )


def _refuse_non_integers(
    rows: Sequence[Any],
    type_: pa.DataType,
    *,
    column: str,
    field: str | None = None,
    bools: bool | None = None,
) -> None:
    """Precise tier of :func:`check_integers`, searched value by value: raise on the first row holding a
    float, complex or bool (see there for ``bools``); no-op unless ``type_`` has an integer leaf."""
    leaf, _ = _integer_leaf(type_)
    if leaf is None:
        return
    allowed = leaf.id == _UINT8_ID if bools is None else bools
    for row, item in enumerate(rows):
        value = _non_integer(item, bools=allowed)
        if value is not None:
            raise not_integers(value, leaf, column=column, row=row, field=field)


def check_integers(
    rows: Sequence[Any],
    type_: pa.DataType,
    *,
    column: str,
    field: str | None = None,
    bools: bool | None = None,
) -> None:
    """Refuse floats (Python or numpy, whole or not), complex numbers and bools among ``rows``, one Python
    object per sample, given for ``type_``; no-op unless ``type_`` is an integer type or lists of one.

    What passes converts exactly with ``pyarrow.array(rows, type=type_)``, or fails there for another
    reason (strings, values out of range) or, by default, for Python bools in lists: the cheap tier sums
    lists, which lets bools through, as that conversion refuses them (:func:`from_python` words it).

    Args:
        bools: Whether bools are taken (as 0/1). Default: for a uint8 leaf only (the loss mask), and Python
            bools in lists left to the conversion. ``False`` refuses every bool here (lists are then read
            by their values' types, one Python step per value, not summed): for callers that convert
            otherwise than with ``pyarrow.array(rows, type=type_)``.

    Raises:
        SchemaError: naming the column, the field (``field``, for a struct's field) and the first row that
            holds such a value.
    """
    leaf, depth = _integer_leaf(type_)
    if leaf is None or ((bools is not False or depth == 0) and _python_ints(rows, depth)):
        return
    try:
        if _integral(_leaf_types(rows, depth), bools=leaf.id == _UINT8_ID if bools is None else bools):
            return
    except TypeError:
        pass  # a row that is not a list: the search words a float in it, the conversion anything else
    _refuse_non_integers(rows, type_, column=column, field=field, bools=bools)


def from_python(rows: Sequence[Any], type_: pa.DataType, *, column: str) -> pa.Array:
    """Convert ``rows``, one Python object per sample, to an array of ``type_`` (see the module docstring).

    The result owns new CPU memory (nothing aliases the input); ``None`` rows and entries become nulls.

    Raises:
        SchemaError: a float (or a bool, except for uint8 leaves) where integers are due, or a row that
            ``pyarrow.array`` cannot convert; naming the column and the first such row.
    """
    check_integers(rows, type_, column=column)
    try:
        return pa.array(rows, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        as_uint8 = _bools_as_uint8(rows, type_)
        if as_uint8 is not None:
            return as_uint8
        _refuse_non_integers(rows, type_, column=column)  # Python bools in lists pass the cheap proof
        row = first_bad_row(rows, type_)
        raise SchemaError(
            f"column {column!r} row {row}: cannot convert to {type_}: {exc}", column=column, row=row
        ) from exc
