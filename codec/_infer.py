"""Type inference for undeclared columns: the Arrow type a user column or telemetry field will get.

:func:`infer_type` reads the kind of input (a pyarrow array, a ragged container, an array or tensor, Python
values) and returns the type the column builders of :mod:`trajflight.codec._arrays` will build it as. It
reads dtypes, not payload: nothing is converted or copied, except that Python sequences (and numpy object
arrays) are converted once by ``pyarrow.array`` to learn their type.

It does not guarantee that building the column with that type succeeds (the builders check the values),
nor that it is the type the user meant: a column whose type matters is declared in the schema.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from trajflight.codec._arrays import as_numpy, is_tensor
from trajflight.codec._containers import DoublyRagged, Padded, Ragged
from trajflight.errors import SchemaError

__all__ = ["infer_type"]


def _cannot_infer(value: Any, column: str, reason: object) -> SchemaError:
    return SchemaError(
        f"column {column!r}: cannot infer an Arrow type from {type(value).__name__} ({reason}); declare "
        f"the column with schema.extend(pa.field({column!r}, <type>)) and pass schema=, or pass a "
        "pyarrow array",
        column=column,
    )


def _dtype_type(array: Any, column: str) -> pa.DataType:
    """The Arrow type of the elements of a numpy array or CPU tensor, as the builders will read them.

    A tensor is read through ``as_numpy`` (so bfloat16 is float32, as the builders convert it); numpy
    object arrays are inferred from their values.
    """
    if is_tensor(array):  # nested tensors too: their dtype is their values'
        array = as_numpy(sys.modules["torch"].empty(0, dtype=array.dtype), column=column)
    elif not isinstance(array, np.ndarray):
        array = as_numpy(array, column=column)
    try:
        if array.dtype == object:
            return pa.array(array.ravel().tolist()).type
        return pa.from_numpy_dtype(array.dtype)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise _cannot_infer(array, column, exc) from exc


def infer_type(value: Any, *, column: str) -> pa.DataType:
    """The Arrow type of an undeclared column's input: ragged containers give lists of their values'
    type, arrays and tensors their dtype, one scalar its own type (it is repeated per sample).

    Raises:
        SchemaError: no type can be inferred; the message says how to declare one.
    """
    if isinstance(value, pa.Array | pa.ChunkedArray):
        return value.type
    if isinstance(value, Ragged | Padded):
        return pa.list_(_dtype_type(value.values, column))
    if isinstance(value, DoublyRagged):
        return pa.list_(pa.list_(_dtype_type(value.values, column)))
    if isinstance(value, tuple) and len(value) == 2:  # (values, offsets), as ragged_array reads it
        return pa.list_(_dtype_type(value[0], column))
    if isinstance(value, np.ndarray) or is_tensor(value):
        if getattr(value, "is_nested", False):
            return pa.list_(_dtype_type(value, column))
        element = _dtype_type(value, column)
        return pa.list_(element) if value.ndim == 2 else element
    if isinstance(value, Mapping):
        raise SchemaError(
            f"column {column!r}: got a dict; pass one value per sample (a list of dicts for a struct "
            "column) or a pyarrow array",
            column=column,
        )
    if isinstance(value, list) and value and any(is_tensor(item) for item in value):
        # Per-sample tensors: ragged_array concatenates them, so their common dtype is the values' type.
        parts = [_dtype_type(item, column) for item in value]
        dtypes = [np.dtype(t.to_pandas_dtype()) for t in parts]
        return pa.list_(pa.from_numpy_dtype(np.result_type(*dtypes)))
    try:
        if isinstance(value, Sequence) and not isinstance(value, str | bytes):
            return pa.array(list(value)).type
        return pa.scalar(value).type  # one value, repeated for every sample
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        raise _cannot_infer(value, column, exc) from exc
