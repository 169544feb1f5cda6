"""The trajectory schema (:class:`TrajectorySchema`): a group's columns, their types, and memos of both.

The standard columns are fixed (the README's "The trajectory schema"); users extend the schema with
columns of any Arrow type.
A :class:`TrajectorySchema` is an immutable value: extending it returns a new one. Each instance keeps,
bounded, the codec's memos of what it derives from Arrow schemas (check verdicts, validate_group's plans,
encode_group's Arrow schema per column layout), so they go with it; they are not compared or shown.

This module does not check data against the schema; :mod:`trajflight.codec._validate` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa

from trajflight.errors import SchemaError

__all__ = [
    "KEY_COLUMNS",
    "RAGGED_TOKEN_COLUMNS",
    "STANDARD_SCHEMA",
    "TOKEN_ID_COLUMNS",
    "TrajectorySchema",
]

# Keys repeated in every row so analytics tools, which drop schema metadata, keep them.
KEY_COLUMNS: tuple[str, ...] = ("job_id", "epoch", "group_id", "sample_index")

# Columns with one entry per response token: their per-sample lengths must agree.
RAGGED_TOKEN_COLUMNS: tuple[str, ...] = (
    "response_ids",
    "response_logprobs",
    "loss_mask",
    "top_p_ids",
    "top_p_probs",
)

# Token-id columns: values must fit int32.
TOKEN_ID_COLUMNS: tuple[str, ...] = ("prompt_ids", "response_ids", "top_p_ids")

_STANDARD_FIELDS: tuple[tuple[pa.Field, bool], ...] = (
    # (field, required)
    (pa.field("job_id", pa.string(), nullable=False), True),
    (pa.field("epoch", pa.int64(), nullable=False), True),
    (pa.field("group_id", pa.int64(), nullable=False), True),
    (pa.field("sample_index", pa.int32(), nullable=False), True),
    (pa.field("sample_id", pa.string(), nullable=False), True),
    (pa.field("policy_version", pa.int64(), nullable=False), True),
    (pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False), True),
    (pa.field("response_ids", pa.list_(pa.int32()), nullable=False), True),
    (pa.field("response_logprobs", pa.list_(pa.float32()), nullable=False), True),
    # uint8, not bool: bool is bit-packed and has no DLPack export.
    (pa.field("loss_mask", pa.list_(pa.uint8()), nullable=False), True),
    (pa.field("reward", pa.float32(), nullable=False), True),
    (pa.field("advantage", pa.float32(), nullable=True), False),
    (pa.field("top_p_ids", pa.list_(pa.list_(pa.int32())), nullable=True), False),
    (pa.field("top_p_probs", pa.list_(pa.list_(pa.float32())), nullable=True), False),
    (pa.field("finish_reason", pa.dictionary(pa.int8(), pa.string()), nullable=True), False),
    # The struct's fields are the engine's own; any struct type is accepted for this column.
    (pa.field("telemetry", pa.struct([]), nullable=True), False),
)


# Memos kept with each schema (a job has a handful of group layouts): the Arrow schemas last met per kind of
# derived value, found by Schema.equals (hashing a pa.Schema walks every field in Python), and the Arrow
# schemas of the column layouts encode_group last built. BENCHMARKS.md ("The codec") has what they save.
_RECENT_CACHE = 8
_GROUP_SCHEMAS_CACHE = 64

T = TypeVar("T")


def _type_matches(name: str, expected: pa.DataType, actual: pa.DataType) -> bool:
    if name == "telemetry" and expected == pa.struct([]):
        # The standard schema leaves the telemetry struct's fields to the engine.
        return bool(pa.types.is_struct(actual))
    if name == "job_id":
        # The schema allows string or dictionary<*, string> for the job id.
        return bool(
            actual == pa.string() or (pa.types.is_dictionary(actual) and actual.value_type == pa.string())
        )
    return bool(actual == expected)


@dataclass(frozen=True, slots=True)
class TrajectorySchema:
    """The columns a trajectory group may carry, which of them are required, and their Arrow types.

    Attributes:
        fields: Every known column in order: the standard ones first, then user columns.
        required: Names of the columns every group must carry.
    """

    fields: tuple[pa.Field, ...]
    required: frozenset[str]
    _by_name: Mapping[str, pa.Field] = field(init=False, repr=False, compare=False)
    _non_nullable: frozenset[str] = field(init=False, repr=False, compare=False)
    # kind -> (Arrow schema, what was derived from it), most recent first (see _derived).
    _recent: dict[str, tuple[tuple[pa.Schema, Any], ...]] = field(init=False, repr=False, compare=False)
    # column names -> (their types, the checked Arrow schema of a group of those columns).
    _group_schemas: dict[tuple[str, ...], tuple[tuple[pa.DataType, ...], pa.Schema]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        by_name: dict[str, pa.Field] = {}
        for f in self.fields:
            if f.name in by_name:
                raise SchemaError(f"column {f.name!r} is declared twice in the schema", column=f.name)
            by_name[f.name] = f
        missing = self.required - by_name.keys()
        if missing:
            raise SchemaError(f"required columns {sorted(missing)} are not declared in the schema")
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_non_nullable", frozenset(f.name for f in self.fields if not f.nullable))
        object.__setattr__(self, "_recent", {})
        object.__setattr__(self, "_group_schemas", {})

    @property
    def non_nullable(self) -> frozenset[str]:
        """Names of the declared columns that may not hold nulls."""
        return self._non_nullable

    @property
    def names(self) -> tuple[str, ...]:
        """All column names, standard first."""
        return tuple(f.name for f in self.fields)

    @property
    def arrow(self) -> pa.Schema:
        """The full schema as a ``pyarrow.Schema`` (every known column, optional ones included)."""
        return pa.schema(self.fields)

    def field(self, name: str) -> pa.Field:
        """Return the field called ``name``.

        Raises:
            SchemaError: no such column is declared.
        """
        try:
            return self._by_name[name]
        except KeyError:
            raise SchemaError(
                f"column {name!r} is not in the trajectory schema; declare it with "
                f"schema.extend(pa.field({name!r}, <type>))",
                column=name,
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def extend(self, *fields: pa.Field | tuple[str, pa.DataType], required: bool = False) -> TrajectorySchema:
        """Return a new schema with user columns appended (any Arrow type).

        Args:
            *fields: ``pa.field(...)`` values or ``(name, type)`` pairs.
            required: Whether every group must carry the new columns.

        Raises:
            SchemaError: a name is already declared.
        """
        new = tuple(f if isinstance(f, pa.Field) else pa.field(f[0], f[1]) for f in fields)
        names = frozenset(f.name for f in new)
        return TrajectorySchema(self.fields + new, self.required | names if required else self.required)

    def with_telemetry(self, telemetry: pa.StructType) -> TrajectorySchema:
        """Return a new schema whose ``telemetry`` column has the given struct type."""
        if not pa.types.is_struct(telemetry):
            raise SchemaError(f"telemetry must be a struct type, got {telemetry}", column="telemetry")
        fields = tuple(
            pa.field("telemetry", telemetry, nullable=True) if f.name == "telemetry" else f
            for f in self.fields
        )
        return TrajectorySchema(fields, self.required)

    def accepts(self, name: str, type_: pa.DataType) -> bool:
        """Whether a column called ``name`` of Arrow type ``type_`` conforms to this schema.

        Unknown names are accepted (a group may carry columns the schema has not heard of); standard
        ``telemetry`` accepts any struct and ``job_id`` accepts string or dictionary of string.
        """
        declared = self._by_name.get(name)
        if declared is None:
            return True
        return _type_matches(name, declared.type, type_)

    def check(self, schema: pa.Schema | Iterable[pa.Field]) -> None:
        """Check the columns of ``schema`` against this one: required present, declared types equal.

        A ``pyarrow.Schema`` that passed is remembered (the last few), so checking an equal one again (every
        IPC stream and every batch read from it carries a new but equal Schema object) costs a comparison.
        ``Schema.equals`` compares names, order, types and nullability, ignoring metadata: at least
        everything the check reads (names and types), so an equal schema passes exactly when the
        remembered one did.

        Raises:
            SchemaError: naming the first missing column or mistyped column.
        """
        if isinstance(schema, pa.Schema):
            self._derived("check", schema, self._check, schema)
        else:
            self._check(schema)

    def _check(self, schema: pa.Schema | Iterable[pa.Field]) -> bool:
        present = {f.name: f for f in schema}
        for name in self.names:
            if name in self.required and name not in present:
                raise SchemaError(
                    f"required column {name!r} is missing; every group carries {sorted(self.required)}",
                    column=name,
                )
        for name, f in present.items():
            if not self.accepts(name, f.type):
                raise SchemaError(
                    f"column {name!r} has type {f.type}, the schema declares {self._by_name[name].type}",
                    column=name,
                )
        return True

    def _derived(self, kind: str, arrow: pa.Schema, make: Callable[..., T], *args: Any) -> T:
        """``make(*args)``, kept per ``kind`` for the few Arrow schemas last met (equal ones share it).

        For the codec's own values derived from this schema and an Arrow schema (the verdict of
        :meth:`check`, validate_group's plan); equality is ``Schema.equals`` (names, order, types and
        nullability, not metadata), so ``make`` may read no more than those. What ``make`` raises is not
        remembered. Servers call this from several threads: the entry is replaced whole, never changed in
        place, so a lookup sees one snapshot; a racing update can drop an entry, which costs one ``make``.
        """
        entries = self._recent.get(kind, ())
        for i, (known, value) in enumerate(entries):
            if known is arrow or known.equals(arrow):
                if i:
                    self._recent[kind] = ((known, value), *entries[:i], *entries[i + 1 :])
                return value  # type: ignore[no-any-return]
        value = make(*args)
        self._recent[kind] = ((arrow, value), *entries[: _RECENT_CACHE - 1])
        return value

    def _group_schema(self, names: Sequence[str], types: Sequence[pa.DataType]) -> pa.Schema:
        """The Arrow schema of a group whose columns are ``names`` of ``types``, checked (remembered).

        Declared columns keep their field's nullability and metadata with the given type; others are plain
        fields. Looked up by the names, then the types compared with ``DataType.equals`` (the hash of a
        list type costs more than the comparison): a job's groups share a handful of layouts.

        Raises:
            SchemaError: as :meth:`check` raises for such a schema.
        """
        key = tuple(names)
        found = self._group_schemas.get(key)
        if (
            found is not None
            and len(found[0]) == len(types)
            and all(map(pa.DataType.equals, types, found[0]))
        ):
            return found[1]
        fields = [
            self._by_name[n].with_type(t) if n in self._by_name else pa.field(n, t)
            for n, t in zip(names, types, strict=True)
        ]
        arrow = pa.schema(fields)
        self.check(arrow)
        if len(self._group_schemas) >= _GROUP_SCHEMAS_CACHE:
            self._group_schemas.clear()
        self._group_schemas[key] = (tuple(types), arrow)
        return arrow


STANDARD_SCHEMA = TrajectorySchema(
    tuple(f for f, _ in _STANDARD_FIELDS), frozenset(f.name for f, req in _STANDARD_FIELDS if req)
)
"""The standard trajectory schema (the README's "The trajectory schema"); extend it with
:meth:`TrajectorySchema.extend`."""
