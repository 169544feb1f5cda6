"""Why a request was refused, as one short label: the ``reason`` of the refusal metrics.

:func:`refusal_reason` names the reason of a :class:`~trajflight.errors.TrajflightError` a server or the
controller refused a call with, or returns ``None`` for errors that are no refusal of the caller's
standing (bad input, a missing group, an internal failure). The two authentication reasons are counted
by the code that checks credentials, through the metrics' ``count_refusal(reason)`` hook; errors whose
``code`` names them are classified here too.

Standard library only (a base module).
"""

from __future__ import annotations

from trajflight.errors import (
    CapacityExceededError,
    InvalidRequestError,
    LeaseExpiredError,
    StaleFenceError,
    TrajflightError,
)

__all__ = ["REFUSAL_REASONS", "check_reason", "refusal_reason"]

REFUSAL_REASONS = (
    "stale_token",
    "fenced_epoch",
    "lease_expired",
    "capacity",
    "unauthenticated",
    "wrong_role",
)
"""Every value of the ``reason`` label, each exported (at 0) from the start."""

_BY_CODE = {
    "unauthenticated": "unauthenticated",
    "unauthorized": "unauthenticated",
    "wrong_role": "wrong_role",
    "forbidden": "wrong_role",
    "permission_denied": "wrong_role",
}


def refusal_reason(exc: BaseException) -> str | None:
    """The refusal label of ``exc`` (one of :data:`REFUSAL_REASONS`), or ``None``.

    A :class:`~trajflight.errors.StaleFenceError` is ``fenced_epoch`` when it concerns an epoch (its
    fields name ``min_epoch``, or an ``epoch`` and no token or generation), else ``stale_token``.
    """
    if isinstance(exc, StaleFenceError):
        fields = exc.fields
        if "min_epoch" in fields or (
            "epoch" in fields and "token" not in fields and "generation" not in fields
        ):
            return "fenced_epoch"
        return "stale_token"
    if isinstance(exc, LeaseExpiredError):
        return "lease_expired"
    if isinstance(exc, CapacityExceededError):
        return "capacity"
    if isinstance(exc, TrajflightError):
        return _BY_CODE.get(exc.code)
    return None


def check_reason(reason: str) -> str:
    """``reason`` when it is one of :data:`REFUSAL_REASONS`.

    Raises:
        InvalidRequestError: any other value (a typo would otherwise make a new, never-graphed series).
    """
    if reason not in REFUSAL_REASONS:
        raise InvalidRequestError(
            f"unknown refusal reason {reason[:40]!r}; use one of {', '.join(REFUSAL_REASONS)}",
            field="reason",
        )
    return reason
