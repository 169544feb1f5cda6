"""The one error family of trajflight.

Every error a user can hit derives from :class:`TrajflightError`. Each subclass has a stable ``code``
(a short string) that the Flight layer puts on the wire and maps back to the same class on the client,
so ``except StaleFenceError`` works the same in-process, across Flight and across Ray.

This module imports nothing but the standard library, so every layer (codec, controller, storage
server) can raise these without importing the others.

It does not guarantee that an error raised in one process carries its traceback into another: only the
class, the message and the structured fields (``column``, ``row``, ``retry_after``) travel.
"""

from __future__ import annotations

import reprlib
from typing import Any, ClassVar

__all__ = [
    "ECHO_CHARS",
    "AlreadyExistsError",
    "ArchiveError",
    "AuthenticationError",
    "CapacityExceededError",
    "CheckpointError",
    "ConfigError",
    "DeadlineExceededError",
    "InvalidRequestError",
    "InvalidStateError",
    "LeaseExpiredError",
    "NotFoundError",
    "PermissionDeniedError",
    "RecoveryError",
    "SchemaError",
    "StaleFenceError",
    "TrajflightError",
    "UnavailableError",
    "brief",
    "error_class_for_code",
]

ECHO_CHARS = 100
"""Most characters of a caller's input an error message repeats."""

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, ECHO_CHARS, ECHO_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 4


def brief(value: object) -> str:
    """``repr(value)`` cut to about :data:`ECHO_CHARS` characters, for error messages.

    Never echoes unbounded caller input (a 10 MB name, a 100k-deep list): long strings and containers
    are cut, and the length of a cut string is given instead.
    """
    if isinstance(value, str | bytes) and len(value) > ECHO_CHARS:
        return f"{value[:ECHO_CHARS]!r}... ({len(value)} {'chars' if isinstance(value, str) else 'bytes'})"
    try:
        text = _REPR.repr(value)
    except Exception:  # a hostile __repr__: name the type only
        text = f"<{type(value).__name__}>"
    return text if len(text) <= ECHO_CHARS + 20 else text[: ECHO_CHARS + 20] + "..."


class TrajflightError(Exception):
    """Root of every error trajflight raises on purpose.

    Args:
        message: What went wrong and what to do next.
        **fields: Structured details (for example ``column``, ``row``, ``retry_after``); they are kept as
            attributes, survive pickling (Ray) and are carried across Flight.
    """

    code: ClassVar[str] = "trajflight"

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = dict(fields)
        for key, value in fields.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Default exception pickling replays ``args`` only and would drop the keyword fields.
        return (_rebuild, (type(self), self.message, self.fields))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[TrajflightError], message: str, fields: dict[str, Any]) -> TrajflightError:
    return cls(message, **fields)


class SchemaError(TrajflightError):
    """Data does not match the trajectory schema: a missing column, a wrong type, ragged lengths that
    disagree, values out of range or samples of different groups. ``column`` and ``row`` (when known)
    name the offending place."""

    code = "schema"
    column: str | None
    row: int | None

    def __init__(
        self, message: str, *, column: str | None = None, row: int | None = None, **fields: Any
    ) -> None:
        super().__init__(message, column=column, row=row, **fields)


class StaleFenceError(TrajflightError):
    """A write, read or lease operation carried a fencing token (epoch or lease generation) older than
    the newest one seen. The caller is a zombie: stop and re-acquire."""

    code = "stale_fence"


class LeaseExpiredError(TrajflightError):
    """The lease ran out before the operation; its groups went back to READY or to UNKNOWN."""

    code = "lease_expired"


class CapacityExceededError(TrajflightError):
    """Storing more would exceed the bounded capacity. ``retry_after`` (seconds) hints when to retry."""

    code = "capacity"
    retry_after: float

    def __init__(self, message: str, *, retry_after: float = 1.0, **fields: Any) -> None:
        super().__init__(message, retry_after=retry_after, **fields)


class NotFoundError(TrajflightError):
    """The job, group, lease or partition named does not exist (or no longer exists)."""

    code = "not_found"


class AlreadyExistsError(TrajflightError):
    """The partition is already stored; trajflight never overwrites a group."""

    code = "already_exists"


class InvalidStateError(TrajflightError):
    """A compare-and-set transition found the group in another state than the one expected."""

    code = "invalid_state"


class InvalidRequestError(TrajflightError):
    """A request is malformed: bad arguments, garbage or unknown-version wire messages."""

    code = "invalid_request"


class ConfigError(InvalidRequestError):
    """A configuration value is unsupported or contradicts another; ``setting`` names it."""

    code = "config"


class CheckpointError(InvalidRequestError):
    """A checkpoint file is truncated, corrupt (checksum mismatch), of another format version, or does
    not belong to the job it is restored into. Nothing was restored; ``path`` names the file when known."""

    code = "checkpoint"


class RecoveryError(CheckpointError):
    """A controller's crash recovery found its journal inconsistent with its snapshot: a record that
    succeeded when it was journaled fails on replay, or a record in the middle of the journal is corrupt.
    The host refuses to start rather than run on a ledger that diverged from what happened. ``path``
    names the journal, ``record`` the record (1-based), ``method`` its operation when known."""

    code = "recovery"


class DeadlineExceededError(TrajflightError):
    """A call did not complete before its deadline."""

    code = "deadline"


class UnavailableError(TrajflightError):
    """A server or the controller could not be reached."""

    code = "unavailable"


class ArchiveError(TrajflightError):
    """The archive of trained groups could not be written (a full, read-only or unreachable target).

    The groups it concerns stay on their storage servers and on the GC list, retried with back-off;
    nothing is deleted unarchived. ``location`` names the archive."""

    code = "archive"


class AuthenticationError(TrajflightError):
    """The call carried no credential, or one that does not verify: malformed, signed with another
    secret, expired, or signed by a key the deployment no longer accepts. ``reason`` is one of
    ``missing``, ``malformed``, ``bad_signature``, ``expired``, ``revoked`` (None where a transport lost
    the fields; the message names it too). Nothing was done."""

    code = "unauthenticated"
    reason: str | None

    def __init__(self, message: str, *, reason: str | None = None, **fields: Any) -> None:
        super().__init__(message, reason=reason, **fields)


class PermissionDeniedError(TrajflightError):
    """The credential verifies but does not allow this operation: another role, or a job outside its
    scope. ``reason`` is ``role`` or ``job``; ``operation`` names the operation (None where a transport
    lost the fields). Nothing was done."""

    code = "permission_denied"
    reason: str | None
    operation: str | None

    def __init__(
        self, message: str, *, reason: str | None = None, operation: str | None = None, **fields: Any
    ) -> None:
        super().__init__(message, reason=reason, operation=operation, **fields)


def _all_subclasses(cls: type[TrajflightError]) -> list[type[TrajflightError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_subclasses(sub))
    return out


def error_class_for_code(code: str) -> type[TrajflightError]:
    """Return the error class whose ``code`` is ``code``; unknown codes map to :class:`TrajflightError`."""
    for cls in _all_subclasses(TrajflightError):
        if cls.code == code:
            return cls
    return TrajflightError
