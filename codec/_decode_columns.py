"""What decoding a set of columns needs to know that the Arrow schema alone fixes, worked out once.

A decode of one small group spends much of its time on fixed per-column work: finding each column,
sorting its type into a kind (primitive, ``list<T>``, ``list<list<T>>``, other) and checking the
requested names. :func:`columns_of` does that once per (schema, requested columns) and keeps the answer for
the few schemas last met; a decode then only reads the columns' buffers.

It does not remember anything about the data (nulls, alignment, offsets): those are read on every decode.
Equality of schemas is ``Schema.equals`` (names, order, types and nullability, not metadata), so an entry
is never reused for a schema whose columns have other types or nullability.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import pyarrow as pa

from trajflight.errors import SchemaError

__all__ = ["DecodeColumn", "DecodeColumns", "Kind", "columns_of"]

# Layouts kept: a trainer meets a handful of (schema, columns) pairs; a bound keeps a stream of
# ever-new schemas from growing memory.
_RECENT = 16


class Kind(Enum):
    """How a column decodes."""

    FLAT = "flat"  # integer, float or bool: one 1-D tensor
    LIST = "list"  # list<T> of a numeric T: values plus offsets
    LIST2 = "list2"  # list<list<T>> of a numeric T: values plus two offset levels
    OTHER = "other"  # anything else: left an Arrow array


@dataclass(frozen=True, slots=True)
class DecodeColumn:
    """One requested column: its name, its index in the schema, its kind and nullability."""

    name: str
    index: int
    kind: Kind
    nullable: bool


@dataclass(frozen=True, slots=True)
class DecodeColumns:
    """The requested columns of one schema, in the order asked for.

    Attributes:
        schema: The Arrow schema these columns were worked out for.
        requested: The ``columns`` argument as a tuple, None for every column.
        columns: One entry per decoded column.
        candidates: Whether ``top_p_ids`` and ``top_p_probs`` both decode as ``list<list<T>>`` (their null
            rows must then agree).
    """

    schema: pa.Schema
    requested: tuple[str, ...] | None
    columns: tuple[DecodeColumn, ...]
    candidates: bool


def _is_numeric(type_: pa.DataType) -> bool:
    return bool(pa.types.is_integer(type_) or pa.types.is_floating(type_))


def _is_list(type_: pa.DataType) -> bool:
    return bool(pa.types.is_list(type_) or pa.types.is_large_list(type_))


def kind_of(type_: pa.DataType) -> Kind:
    """The kind a column of Arrow type ``type_`` decodes as."""
    if _is_numeric(type_) or pa.types.is_boolean(type_):
        return Kind.FLAT
    if _is_list(type_) and _is_numeric(type_.value_type):
        return Kind.LIST
    if _is_list(type_) and _is_list(type_.value_type) and _is_numeric(type_.value_type.value_type):
        return Kind.LIST2
    return Kind.OTHER


def _make(schema: pa.Schema, requested: tuple[str, ...] | None) -> DecodeColumns:
    names = schema.names
    wanted = names if requested is None else requested
    missing = [n for n in wanted if n not in names]  # a list: an unhashable name is missing, not a crash
    if missing:
        raise SchemaError(f"columns {missing} are not in the batch (it has {names})", column=missing[0])
    columns = []
    for name in wanted:
        index = schema.get_field_index(name)
        if index < 0:  # -1 for a name held twice: which column is meant cannot be told
            raise SchemaError(
                f"column {name!r} appears more than once in the batch; give every column its own name",
                column=name,
            )
        field = schema.field(index)
        columns.append(DecodeColumn(name, index, kind_of(field.type), field.nullable))
    kinds = {c.name: c.kind for c in columns}
    candidates = kinds.get("top_p_ids") is Kind.LIST2 and kinds.get("top_p_probs") is Kind.LIST2
    return DecodeColumns(schema, requested, tuple(columns), candidates)


class _Recent:
    """The entries of the few (schema, requested columns) pairs last met, most recent first.

    Decoders run in several threads (a trainer's fetches): a lookup reads one snapshot of the tuple
    without locking; an update replaces the tuple whole, under the lock. Two threads missing together
    both call ``_make`` and keep one answer.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: tuple[DecodeColumns, ...] = ()
        self._lock = threading.Lock()

    def get(self, schema: pa.Schema, requested: tuple[str, ...] | None) -> DecodeColumns:
        entries = self._entries
        for i, entry in enumerate(entries):
            if entry.requested == requested and (entry.schema is schema or entry.schema.equals(schema)):
                if i:
                    self._put(entry)
                return entry
        found = _make(schema, requested)  # raises for a missing column: nothing remembered
        self._put(found)
        return found

    def _put(self, entry: DecodeColumns) -> None:
        with self._lock:
            rest = tuple(e for e in self._entries if e is not entry)
            self._entries = (entry, *rest[: self._size - 1])

    def __len__(self) -> int:
        return len(self._entries)


_recent = _Recent(_RECENT)


def columns_of(schema: pa.Schema, requested: Sequence[str] | None) -> DecodeColumns:
    """The decode plan of the ``requested`` columns (None: all) of ``schema``, remembered for the
    :data:`_RECENT` pairs last met (equal schemas, by ``Schema.equals``, share one).

    Raises:
        SchemaError: a requested column is not in the schema.
    """
    return _recent.get(schema, None if requested is None else tuple(requested))
