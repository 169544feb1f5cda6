"""The journal's format: one versioned, checksummed record per state-changing command, and reading it back.

A journal file is a sequence of records, each ``length`` (uint32, little-endian), ``crc32`` of the body
(uint32, little-endian), then the body: UTF-8 JSON ``{"v": 1, "op": <operation>, "args": {<field>:
<value>}, "now": <seconds>}``, its values in the typed encoding of :mod:`._values` (records, enums,
tuples and bytes tagged; never pickle). ``op`` and ``args`` are a command of :mod:`._commands`; ``now``
is the host's clock when it ran. :func:`records` yields them back in order and tolerates a torn last
record (its call never returned to its caller); anything else that does not read back is a
:class:`~trajflight.errors.RecoveryError` naming the journal file, the record and, when known, its
operation.

Journals written by trajflight before this format (pickled ``(method, kwargs, now)`` records) are refused,
not read: unpickling a file can run code. The error says how to recover: open the state directory once
with the release that wrote it (its start folds the journal into a new snapshot and leaves an empty
journal), then start this one; or move the state directory aside and restore the jobs from their
checkpoints. Snapshots are not affected: ``snapshot-N.ckpt`` files keep their JSON format
(:mod:`._checkpoint`) and are read as they are; a refused journal and its snapshot are left untouched.

This module does no file I/O of its own: the host appends the bytes of :func:`encode` and reads the file.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from typing import Any

from trajflight.errors import InvalidRequestError, RecoveryError, brief

from . import _values
from ._commands import COMMANDS, Command, Kind

__all__ = ["RECORD", "VERSION", "diverged", "encode", "records"]

RECORD = struct.Struct("<II")
"""The header of a record: body length and CRC-32 of the body."""

VERSION = 1
"""The version of the record body this trajflight writes and reads."""

_PICKLE = 0x80  # the first byte of a pickle (protocol 2 and later): a journal of older releases
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)  # built once, not per record


def encode(command: Command[Any], now: float) -> bytes:
    """The journal record of ``command`` run at ``now`` (header and body).

    Raises:
        InvalidRequestError: an argument cannot be recorded (a type the typed encoding refuses, or a
            number that is not finite); the caller refuses the command before it runs.
    """
    to_json = _values.to_json
    args = {name: to_json(getattr(command, name)) for name in command.argument_names}
    try:
        body = _ENCODER.encode({"v": VERSION, "op": command.name, "args": args, "now": now}).encode()
    except ValueError as exc:  # NaN or an infinity: JSON has none, and replay would refuse it
        raise InvalidRequestError(
            f"{command.name}: an argument is not a finite number ({brief(str(exc))}); pass finite numbers"
        ) from None
    return RECORD.pack(len(body), zlib.crc32(body)) + body


def records(data: bytes, path: str) -> Iterator[tuple[int, Command[Any], float]]:
    """Each record of the journal ``data`` (read from ``path``) as ``(number, command, now)``, in order;
    ``number`` counts from 1. A torn last record (short, or failing its checksum at the very end) ends the
    journal quietly.

    Raises:
        RecoveryError: a record before the last fails its checksum, a record does not decode or names no
            journaled operation, or the journal is of the pickle format of older releases.
    """
    pos, number = 0, 0
    while pos + RECORD.size <= len(data):
        length, crc = RECORD.unpack_from(data, pos)
        end = pos + RECORD.size + length
        body = data[pos + RECORD.size : end]
        number += 1
        if len(body) < length:
            return  # a torn last record: the call it describes never returned to its caller
        if zlib.crc32(body) != crc:
            if end == len(data):
                return  # the last record, torn mid-write: its call never returned either
            raise diverged(path, number, None, "its checksum does not match (the journal is corrupt)")
        pos = end
        if body[:1] == bytes([_PICKLE]):
            raise _pickled(path, number)
        command, now = _decode(body, path, number)
        yield number, command, now


def _decode(body: bytes, path: str, number: int) -> tuple[Command[Any], float]:
    try:
        record = json.loads(body)
        if not isinstance(record, dict) or record.keys() != {"v", "op", "args", "now"}:
            raise ValueError("not a journal record object")
        version, op, args, now = record["v"], record["op"], record["args"], record["now"]
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise diverged(
            path, number, None, f"it does not decode ({type(exc).__name__}: {brief(str(exc))})"
        ) from exc
    if version != VERSION:
        raise RecoveryError(
            f"journal {path}: record {number} has version {brief(version)}, not the version {VERSION} this "
            "trajflight reads; start the controller with the trajflight that wrote it",
            path=path,
            record=number,
            method=None,
        )
    cls = COMMANDS.get(op) if isinstance(op, str) else None
    if cls is None or cls.kind is not Kind.MUTATING:
        raise diverged(path, number, None, f"it names no journaled operation ({brief(op)})")
    if not isinstance(args, dict) or isinstance(now, bool) or not isinstance(now, int | float):
        raise diverged(path, number, cls.name, "its arguments or time are malformed")
    try:
        return cls(**{name: _values.from_json(value) for name, value in args.items()}), now
    except (InvalidRequestError, TypeError) as exc:
        raise diverged(
            path, number, cls.name, f"it does not decode ({type(exc).__name__}: {brief(str(exc))})"
        ) from exc


def diverged(path: str, number: int, method: str | None, why: str) -> RecoveryError:
    """The error of a journal that cannot be replayed: the host must not start on it."""
    what = f"record {number}" + (f" ({method})" if method else "")
    return RecoveryError(
        f"journal {path}: {what} cannot be replayed: {why}. The ledger would diverge from what happened, "
        "so the controller refuses to start: move the state directory aside and restore the jobs from "
        "their checkpoints into a fresh one",
        path=path,
        record=number,
        method=method,
    )


def _pickled(path: str, number: int) -> RecoveryError:
    return RecoveryError(
        f"journal {path} was written by an older trajflight (pickled records), which this version does not "
        "read: unpickling a file can run code. Open the state directory once with the trajflight release "
        "that wrote it (its start folds the journal into a new snapshot and leaves an empty journal), stop "
        "it, then start this version; or move the state directory aside and restore the jobs from their "
        "checkpoints into a fresh one. The snapshot files are unaffected and stay as they are",
        path=path,
        record=number,
        method=None,
    )
