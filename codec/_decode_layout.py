"""What decoding a set of columns needs to know that the Arrow schema alone fixes, worked out once.

A decode of one small group spends most of its time on fixed per-column work: finding each column,
sorting its type into a kind (primitive, ``list<T>``, ``list<list<T>>``, other) and checking the
requested names. :func:`layout_of` does that once per (schema, requested columns) and keeps the answer for
the few schemas last met; a decode then only reads the columns' buffers.

It does not remember anything about the data (nulls, alignment, offsets): those are read on every decode.
Equality of schemas is ``Schema.equals`` (names, order, types and nullability, not metadata), so a layout
is never reused for a schema whose columns have other types or nullability.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import pyarrow as pa

from trajflight.errors import SchemaError

__all__ = ["ColumnLayout", "DecodeLayout", "Kind", "layout_of"]

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
class ColumnLayout:
    """One requested column: its name, its index in the schema, its kind and nullability."""

    name: str
    index: int
    kind: Kind
    nullable: bool


@dataclass(frozen=True, slots=True)
class DecodeLayout:
    """The requested columns of one schema, in the order asked for.

    Attributes:
        schema: The Arrow schema this layout was worked out for.
        requested: The ``columns`` argument as a tuple, None for every column.
        columns: One entry per decoded column.
        candidates: Whether ``top_p_ids`` and ``top_p_probs`` both decode as ``list<list<T>>`` (their null
            rows must then agree).
    """

    schema: pa.Schema
    requested: tuple[str, ...] | None
    columns: tuple[ColumnLayout, ...]
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


def _make(schema: pa.Schema, requested: tuple[str, ...] | None) -> DecodeLayout:
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
        columns.append(ColumnLayout(name, index, kind_of(field.type), field.nullable))
    kinds = {c.name: c.kind for c in columns}
    candidates = kinds.get("top_p_ids") is Kind.LIST2 and kinds.get("top_p_probs") is Kind.LIST2
    return DecodeLayout(schema, requested, tuple(columns), candidates)


class _Recent:
    """The layouts of the few (schema, requested columns) pairs last met, most recent first.

    Decoders run in several threads (a trainer's fetches): the tuple is replaced whole, never changed in
    place, so a lookup sees one snapshot; a racing update can drop an entry, which costs one ``_make``.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: tuple[DecodeLayout, ...] = ()
        self._lock = threading.Lock()

    def get(self, schema: pa.Schema, requested: tuple[str, ...] | None) -> DecodeLayout:
        entries = self._entries
        for i, layout in enumerate(entries):
            if layout.requested == requested and (layout.schema is schema or layout.schema.equals(schema)):
                if i:
                    self._put(layout)
                return layout
        layout = _make(schema, requested)  # raises for a missing column: nothing remembered
        self._put(layout)
        return layout

    def _put(self, layout: DecodeLayout) -> None:
        with self._lock:
            rest = tuple(e for e in self._entries if e is not layout)
            self._entries = (layout, *rest[: self._size - 1])

    def __len__(self) -> int:
        return len(self._entries)


_recent = _Recent(_RECENT)


def layout_of(schema: pa.Schema, requested: Sequence[str] | None) -> DecodeLayout:
    """The decode layout of ``requested`` columns (None: all) of ``schema``, remembered for the
    :data:`_RECENT` pairs last met (equal schemas, by ``Schema.equals``, share one).

    Raises:
        SchemaError: a requested column is not in the schema.
    """
    return _recent.get(schema, None if requested is None else tuple(requested))
