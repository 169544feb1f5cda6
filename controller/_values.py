"""The typed JSON encoding of controller values: what the journal records and the control plane carries.

Only JSON primitives, tuples, lists, string-keyed dicts, bytes and the controller's frozen records and
enums (every name :mod:`._records` exports) are encoded; nothing is unpickled, so a peer or a file cannot
make this process run code. Records are written by name and rebuilt with their own constructors (which
validate them):

* ``{"$m": {...}}`` a dict with string keys, ``{"$tuple": [...]}`` a tuple (frozensets too),
  ``{"$b": "<base64>"}`` bytes;
* ``{"$d": "GroupInfo", "v": {...fields}}`` a frozen dataclass, ``{"$t": "Partition", "v": [...]}`` a
  named tuple, ``{"$e": "GroupState", "v": "READY"}`` an enum member.

A tagged object must carry exactly its tag's keys; ``NaN``, ``Infinity`` and numbers that overflow a float
are refused; error messages quote at most about 100 characters of the input. This module does not bound
the size or nesting of what it parses (the Flight endpoint does, before it calls :func:`loads`), and does
not version individual records: a record whose fields changed between two releases is refused with
:class:`~trajflight.errors.InvalidRequestError` (unknown or missing field), not guessed.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import json
import math
from typing import Any

from trajflight.errors import InvalidRequestError, brief

from . import _records

__all__ = ["dumps", "from_json", "loads", "to_json"]

# Each tag and the keys an object of it carries (exactly these).
_TAGS = {
    "$m": frozenset({"$m"}),
    "$tuple": frozenset({"$tuple"}),
    "$b": frozenset({"$b"}),
    "$e": frozenset({"$e", "v"}),
    "$t": frozenset({"$t", "v"}),
    "$d": frozenset({"$d", "v"}),
}

_RECORDS: dict[str, type] = {name: getattr(_records, name) for name in _records.__all__}
_PLAIN = frozenset({type(None), bool, int, float, str})  # exact types: enum members are not plain
_ENCODER = json.JSONEncoder(separators=(",", ":"))  # built once: json.dumps builds one per call


def _is_namedtuple(obj: object) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def to_json(obj: Any) -> Any:
    """``obj`` as a tree of JSON values (see the module docstring).

    Raises:
        InvalidRequestError: ``obj`` holds a value of a type that may not be encoded.
    """
    if type(obj) in _PLAIN:
        return obj
    if isinstance(obj, enum.Enum):  # before str/int: StrEnum and IntEnum members are both
        return {"$e": type(obj).__name__, "v": obj.value}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, bytes):
        return {"$b": base64.b64encode(obj).decode("ascii")}
    if _is_namedtuple(obj):
        return {"$t": type(obj).__name__, "v": [to_json(x) for x in obj]}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            "$d": type(obj).__name__,
            "v": {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init},
        }
    if isinstance(obj, tuple | frozenset):
        return {"$tuple": [to_json(x) for x in obj]}
    if isinstance(obj, list):
        return [to_json(x) for x in obj]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise InvalidRequestError(f"cannot send a dict with non-string keys: {list(obj)[:3]}")
        return {"$m": {k: to_json(v) for k, v in obj.items()}}
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


def from_json(obj: Any) -> Any:
    """The value :func:`to_json` encoded as the tree ``obj`` (records rebuilt by their constructors).

    Raises:
        InvalidRequestError: ``obj`` is not such a tree, or names an unknown record type.
    """
    if isinstance(obj, list):
        return [from_json(x) for x in obj]
    if not isinstance(obj, dict):
        return obj
    tag = _tag(obj)
    try:
        if tag == "$m":
            return {k: from_json(v) for k, v in _expect(obj["$m"], dict, "a '$m' value").items()}
        if tag == "$tuple":
            return tuple(from_json(x) for x in _expect(obj["$tuple"], list, "a '$tuple' value"))
        if tag == "$b":
            return base64.b64decode(_expect(obj["$b"], str, "a '$b' value"), validate=True)
        if tag == "$e":
            return _record(obj["$e"])(obj["v"])
        if tag == "$t":
            return _record(obj["$t"])(*(from_json(x) for x in _expect(obj["v"], list, "a record's 'v'")))
        return _record(obj["$d"])(
            **{k: from_json(v) for k, v in _expect(obj["v"], dict, "a record's 'v'").items()}
        )
    except InvalidRequestError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, binascii.Error) as exc:
        raise InvalidRequestError(f"malformed control-plane message: {brief(str(exc))}") from exc


def _no_constant(name: str) -> Any:
    raise InvalidRequestError(f"control-plane message holds {name}; send finite numbers only")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidRequestError(f"control-plane message holds a number out of range: {brief(text)}")
    return value


def dumps(obj: Any) -> bytes:
    """Encode ``obj`` (primitives, containers, bytes, the controller's records and enums) as JSON bytes.

    Raises:
        InvalidRequestError: ``obj`` holds a value of a type that may not be encoded.
    """
    return _ENCODER.encode(to_json(obj)).encode()


def loads(data: bytes) -> Any:
    """Decode what :func:`dumps` produced (no bound on size or nesting: the caller bounds untrusted input).

    Raises:
        InvalidRequestError: the bytes are not such a message (not JSON, a non-finite number, an untagged
            object, an unknown record type).
    """
    try:
        parsed = json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except InvalidRequestError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidRequestError(f"control-plane message is not JSON: {brief(str(exc))}") from exc
    return from_json(parsed)
