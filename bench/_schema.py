"""The JSON document ``trajflight bench`` writes: its schema (JSON Schema, draft 2020-12) and a validator.

``trajflight bench --schema`` prints the schema. :func:`validate` checks a document against it with a small
built-in validator (the subset of JSON Schema used here: ``type``, ``required``, ``properties``,
``additionalProperties``, ``items``, ``enum``, ``minimum``, ``exclusiveMinimum``, local ``$ref``), so no
extra package is needed.

Each system names its ``form`` (how it is driven) and whether it is its peer's ``strongest`` ordinary form;
ratios and targets judge trajflight against the strongest forms. ``handoff`` (where measured) is one group
from a writer process to a trainer process already waiting for it.

Units: seconds (``seconds``), decimal gigabytes per second (``GBps``: payload bytes / 1e9 / median
seconds), milliseconds (``*_ms``), bytes (``*_bytes``). ``*_per_payload_byte`` is the peak RSS growth of
the processes divided by the payload bytes held.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SCHEMA", "SchemaViolation", "validate"]

_POS = {"type": "number", "exclusiveMinimum": 0}
_NONNEG = {"type": "number", "minimum": 0}
_STATS = {
    "type": "object",
    "required": ["median", "min", "max", "q1", "q3", "n"],
    "properties": {
        "median": _POS,
        "min": _POS,
        "max": _POS,
        "q1": _POS,
        "q3": _POS,
        "n": {"type": "integer", "minimum": 1},
    },
    "additionalProperties": False,
}
_OP = {
    "type": "object",
    "description": "One throughput figure: median and spread over the timed rounds.",
    "required": [
        "bytes",
        "groups",
        "seconds",
        "GBps",
        "GBps_min",
        "GBps_max",
        "GBps_q1",
        "GBps_q3",
        "groups_per_s",
    ],
    "properties": {
        "bytes": {"type": "integer", "exclusiveMinimum": 0},
        "groups": {"type": "integer", "exclusiveMinimum": 0},
        "seconds": {"$ref": "#/$defs/stats"},
        "GBps": _POS,
        "GBps_min": _POS,
        "GBps_max": _POS,
        "GBps_q1": _POS,
        "GBps_q3": _POS,
        "groups_per_s": _POS,
    },
    "additionalProperties": False,
}
_LATENCY = {
    "type": "object",
    "required": ["what", "p50_ms", "p99_ms", "min_ms", "max_ms", "n", "group_payload_bytes"],
    "properties": {
        "what": {"type": "string"},
        "p50_ms": _POS,
        "p99_ms": _POS,
        "min_ms": _POS,
        "max_ms": _POS,
        "n": {"type": "integer", "minimum": 1},
        "group_payload_bytes": {"type": "integer", "exclusiveMinimum": 0},
    },
    "additionalProperties": False,
}
_HANDOFF = {
    "type": "object",
    "description": "One group from a writer process to a trainer process already waiting for it.",
    "required": ["what", "p50_ms", "p99_ms", "min_ms", "max_ms", "n"],
    "properties": {
        "what": {"type": "string"},
        "p50_ms": _POS,
        "p99_ms": _POS,
        "min_ms": _POS,
        "max_ms": _POS,
        "n": {"type": "integer", "minimum": 1},
    },
    "additionalProperties": False,
}
_MEMORY = {
    "type": "object",
    "description": "Peak RSS during the warm-up put + gets. Growth can be 0 when freed memory is reused.",
    "required": [
        "payload_bytes",
        "client_peak_bytes",
        "client_growth_bytes",
        "client_per_payload_byte",
        "servers_peak_bytes",
        "servers_growth_bytes",
        "servers_per_payload_byte",
        "server_processes",
        "method",
        "servers_counted",
    ],
    "properties": {
        "payload_bytes": {"type": "integer", "exclusiveMinimum": 0},
        "client_peak_bytes": {"type": "integer", "exclusiveMinimum": 0},
        "client_growth_bytes": {"type": "integer", "minimum": 0},
        "client_per_payload_byte": _NONNEG,
        "servers_peak_bytes": {"type": ["integer", "null"], "minimum": 0},
        "servers_growth_bytes": {"type": ["integer", "null"], "minimum": 0},
        "servers_per_payload_byte": {"type": ["number", "null"], "minimum": 0},
        "server_processes": {"type": "integer", "minimum": 0},
        "method": {"type": "string", "enum": ["VmHWM", "sampled RSS"]},
        "servers_counted": {"type": "string"},
    },
    "additionalProperties": False,
}
_CONTROLLER = {
    "type": "object",
    "required": ["group_cycles_per_s", "transitions_per_s", "groups_per_lease", "groups_cycled", "how"],
    "properties": {
        "group_cycles_per_s": {"$ref": "#/$defs/stats"},
        "transitions_per_s": _POS,
        "groups_per_lease": {"type": "integer", "exclusiveMinimum": 0},
        "groups_cycled": {"type": "integer", "exclusiveMinimum": 0},
        "how": {"type": "string"},
    },
    "additionalProperties": False,
}
_SYSTEM = {
    "type": "object",
    "description": "One system: status 'ok' has every figure; 'skipped' has the install hint.",
    "required": ["status", "role", "form", "strongest", "description", "reason", "hint"],
    "properties": {
        "status": {"enum": ["ok", "skipped", "failed"]},
        "role": {"enum": ["system", "reference", "peer"]},
        "form": {"type": "string", "description": "How the system is driven ('one object per batch')."},
        "strongest": {
            "type": "boolean",
            "description": "The peer's strongest ordinary form: the one ratios and targets judge by.",
        },
        "description": {"type": "string"},
        "reason": {"type": ["string", "null"]},
        "hint": {"type": ["string", "null"]},
        "traceback": {"type": "string"},
        "put": {"$ref": "#/$defs/op"},
        "put_batched": {"$ref": "#/$defs/op"},
        "get_all_jagged": {"$ref": "#/$defs/op"},
        "get_all_padded": {"$ref": "#/$defs/op"},
        "get_subset_jagged": {"$ref": "#/$defs/op"},
        "get_subset_padded": {"$ref": "#/$defs/op"},
        "gets_after_single_puts": {
            "type": "object",
            "description": "Where the gets above follow the batched put: the same gets after one put "
            "per group (a weaker form, shown, never judged).",
            "additionalProperties": {"$ref": "#/$defs/op"},
        },
        "latency": {"$ref": "#/$defs/latency"},
        "handoff": {"$ref": "#/$defs/handoff"},
        "memory": {"$ref": "#/$defs/memory"},
        "controller": {"$ref": "#/$defs/controller"},
    },
    "additionalProperties": False,
}
_TARGET = {
    "type": "object",
    "required": ["id", "description", "threshold", "value", "met", "note"],
    "properties": {
        "id": {"type": "string"},
        "description": {"type": "string"},
        "threshold": {"type": "number"},
        "value": {"type": ["number", "null"]},
        "met": {"type": ["boolean", "null"]},
        "note": {"type": "string"},
    },
    "additionalProperties": False,
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "trajflight bench result",
    "type": "object",
    "required": [
        "schema_version",
        "tool",
        "started",
        "duration_s",
        "machine",
        "config",
        "systems",
        "ratios",
        "targets",
    ],
    "properties": {
        "schema_version": {"type": "integer", "enum": [2]},
        "tool": {"type": "string"},
        "started": {"type": "string"},
        "duration_s": _POS,
        "machine": {
            "type": "object",
            "required": [
                "cpus",
                "platform",
                "python",
                "pyarrow",
                "torch",
                "numpy",
                "loadavg_before",
                "loadavg_after",
            ],
        },
        "config": {
            "type": "object",
            "required": [
                "groups",
                "samples",
                "seed",
                "response_median",
                "repeats",
                "latency_iters",
                "handoff_iters",
                "systems",
                "quick",
                "payload_bytes",
                "subset_payload_bytes",
                "subset_columns",
            ],
            "properties": {
                "groups": {"type": "integer", "exclusiveMinimum": 0},
                "samples": {"type": "integer", "exclusiveMinimum": 0},
                "repeats": {"type": "integer", "exclusiveMinimum": 0},
                "latency_iters": {"type": "integer", "exclusiveMinimum": 0},
                "handoff_iters": {"type": "integer", "exclusiveMinimum": 0},
                "payload_bytes": {"type": "integer", "exclusiveMinimum": 0},
                "subset_payload_bytes": {"type": "integer", "exclusiveMinimum": 0},
                "quick": {"type": "boolean"},
            },
        },
        "systems": {"type": "object", "additionalProperties": {"$ref": "#/$defs/system"}},
        "ratios": {
            "type": "object",
            "description": "'<figure> <a>/<b>': a's throughput / b's (latency: b's p50 / a's); >1: a faster.",
            "additionalProperties": _POS,
        },
        "targets": {"type": "array", "items": {"$ref": "#/$defs/target"}},
    },
    "$defs": {
        "stats": _STATS,
        "op": _OP,
        "latency": _LATENCY,
        "handoff": _HANDOFF,
        "memory": _MEMORY,
        "controller": _CONTROLLER,
        "system": _SYSTEM,
        "target": _TARGET,
    },
}


class SchemaViolation(ValueError):
    """The document does not match :data:`SCHEMA`; the message names the JSON path."""


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list, tuple),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def _is(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[name])


def _check(value: Any, schema: dict[str, Any], path: str, root: dict[str, Any]) -> None:
    ref = schema.get("$ref")
    if ref is not None:
        target: Any = root
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        _check(value, target, path, root)
        return
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_is(value, n) for n in names):
            raise SchemaViolation(
                f"{path}: expected {' or '.join(names)}, got {type(value).__name__} {value!r:.80}"
            )
    if "enum" in schema and value not in schema["enum"]:
        raise SchemaViolation(f"{path}: {value!r} is not one of {schema['enum']}")
    if _is(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            raise SchemaViolation(f"{path}: {value} < minimum {schema['minimum']}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            raise SchemaViolation(f"{path}: {value} is not > {schema['exclusiveMinimum']}")
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                raise SchemaViolation(f"{path}: missing required {key!r}")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                _check(item, props[key], f"{path}.{key}", root)
            elif extra is False:
                raise SchemaViolation(f"{path}: unexpected property {key!r}")
            elif isinstance(extra, dict):
                _check(item, extra, f"{path}.{key}", root)
    if isinstance(value, list | tuple) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{i}]", root)


def validate(document: Any, schema: dict[str, Any] | None = None) -> None:
    """Check ``document`` against the schema (default :data:`SCHEMA`).

    Raises:
        SchemaViolation: the first mismatch, with its JSON path (``$.systems.trajflight.put.GBps``).
    """
    root = SCHEMA if schema is None else schema
    _check(document, root, "$", root)


_OK_FIGURES = (
    "put",
    "get_all_jagged",
    "get_all_padded",
    "get_subset_jagged",
    "get_subset_padded",
    "latency",
    "memory",
)


def validate_complete(document: dict[str, Any]) -> None:
    """:func:`validate`, then check that every system that ran reports every figure.

    A system with status ``ok`` has the put, the four get figures, latency and memory; one trajflight entry
    has the controller figure; a ``skipped`` one has its install hint.

    Raises:
        SchemaViolation: naming the system and the missing figure.
    """
    validate(document)
    for name, system in document["systems"].items():
        if system["status"] == "ok":
            for figure in _OK_FIGURES:
                if figure not in system:
                    raise SchemaViolation(f"$.systems.{name}: status ok but no {figure!r}")
        elif system["status"] == "skipped" and not system["hint"]:
            raise SchemaViolation(f"$.systems.{name}: skipped without an install hint")
    ours = [s for s in document["systems"].values() if s["role"] == "system" and s["status"] == "ok"]
    if ours and not any("controller" in s for s in ours):
        raise SchemaViolation("$.systems: trajflight ran but no entry has the 'controller' figure")
