"""Bounds and strict decoding of the storage server's wire JSON: sizes, depth, integer ranges, echoes.

Every trajflight message (descriptor, ticket, list criteria, action body) is checked here before any of
its values can reach the store: the raw bytes are bounded in size (:data:`MAX_MESSAGE_BYTES`) and in
nesting depth (:data:`MAX_DEPTH`, by a pre-scan of the bytes, so a deeply nested message never reaches
the recursive JSON parser), ``NaN``/``Infinity`` are refused (they are not JSON), the version must be the
integer :data:`~._wire.WIRE_VERSION` (``1.0`` and ``true`` are not), and every integer field is an
``int`` (never a ``bool``, never ``1.0``) within int64 and its field's minimum. Errors are
:class:`~trajflight.errors.InvalidRequestError` naming the field, and never echo more than
:data:`ECHO_CHARS` characters of what the caller sent (:func:`echo`).

This module does no I/O and knows no record type; :mod:`._wire` builds the records from what it returns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from trajflight.errors import InvalidRequestError

__all__ = [
    "ECHO_CHARS",
    "INT64_MAX",
    "MAX_DEPTH",
    "MAX_MESSAGE_BYTES",
    "MAX_NAME_CHARS",
    "MAX_TTL",
    "echo",
    "field",
    "int_field",
    "int_list",
    "load_message",
    "name_field",
    "req_int",
    "req_name",
    "ttl_field",
]

MAX_MESSAGE_BYTES = 16 * 2**20
"""Largest message (a ticket naming ~100k groups); anything larger is not a real request."""
MAX_DEPTH = 32
"""Deepest nesting of arrays and objects in a message (v1 messages nest 3 deep; the rest is room for
fields a later minor revision may add)."""
MAX_NAME_CHARS = 1024
"""Longest job id, writer id, column name or reservation id on the wire."""
INT64_MAX = 2**63 - 1
"""Every integer on the wire is an int64 (Arrow's key columns and the fence board are int64)."""
MAX_TTL = 3600.0
"""Longest ``ttl`` (seconds) a same-host writer may ask for; the server's own ``--shm-ttl`` caps it too."""
ECHO_CHARS = 100
"""At most this many characters of caller input appear in an error message."""

_OPENER, _CLOSER, _QUOTE = 1, 2, 3
# What the depth scan looks at, as a bytes.translate table (a C loop): brackets and quotes, all else 0.
_CLASS = bytes(
    _OPENER if b in b"[{" else _CLOSER if b in b"]}" else _QUOTE if b == ord('"') else 0 for b in range(256)
)


def echo(value: object) -> str:
    """``repr(value)`` for an error message, cut to :data:`ECHO_CHARS` characters (``...`` marks a cut)."""
    if isinstance(value, str | bytes | bytearray) and len(value) > ECHO_CHARS:
        value = value[:ECHO_CHARS]  # repr of the head only: a 10 MB name is never formatted whole
    elif isinstance(value, list | dict | tuple) and len(value) > 8:
        return f"<{type(value).__name__} of {len(value)} items>"
    try:
        text = repr(value)
    except ValueError:  # an int beyond sys.get_int_max_str_digits()
        text = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else "<unprintable>"
    return text if len(text) <= ECHO_CHARS else text[: ECHO_CHARS - 3] + "..."


def _unescaped(arr: np.ndarray, quotes: np.ndarray) -> np.ndarray:
    """The positions of ``quotes`` not escaped: an odd run of backslashes before a quote escapes it."""
    index = np.arange(len(arr))
    last_plain = np.maximum.accumulate(np.where(arr == ord("\\"), -1, index))
    before = quotes - 1
    run = np.where(before >= 0, before - last_plain[np.maximum(before, 0)], 0)
    kept: np.ndarray = quotes[run % 2 == 0]
    return kept


def _depth(data: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in JSON ``data``, brackets inside strings not counted.

    Vectorised, in the JSON scanner's own terms: a bracket is inside a string when an odd number of
    unescaped quotes precede it. For bytes that are not JSON the result may be anything at least the
    depth the parser would reach before its first error, so it never lets a deeper message through.
    """
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return 0  # cannot be deeper than its number of openers: no scan needed (most messages)
    classes = np.frombuffer(data.translate(_CLASS), dtype=np.uint8)
    at = np.flatnonzero(classes)  # only brackets and quotes from here on
    kind = classes[at]
    quotes = at[kind == _QUOTE]
    if b"\\" in data:
        quotes = _unescaped(np.frombuffer(data, dtype=np.uint8), quotes)
    brackets = kind != _QUOTE
    outside = (np.searchsorted(quotes, at[brackets]) & 1) == 0
    steps = np.where(kind[brackets][outside] == _OPENER, 1, -1)
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_message(data: object, what: str, version: int) -> dict[str, Any]:
    """Decode one wire message: bounded bytes, bounded depth, a JSON object whose ``"v"`` is ``version``.

    Raises:
        InvalidRequestError: not bytes, too large, too deep, not UTF-8 JSON, not an object, or another
            (or a non-integer) version.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidRequestError(f"{what}: expected bytes, got {type(data).__name__}")
    if len(data) > MAX_MESSAGE_BYTES:
        raise InvalidRequestError(
            f"{what}: {len(data)} bytes is larger than the {MAX_MESSAGE_BYTES} allowed", field="size"
        )
    raw = bytes(data)
    depth = _depth(raw)
    if depth > MAX_DEPTH:
        raise InvalidRequestError(
            f"{what}: nested {depth} deep, deeper than the {MAX_DEPTH} allowed; not a trajflight message",
            field="depth",
        )
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidRequestError(
            f"{what}: not a trajflight message (expected UTF-8 JSON with a 'v' field, got {echo(raw[:32])}); "
            "build it with trajflight.flight_server or follow docs/wire-format.md"
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequestError(f"{what}: expected a JSON object, got {type(body).__name__}")
    given = body.get("v")
    if type(given) is not int or given != version:  # 1.0 and true are not the integer 1
        raise InvalidRequestError(
            f"{what}: unknown wire version {echo(given)}; this server speaks v{version} (an integer). "
            "Upgrade the older side so both speak the same version",
            field="v",
        )
    return body


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", str: "a string", bool: "a boolean", list: "a list", dict: "an object"}
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)


def field(
    body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str, *, required: bool = True
) -> Any:
    """``body[name]`` if it is a ``kind`` (a missing or null field is None where not ``required``).

    ``true``/``false`` is never a number, and ``1.0`` is never an ``int``.
    """
    if name not in body or body[name] is None:
        if required:
            raise InvalidRequestError(f"{what}: missing field {name!r}", field=name)
        return None
    value = body[name]
    if isinstance(value, bool) and kind is not bool:
        raise InvalidRequestError(
            f"{what}: field {name!r} must be {_kind_name(kind)}, got a boolean", field=name
        )
    if not isinstance(value, kind):
        raise InvalidRequestError(
            f"{what}: field {name!r} must be {_kind_name(kind)}, got {type(value).__name__} {echo(value)}",
            field=name,
        )
    return value


def int_field(
    body: Mapping[str, Any], name: str, what: str, *, minimum: int = 0, required: bool = True
) -> int | None:
    """An integer field in ``[minimum, INT64_MAX]`` (None when absent and not ``required``)."""
    value = field(body, name, int, what, required=required)
    if value is None:
        return None
    if not minimum <= value <= INT64_MAX:
        raise InvalidRequestError(
            f"{what}: field {name!r} must be an integer in [{minimum}, 2**63-1], got {echo(value)}",
            field=name,
        )
    return int(value)


def name_field(
    body: Mapping[str, Any], name: str, what: str, *, required: bool = True, empty: bool = False
) -> str | None:
    """A string field of at most :data:`MAX_NAME_CHARS` characters (non-empty unless ``empty``)."""
    value: str | None = field(body, name, str, what, required=required)
    if value is None:
        return None
    if not value and not empty:
        raise InvalidRequestError(f"{what}: {name} must not be empty", field=name)
    if len(value) > MAX_NAME_CHARS:
        raise InvalidRequestError(
            f"{what}: {name} has {len(value)} characters, more than the {MAX_NAME_CHARS} allowed "
            f"({echo(value)})",
            field=name,
        )
    return value


def req_int(body: Mapping[str, Any], name: str, what: str, *, minimum: int = 0) -> int:
    """A required integer field in ``[minimum, INT64_MAX]`` (see :func:`int_field`)."""
    value = int_field(body, name, what, minimum=minimum)
    if value is None:  # pragma: no cover - a required field is never None
        raise InvalidRequestError(f"{what}: missing field {name!r}", field=name)
    return value


def req_name(body: Mapping[str, Any], name: str, what: str, *, empty: bool = False) -> str:
    """A required name field (see :func:`name_field`)."""
    value = name_field(body, name, what, empty=empty)
    if value is None:  # pragma: no cover - a required field is never None
        raise InvalidRequestError(f"{what}: missing field {name!r}", field=name)
    return value


def int_list(values: list[Any], name: str, what: str, *, minimum: int = 0) -> list[int]:
    """``values`` if every item is an ``int`` (not a bool) in ``[minimum, INT64_MAX]``."""
    for v in values:
        if type(v) is not int or not minimum <= v <= INT64_MAX:
            raise InvalidRequestError(
                f"{what}: {name!r} must be integers in [{minimum}, 2**63-1], got {echo(v)}", field=name
            )
    return values


def ttl_field(body: Mapping[str, Any], what: str) -> float | None:
    """The optional ``ttl``: a finite number of seconds in ``(0, MAX_TTL]``."""
    ttl = field(body, "ttl", (int, float), what, required=False)
    if ttl is None:
        return None
    if not 0 < ttl <= MAX_TTL:  # NaN compares false; inf and huge ints are out of range
        raise InvalidRequestError(
            f"{what}: 'ttl' must be in (0, {MAX_TTL:g}] seconds, got {echo(ttl)}", field="ttl"
        )
    return float(ttl)
