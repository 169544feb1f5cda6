"""The ``telemetry`` column: per-sample engine telemetry -> one Arrow struct array.

Accepted inputs: a list of dicts (one per sample), a dict of per-sample columns (each field's type inferred,
then the struct cast to the declared one) or a pyarrow struct array. The schema's struct type, when declared
(``schema.with_telemetry``), is the column's type; the standard schema's empty struct leaves the fields to
inference.

It does not guarantee zero copy: Python values are converted (new Arrow memory); a pyarrow struct array of
the declared type is returned as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from trajflight.codec._arrays import scalar_array
from trajflight.codec._infer import infer_type
from trajflight.errors import SchemaError

__all__ = ["telemetry_array"]


def telemetry_array(value: Any, declared: pa.DataType, rows: int) -> pa.Array:
    # The standard schema declares an empty struct: the engine's fields are then inferred.
    struct_type = None if declared == pa.struct([]) else declared
    if isinstance(value, Mapping):
        fields = [
            scalar_array(v, infer_type(v, column=f"telemetry.{k}"), column=f"telemetry.{k}", rows=rows)
            for k, v in value.items()
        ]
        array: pa.Array = pa.StructArray.from_arrays(fields, names=list(value))
    elif isinstance(value, pa.Array | pa.ChunkedArray):
        array = value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
    else:
        try:
            array = pa.array(value, type=struct_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            raise SchemaError(
                f"column 'telemetry': {exc}; pass a list of dicts (one per sample), a dict of per-sample "
                "columns or a pyarrow struct array",
                column="telemetry",
            ) from exc
    if not pa.types.is_struct(array.type):
        raise SchemaError(
            f"column 'telemetry' must be a struct (list of dicts or dict of columns), got {array.type}",
            column="telemetry",
        )
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
