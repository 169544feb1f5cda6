"""The control plane's messages on the wire: the controller's typed JSON, bounded before it is parsed.

The encoding itself is the controller's (``trajflight.controller.encode_message`` /
``decode_message``: JSON primitives, tuples, lists, string-keyed dicts, bytes and the controller's frozen
records and enums; nothing is unpickled, so a peer cannot make this process run code). What this module
adds is the bound on untrusted input: :func:`loads` refuses a message larger than ``max_bytes`` and one
nested deeper than :data:`MAX_DEPTH` levels (counted outside strings, so a 100k-deep message is refused,
not recursed into) before it parses it; error messages quote at most about 100 characters of it.

It does not version individual records: a record whose fields changed between two releases is refused with
:class:`~trajflight.errors.InvalidRequestError` (unknown or missing field), not guessed.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from trajflight.controller import decode_message, encode_message
from trajflight.errors import InvalidRequestError

__all__ = ["MAX_DEPTH", "check_depth", "dumps", "loads"]

MAX_DEPTH = 32
"""Most levels of nesting (objects and arrays) a control-plane message may have; real ones use < 16."""

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


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


def dumps(obj: Any) -> bytes:
    """Encode ``obj`` (primitives, containers, bytes, the controller's records and enums) as JSON bytes.

    Raises:
        InvalidRequestError: ``obj`` holds a value of a type that may not cross the wire.
    """
    return encode_message(obj)


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
    return decode_message(data)
