"""The wrong credentials of the refusal tables (tests/*/test_auth_table.py): one case each, the header it
sends for an operation, and the typed refusal it must get."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from trajflight.auth import Keyring, Role
from trajflight.errors import AuthenticationError, PermissionDeniedError, TrajflightError

ROLES_BUT_ADMIN = frozenset(Role) - {Role.ADMIN}


@dataclass(frozen=True)
class Case:
    """One wrong credential."""

    name: str
    error: type[TrajflightError]
    reason: str
    says: str  # what the refusal's message says


CASES = [
    Case("no credentials", AuthenticationError, "missing", "no credential"),
    Case("malformed token", AuthenticationError, "malformed", "credential is malformed"),
    Case("bad signature", AuthenticationError, "bad_signature", "signature does not verify"),
    Case("expired", AuthenticationError, "expired", "credential expired"),
    Case("revoked key", AuthenticationError, "revoked", "revoked or unknown key"),
    Case("wrong job", PermissionDeniedError, "job", "outside the credential's jobs"),
    Case("wrong role", PermissionDeniedError, "role", "needs role"),
]


def header(
    case: Case, allowed: Sequence[Role], ring: Keyring, secret: str, wrong: Role | None = None
) -> str | None:
    """The ``authorization`` value ``case`` sends for an operation that takes the roles ``allowed`` (job
    ``job-a``), with keys ``ring`` made of ``secret`` (kid ``k1``); None sends no header. ``wrong``: the
    role of the wrong-role case (default: the first role the operation does not take)."""
    right = allowed[0]
    if case.name == "no credentials":
        return None
    if case.name == "malformed token":
        return "Bearer not.a-token"
    if case.name == "bad signature":
        return "Bearer " + Keyring.from_secret("k1:another-secret-0123456789ab").mint("x", right).reveal()
    if case.name == "expired":
        return "Bearer " + ring.mint("x", right, ttl=60, now=time.time() - 3600).reveal()
    if case.name == "revoked key":
        return "Bearer " + Keyring.from_secret("k0:" + secret.split(":", 1)[1]).mint("x", right).reveal()
    if case.name == "wrong job":
        return "Bearer " + ring.mint("x", right, ["job-b"]).reveal()
    role = wrong if wrong is not None else sorted(ROLES_BUT_ADMIN - set(allowed))[0]
    return "Bearer " + ring.mint("x", role, ["job-a"]).reveal()


def check_refusal(
    refused: TrajflightError, case: Case, value: str | None, *, reason_lost: bool = False
) -> None:
    """The refusal is the case's: its reason (None where the transport lost the fields), its message
    naming what was wrong, never the token."""
    assert getattr(refused, "reason", None) in ((case.reason, None) if reason_lost else (case.reason,))
    assert case.says in str(refused)
    if value is not None:
        assert value.split(" ", 1)[1] not in str(refused)
