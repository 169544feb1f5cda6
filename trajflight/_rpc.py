"""A typed JSON encoding for control-plane messages (controller calls over Flight).

Only JSON primitives, tuples, lists, string-keyed dicts, bytes and an allowlist of frozen records and
enums cross the wire; nothing is unpickled, so a peer cannot make this process run code. Records are
sent by name and rebuilt with their own constructors (which validate them).

This module does not version individual records: a record whose fields changed between two releases is
refused with :class:`~trajflight.errors.InvalidRequestError` (unknown or missing field), not guessed.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
from typing import Any

from trajflight.errors import InvalidRequestError

__all__ = ["dumps", "loads", "register"]

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
        raise InvalidRequestError(f"unknown record type {name!r} in a control-plane message")
    return cls


def _decode(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_decode(x) for x in obj]
    if not isinstance(obj, dict):
        return obj
    try:
        if "$m" in obj:
            return {k: _decode(v) for k, v in obj["$m"].items()}
        if "$tuple" in obj:
            return tuple(_decode(x) for x in obj["$tuple"])
        if "$b" in obj:
            return base64.b64decode(obj["$b"], validate=True)
        if "$e" in obj:
            return _record(obj["$e"])(obj["v"])
        if "$t" in obj:
            return _record(obj["$t"])(*(_decode(x) for x in obj["v"]))
        if "$d" in obj:
            return _record(obj["$d"])(**{k: _decode(v) for k, v in obj["v"].items()})
    except InvalidRequestError:
        raise
    except (TypeError, ValueError, AttributeError) as exc:
        raise InvalidRequestError(f"malformed control-plane message: {exc}") from exc
    raise InvalidRequestError(f"malformed control-plane message: untagged object {sorted(obj)[:3]}")


def dumps(obj: Any) -> bytes:
    """Encode ``obj`` (primitives, containers, bytes, registered records and enums) as JSON bytes.

    Raises:
        InvalidRequestError: ``obj`` holds a value of a type that may not cross the wire.
    """
    return json.dumps(_encode(obj), separators=(",", ":")).encode()


def loads(data: bytes) -> Any:
    """Decode what :func:`dumps` produced.

    Raises:
        InvalidRequestError: the bytes are not such a message, or name an unknown record type.
    """
    try:
        parsed = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequestError(f"control-plane message is not JSON: {exc}") from exc
    return _decode(parsed)
