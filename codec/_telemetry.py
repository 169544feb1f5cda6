"""The ``telemetry`` column: per-sample engine telemetry -> one Arrow struct array.

Accepted inputs: a list of dicts (one per sample), a dict of per-sample columns (each field's type inferred,
then the struct cast to the declared one) or a pyarrow struct array. The schema's struct type, when declared
(``schema.with_telemetry``), is the column's type; the standard schema's empty struct leaves the fields to
inference.

Integer fields take integers, under the rule of the integer columns (``policy_version``): a float (Python
or numpy, whole or not), a complex number or a bool (``uint8`` fields included: the loss mask's exception
is the mask's) is refused, not truncated as ``pyarrow.array`` would truncate it (apache/arrow GH-35584),
with a :class:`~trajflight.errors.SchemaError` naming the column ``telemetry``, the field (``error.field``,
dotted for a field of a nested struct) and, for per-sample Python values, the row. That holds for declared
fields of an integer type, lists of one, or structs holding them, given as Python values or numpy arrays
and tensors; and for fields that inference made integer (apache/arrow GH-40910: a numpy float16 among ints
infers int64). A pyarrow struct array is cast to the declared type as any Arrow input is (Arrow's safe
cast: 2.0 becomes 2, 1.5 is refused).

It does not guarantee zero copy: Python values are converted (new Arrow memory); a pyarrow struct array of
the declared type is returned as it is. It does not check integers inside lists of structs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from trajflight.codec._arrays import as_numpy, is_tensor, scalar_array
from trajflight.codec._infer import infer_type
from trajflight.codec._pylists import check_integers, first_bad_row, not_integers
from trajflight.errors import SchemaError

__all__ = ["telemetry_array"]

_EMPTY = pa.struct([])


def telemetry_array(value: Any, declared: pa.DataType, rows: int) -> pa.Array:
    """Build the ``telemetry`` struct column of ``rows`` samples (see the module docstring).

    Raises:
        SchemaError: a float or bool for an integer field (naming the field and row), an input that is not
            a struct, one that does not fit the declared struct, or a length other than ``rows``.
    """
    # The standard schema declares an empty struct: the engine's fields are then inferred.
    struct_type = None if declared == _EMPTY else declared
    samples = None
    if isinstance(value, Mapping):
        if struct_type is not None:
            _check_columns(value, _plan(struct_type))
        fields = [
            scalar_array(v, infer_type(v, column=f"telemetry.{k}"), column=f"telemetry.{k}", rows=rows)
            for k, v in value.items()
        ]
        array: pa.Array = pa.StructArray.from_arrays(fields, names=list(value))
    elif isinstance(value, pa.Array | pa.ChunkedArray):
        array = value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
    else:
        samples = _samples(value)
        if samples is not None and struct_type is not None:
            _check_rows(samples, _plan(struct_type))  # before the conversion, which truncates floats
        try:
            array = pa.array(value if samples is None else samples, type=struct_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            row = None if samples is None else first_bad_row(samples, struct_type)
            where = "column 'telemetry'" if row is None else f"column 'telemetry' row {row}"
            raise SchemaError(
                f"{where}: {exc}; pass a list of dicts (one per sample) whose values fit the fields' types, "
                "a dict of per-sample columns or a pyarrow struct array",
                column="telemetry",
                row=row,
            ) from exc
    if not pa.types.is_struct(array.type):
        raise SchemaError(
            f"column 'telemetry' must be a struct (list of dicts or dict of columns), got {array.type}",
            column="telemetry",
        )
    if struct_type is None and samples is not None:
        _check_rows(samples, _plan(array.type))  # GH-40910: an int64 inferred for floats among ints
    if struct_type is not None and array.type != struct_type:
        try:
            array = array.cast(struct_type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise SchemaError(
                f"column 'telemetry' of type {array.type} does not fit the declared {struct_type}: {exc}",
                column="telemetry",
            ) from exc
    if len(array) != rows:
        raise SchemaError(
            f"column 'telemetry' has {len(array)} entries but the group has {rows} samples",
            column="telemetry",
        )
    return array


def _samples(value: Any) -> list[Any] | tuple[Any, ...] | None:
    """``value`` as a list of samples that can be read twice (by the check, then by the conversion): a
    list or tuple as it is, another iterable (a generator, a numpy array of dicts) listed; None for what
    is no sequence of samples, left to ``pyarrow.array`` to refuse."""
    if type(value) is list or type(value) is tuple:
        return value
    if isinstance(value, str | bytes | Mapping):
        return None
    try:
        return list(value)
    except TypeError:
        return None


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where a struct type holds integers, as the checks read it.

    Attributes:
        scalars: The fields of an integer type, with their types.
        lists: The fields of lists of integers, with their types.
        structs: The plans of the struct fields that hold integers, with their names.
        by_name: The type of each scalar and list field, and the plan of each struct field, by name.
    """

    scalars: tuple[tuple[str, pa.DataType], ...]
    lists: tuple[tuple[str, pa.DataType], ...]
    structs: tuple[tuple[str, _Plan], ...]
    by_name: Mapping[str, pa.DataType | _Plan]

    def __bool__(self) -> bool:
        return bool(self.by_name)


def _plan(struct_type: pa.StructType) -> _Plan:
    """Where ``struct_type`` holds integers (built per call: telemetry is not in the standard workload)."""
    scalars, lists, structs = [], [], []
    for field in struct_type:
        type_ = field.type
        if pa.types.is_struct(type_):
            plan = _plan(type_)
            if plan:
                structs.append((field.name, plan))
        elif pa.types.is_integer(type_):
            scalars.append((field.name, type_))
        elif pa.types.is_integer(_leaf(type_)):
            lists.append((field.name, type_))
    return _Plan(tuple(scalars), tuple(lists), tuple(structs), dict([*scalars, *lists, *structs]))


def _leaf(type_: pa.DataType) -> pa.DataType:
    while pa.types.is_list(type_):
        type_ = type_.value_type
    return type_


def _field_values(rows: Iterable[Any], name: str) -> list[Any]:
    """The field ``name`` of every sample; None where the sample is null or has no such field."""
    return [row.get(name) if isinstance(row, Mapping) else None for row in rows]


def _check_rows(rows: Sequence[Any], plan: _Plan, prefix: str = "") -> None:
    """Refuse a float, complex or bool in an integer field of ``rows``, one mapping per sample: each field
    is checked by :func:`check_integers` (numpy ints and None pass there).

    Raises:
        SchemaError: column ``telemetry``, ``field`` the (dotted) field, ``row`` the sample.
    """
    _check_fields(rows, plan.scalars, prefix)
    _check_fields(rows, plan.lists, prefix)
    for name, sub in plan.structs:
        _check_rows(_field_values(rows, name), sub, f"{prefix}{name}.")


def _check_fields(rows: Sequence[Any], fields: Sequence[tuple[str, pa.DataType]], prefix: str) -> None:
    for name, type_ in fields:
        check_integers(_field_values(rows, name), type_, column="telemetry", field=prefix + name, bools=False)


def _check_columns(columns: Mapping[Any, Any], plan: _Plan) -> None:
    """Refuse a float, complex or bool for an integer field given as a per-sample column (a Python
    sequence, a numpy array or tensor, or one value for every sample); pyarrow arrays are left to the cast.

    Raises:
        SchemaError: column ``telemetry``, ``field`` the field, ``row`` the sample where it is known.
    """
    by_name = plan.by_name
    for name, value in columns.items():
        found = by_name.get(name)
        if isinstance(found, _Plan):
            if isinstance(value, Sequence) and not isinstance(value, str | bytes):
                _check_rows(value, found, f"{name}.")
        elif found is not None:
            _check_column(value, found, name)


def _check_column(value: Any, type_: pa.DataType, field: str) -> None:
    if type(value) is list:  # the common form, first
        check_integers(value, type_, column="telemetry", field=field, bools=False)
        return
    leaf = _leaf(type_)
    if isinstance(value, pa.Array | pa.ChunkedArray):
        return  # Arrow's safe cast decides, as it does for a pyarrow array given for any integer column
    if isinstance(value, np.ndarray) or is_tensor(value):
        array = as_numpy(value, column="telemetry")
        if array.dtype == object or array.ndim == 0:
            value = array.tolist()  # Python values: checked as those are, below
        elif array.dtype.kind not in "iu":
            raise SchemaError(
                f"column 'telemetry' field {field!r}: wrong dtype {array.dtype}, expected integers ({leaf}); "
                "pass an integer array (round as you mean it first: a float is not truncated for you)",
                column="telemetry",
                field=field,
            )
        else:
            return
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        check_integers(value, type_, column="telemetry", field=field, bools=False)
    elif isinstance(value, bool | np.bool_):  # one value for every sample, as policy_version's: no bools
        raise not_integers(bool(value), leaf, column="telemetry", row=None, field=field)
    elif isinstance(value, float | np.floating):
        raise not_integers(float(value), leaf, column="telemetry", row=None, field=field)
    elif isinstance(value, complex | np.complexfloating):
        raise not_integers(complex(value), leaf, column="telemetry", row=None, field=field)
