"""A typed JSON encoding for control-plane messages (controller calls over Flight).

Only JSON primitives, tuples, lists, string-keyed dicts, bytes and an allowlist of frozen records and
enums cross the wire; nothing is unpickled, so a peer cannot make this process run code. Records are
sent by name and rebuilt with their own constructors (which validate them).

:func:`loads` bounds what it parses before it parses it: at most ``max_bytes`` bytes and
:data:`MAX_DEPTH` levels of nesting (counted outside strings, so a 100k-deep message is refused, not
recursed into). A tagged object must carry exactly its tag's keys; ``NaN``, ``Infinity`` and numbers
that overflow a float are refused; error messages quote at most about 100 characters of the message.

This module does not version individual records: a record whose fields changed between two releases is
refused with :class:`~trajflight.errors.InvalidRequestError` (unknown or missing field), not guessed.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import json
import math
import re
from typing import Any

import numpy as np

from trajflight.errors import InvalidRequestError, brief

__all__ = ["MAX_DEPTH", "check_depth", "dumps", "loads", "register"]

MAX_DEPTH = 32
"""Most levels of nesting (objects and arrays) a control-plane message may have; real ones use < 16."""

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1

# Each tag and the keys an object of it carries (exactly these).
_TAGS = {
    "$m": frozenset({"$m"}),
    "$tuple": frozenset({"$tuple"}),
    "$b": frozenset({"$b"}),
    "$e": frozenset({"$e", "v"}),
    "$t": frozenset({"$t", "v"}),
    "$d": frozenset({"$d", "v"}),
}

_RECORDS: dict[str, type] = {}


def register(*classes: type) -> None:
    """Allow frozen dataclasses, NamedTuples and enums to cross the wire, by class name."""
    for cls in classes:
        _RECORDS[cls.__name__] = cls


def _is_namedtuple(obj: object) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _encode(obj: Any) -> Any:
    if isinstance(obj, enum.Enum):  # before str/int: StrEnum and IntEnum members are both
        return {"$e": type(obj).__name__, "v": obj.value}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, bytes):
        return {"$b": base64.b64encode(obj).decode("ascii")}
    if _is_namedtuple(obj):
        return {"$t": type(obj).__name__, "v": [_encode(x) for x in obj]}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            "$d": type(obj).__name__,
            "v": {f.name: _encode(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init},
        }
    if isinstance(obj, tuple | frozenset):
        return {"$tuple": [_encode(x) for x in obj]}
    if isinstance(obj, list):
        return [_encode(x) for x in obj]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise InvalidRequestError(f"cannot send a dict with non-string keys: {list(obj)[:3]}")
        return {"$m": {k: _encode(v) for k, v in obj.items()}}
    raise InvalidRequestError(f"cannot send a {type(obj).__name__} over the control plane")


def _record(name: Any) -> type:
    cls = _RECORDS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise InvalidRequestError(f"unknown record type {brief(name)} in a control-plane message")
    return cls


def _tag(obj: dict[str, Any]) -> str:
    for tag, keys in _TAGS.items():
        if tag in obj:
            if obj.keys() != keys:
                raise InvalidRequestError(
                    f"malformed control-plane message: a {tag!r} object has the keys {brief(sorted(obj))}, "
                    f"expected {sorted(keys)}"
                )
            return tag
    raise InvalidRequestError(f"malformed control-plane message: untagged object {brief(sorted(obj)[:3])}")


def _expect(value: Any, kind: type, what: str) -> Any:
    if not isinstance(value, kind):
        raise InvalidRequestError(
            f"malformed control-plane message: {what} must be a {kind.__name__}, got {type(value).__name__}"
        )
    return value


def _decode(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_decode(x) for x in obj]
    if not isinstance(obj, dict):
        return obj
    tag = _tag(obj)
    try:
        if tag == "$m":
            return {k: _decode(v) for k, v in _expect(obj["$m"], dict, "a '$m' value").items()}
        if tag == "$tuple":
            return tuple(_decode(x) for x in _expect(obj["$tuple"], list, "a '$tuple' value"))
        if tag == "$b":
            return base64.b64decode(_expect(obj["$b"], str, "a '$b' value"), validate=True)
        if tag == "$e":
            return _record(obj["$e"])(obj["v"])
        if tag == "$t":
            return _record(obj["$t"])(*(_decode(x) for x in _expect(obj["v"], list, "a record's 'v'")))
        return _record(obj["$d"])(
            **{k: _decode(v) for k, v in _expect(obj["v"], dict, "a record's 'v'").items()}
        )
    except InvalidRequestError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, binascii.Error) as exc:
        raise InvalidRequestError(f"malformed control-plane message: {brief(str(exc))}") from exc


def check_depth(data: bytes, max_depth: int = MAX_DEPTH) -> None:
    """Refuse JSON ``data`` nested deeper than ``max_depth`` (objects and arrays), without parsing it.

    Brackets inside strings do not count: strings are blanked out first (one regular-expression pass),
    then the depth is a running sum over the bytes.

    Raises:
        InvalidRequestError: ``data`` is nested deeper than ``max_depth``.
    """
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return  # cannot be deeper: the common small message
    blanked = _STRING.sub(b'""', data)
    steps = _OPEN[np.frombuffer(blanked, dtype=np.uint8)]
    if steps.size and int(np.cumsum(steps, dtype=np.int64).max()) > max_depth:
        raise InvalidRequestError(
            f"control-plane message is nested deeper than {max_depth} levels; send a flatter message"
        )


def _no_constant(name: str) -> Any:
    raise InvalidRequestError(f"control-plane message holds {name}; send finite numbers only")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidRequestError(f"control-plane message holds a number out of range: {brief(text)}")
    return value


def dumps(obj: Any) -> bytes:
    """Encode ``obj`` (primitives, containers, bytes, registered records and enums) as JSON bytes.

    Raises:
        InvalidRequestError: ``obj`` holds a value of a type that may not cross the wire.
    """
    return json.dumps(_encode(obj), separators=(",", ":")).encode()


def loads(data: bytes, *, max_bytes: int | None = None, max_depth: int = MAX_DEPTH) -> Any:
    """Decode what :func:`dumps` produced, after bounding its size and nesting.

    Args:
        data: The message.
        max_bytes: Largest message accepted (``None``: any size; the controller bounds requests).
        max_depth: Most levels of nesting accepted.

    Raises:
        InvalidRequestError: the bytes are too large, too deep, not such a message, or name an unknown
            record type.
    """
    if max_bytes is not None and len(data) > max_bytes:
        raise InvalidRequestError(
            f"control-plane message of {len(data)} bytes exceeds the limit of {max_bytes} bytes; send less "
            "per call (a checkpoint too large to send can be restored from a path on the controller)"
        )
    check_depth(data, max_depth)
    try:
        parsed = json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except InvalidRequestError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidRequestError(f"control-plane message is not JSON: {brief(str(exc))}") from exc
    return _decode(parsed)
