"""Per-sample Python lists -> Arrow arrays: one ``pyarrow.array`` conversion, with the checks it skips.

:func:`from_python` turns rows given as Python objects (one value per sample, per-sample lists, or lists of
lists for top-p candidates) into an Arrow array of the column's type. On top of ``pyarrow.array`` it:

* refuses Python floats for integer leaves rather than truncating them (apache/arrow GH-35584: 1.5 -> 1
  even with ``safe=True``), by inferring the values' own type first and casting (about a third more than
  one conversion);
* refuses Python and numpy bools for integer leaves, except ``uint8`` (the loss mask), where they become
  0/1 as numpy and torch bools do;
* words every failure as a :class:`~trajflight.errors.SchemaError` naming the column and the first row
  that does not convert.

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

__all__ = ["from_python", "not_integers"]

_UINT8_ID = pa.uint8().id


def _first_bad_row(rows: Sequence[Any], type_: pa.DataType) -> int | None:
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


def _integer_leaf(type_: pa.DataType) -> pa.DataType | None:
    """The integer type at the bottom of ``type_``'s lists (``list<list<int32>>`` -> int32), or None."""
    while pa.types.is_list(type_):
        type_ = type_.value_type
    return type_ if pa.types.is_integer(type_) else None


def _non_integer(obj: Any, *, bools: bool) -> bool | float | None:
    """The first float (or bool, unless ``bools`` are allowed) in ``obj``, a value or nested row, or None."""
    if isinstance(obj, bool | np.bool_):
        return None if bools else bool(obj)
    if isinstance(obj, float | np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return _non_integer(obj.ravel()[0], bools=bools) if obj.size and obj.dtype.kind in "bf" else None
    if isinstance(obj, Sequence) and not isinstance(obj, str | bytes):
        for item in obj:
            found = _non_integer(item, bools=bools)
            if found is not None:
                return found
    return None


def not_integers(value: bool | float, leaf: pa.DataType, *, column: str, row: int | None) -> SchemaError:
    """The error for ``value``, a float or bool met where the integer type ``leaf`` is due (returned, for
    the caller to raise); it names the column and, when given, the row."""
    where = f"column {column!r}" if row is None else f"column {column!r} row {row}"
    kind = "bool" if isinstance(value, bool) else "float"
    return SchemaError(
        f"{where}: expected integers ({leaf}), got {kind} {value!r}; pass ints (int(x) where x is meant to "
        "be whole: a float is neither rounded nor truncated for you)",
        column=column,
        row=row,
    )


def _integers_from_python(
    rows: Sequence[Any], type_: pa.DataType, leaf: pa.DataType, *, column: str
) -> pa.Array | None:
    """``rows`` for a column of integer leaves: refused when they hold floats (or bools, except for
    uint8), else the array when Arrow's inference and a safe cast build it; None leaves the conversion
    (and its error) to ``pyarrow.array``.

    apache/arrow GH-35584: ``pyarrow.array`` truncates Python floats to an integer type (1.5 -> 1) even
    with ``safe=True``; inferring the values' own type first costs about what the typed conversion does.
    """
    if leaf is type_ and all(type(v) is int for v in rows):  # one value per sample, all ints: no float
        return None
    try:
        inferred = pa.array(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return None  # mixed kinds (bools and ints): the typed conversion words the error
    found = _integer_leaf(inferred.type)
    if found is not None:
        try:
            return inferred.cast(type_)  # safe: a value out of the leaf's range raises
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
    bottom = inferred.type
    while pa.types.is_list(bottom):
        bottom = bottom.value_type
    bools = leaf.id == _UINT8_ID  # the loss mask takes Python bools, as it takes numpy and torch ones
    if pa.types.is_floating(bottom) or (pa.types.is_boolean(bottom) and not bools):
        for row, item in enumerate(rows):
            value = _non_integer(item, bools=bools)
            if value is not None:
                raise not_integers(value, leaf, column=column, row=row)
    return None


def from_python(rows: Sequence[Any], type_: pa.DataType, *, column: str) -> pa.Array:
    """Convert ``rows``, one Python object per sample, to an array of ``type_`` (see the module docstring).

    The result owns new CPU memory (nothing aliases the input); ``None`` rows and entries become nulls.

    Raises:
        SchemaError: a float (or a bool, except for uint8 leaves) where integers are due, or a row that
            ``pyarrow.array`` cannot convert; naming the column and the first such row.
    """
    leaf = _integer_leaf(type_)
    if leaf is not None:
        array = _integers_from_python(rows, type_, leaf, column=column)
        if array is not None:
            return array
    try:
        return pa.array(rows, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        as_uint8 = _bools_as_uint8(rows, type_)
        if as_uint8 is not None:
            return as_uint8
        row = _first_bad_row(rows, type_)
        raise SchemaError(
            f"column {column!r} row {row}: cannot convert to {type_}: {exc}", column=column, row=row
        ) from exc
