"""Bearer tokens of a deployment: minting, verifying, roles and job scopes (``docs/auth.md``).

One module verifies every token, whichever endpoint receives it (storage servers, the controller's Flight
endpoint, the same-host socket): a :class:`Keyring` made from the deployment secret verifies a JWT
(HS256, header ``kid``) and returns its :class:`Claims`; :func:`authorize` checks the role and the job of
one operation against them. Every refusal is an :class:`~trajflight.errors.AuthenticationError` (no,
malformed, mis-signed, expired or revoked token) or a :class:`~trajflight.errors.PermissionDeniedError`
(wrong role or job) whose message names what was wrong and never repeats the token.

Tokens travel as :class:`Credential` objects, whose ``repr`` and ``str`` hide the token, so that it never
reaches a log, an error, ``stats`` or a ``repr`` by accident.

This module does no I/O beyond reading the secret where :func:`load_keyring` is asked to, and reads the
wall clock only where no ``now`` is passed. It does not guarantee anything about a token once it is
minted: a token is valid until it expires or its key leaves the keyring (there is no revocation list).
"""

from __future__ import annotations

import argparse
import binascii
import enum
import hashlib
import hmac
import ipaddress
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import jwt

from trajflight.errors import AuthenticationError, ConfigError, PermissionDeniedError, brief

__all__ = [
    "ALL_JOBS",
    "DEFAULT_STORAGE_TTL",
    "ISSUER",
    "MIN_SECRET_BYTES",
    "Claims",
    "Credential",
    "Keyring",
    "RefreshingCredential",
    "Role",
    "Secret",
    "add_secret_arguments",
    "authorize",
    "bearer_header",
    "deployment_secret",
    "is_loopback",
    "load_keyring",
    "mint_for_client",
    "minted",
    "parse_bearer",
    "unverified_expiry",
]

ISSUER = "trajflight"
"""The ``iss`` claim of every token."""

ALL_JOBS = "*"
"""The ``jobs`` entry that scopes a token to every job."""

MIN_SECRET_BYTES = 16
"""Shortest deployment secret accepted."""

DEFAULT_STORAGE_TTL = 300.0
"""Seconds a storage token minted by the controller lives (clients refresh it before it expires)."""

_ALGORITHM = "HS256"
_KEY_LABEL = b"trajflight-token-key-v1:"
_MAX_TOKEN_CHARS = 8192
_VERIFIED_TOKENS = 4096


class Role(enum.StrEnum):
    """What a token's holder may do (``docs/auth.md`` lists the role of every operation).

    ``admin`` implies every other role.
    """

    WRITER = "writer"
    TRAINER = "trainer"
    READER = "reader"
    ADMIN = "admin"


class Credential:
    """A bearer token whose ``repr`` and ``str`` never show it; :meth:`reveal` is the one way to read it.

    Args:
        token: The encoded JWT.
    """

    __slots__ = ("_token",)

    def __init__(self, token: str) -> None:
        if not isinstance(token, str):
            raise ConfigError(f"a credential is a token string, got {type(token).__name__}", setting="token")
        self._token = token.strip()

    def reveal(self) -> str:
        """The token itself, to put in an ``authorization`` header; never log it."""
        return self._token

    def __repr__(self) -> str:
        return "Credential(<hidden>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Credential) and hmac.compare_digest(self._token, other._token)

    def __hash__(self) -> int:
        return hash(self._token)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Credential, (self._token,))


class Secret:
    """A deployment secret's text, whose ``repr`` and ``str`` never show it (:meth:`reveal` does).

    Args:
        value: The secret (what ``TRAJFLIGHT_SECRET`` or the secret file holds).
    """

    __slots__ = ("_value",)

    def __init__(self, value: bytes | str) -> None:
        self._value = value.decode() if isinstance(value, bytes) else str(value)

    def reveal(self) -> str:
        """The secret itself, to hand to a process that serves with it (through its environment)."""
        return self._value

    def keyring(self, *, clock: Callable[[], float] = time.time) -> Keyring:
        """The keyring of this secret (:meth:`Keyring.from_secret`)."""
        return Keyring.from_secret(self._value, clock=clock)

    def __repr__(self) -> str:
        return "Secret(<hidden>)"

    __str__ = __repr__

    def __reduce__(self) -> tuple[Any, ...]:
        return (Secret, (self._value,))


def deployment_secret(
    secret: Secret | bytes | str | None = None,
    secret_file: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> Secret | None:
    """The deployment secret: ``secret`` if given, else ``secret_file``'s content, else
    ``TRAJFLIGHT_SECRET``; None when none is set. The result is checked (a keyring can be made of it).

    Raises:
        ConfigError: an unreadable file, or a secret too short.
    """
    if secret is None and secret_file is not None:
        try:
            with open(secret_file, "rb") as f:
                secret = f.read()
        except OSError as exc:
            raise ConfigError(
                f"--secret-file: cannot read {os.fspath(secret_file)!r}: {exc.strerror}",
                setting="secret-file",
            ) from None
    if secret is None:
        secret = (os.environ if environ is None else environ).get("TRAJFLIGHT_SECRET") or None
    if secret is None:
        return None
    found = secret if isinstance(secret, Secret) else Secret(secret)
    found.keyring()  # refuse a short or empty secret here, where it is configured
    return found


@dataclass(frozen=True, slots=True)
class Claims:
    """What a verified token says.

    Attributes:
        sub: Who holds it (free-form: a worker, a trainer, an operator).
        role: Its :class:`Role`.
        jobs: The job ids it may act on; ``("*",)`` is every job.
        iat: Issued at (Unix seconds).
        exp: Expires at (Unix seconds).
        jti: Unique id of the token.
        kid: The key id it was signed with.
    """

    sub: str
    role: Role
    jobs: tuple[str, ...]
    iat: float
    exp: float
    jti: str
    kid: str

    def has_role(self, roles: Iterable[Role]) -> bool:
        """Whether this token's role is one of ``roles`` (admin has every role)."""
        return self.role is Role.ADMIN or self.role in set(roles)

    def covers(self, job_id: str) -> bool:
        """Whether this token may act on ``job_id``."""
        return ALL_JOBS in self.jobs or job_id in self.jobs

    @property
    def all_jobs(self) -> bool:
        """Whether this token is scoped to every job."""
        return ALL_JOBS in self.jobs

    def check_fresh(self, now: float | None = None) -> None:
        """Raise AuthenticationError (``reason="expired"``) when the token has expired at ``now``."""
        now = time.time() if now is None else now
        if now >= self.exp:
            raise _expired(self.exp, now)


def _expired(exp: float, now: float) -> AuthenticationError:
    return AuthenticationError(
        f"the credential expired {now - exp:.0f}s ago; mint a fresh one (`trajflight token`) or let the "
        "client refresh its storage token from the controller",
        reason="expired",
    )


def _derive(secret: bytes, kid: str) -> bytes:
    """The HS256 key of ``kid``: HMAC-SHA256 of the secret, so that every key is 32 bytes and bound to
    its id."""
    return hmac.new(secret, _KEY_LABEL + kid.encode(), hashlib.sha256).digest()


def _kid_of(secret: bytes) -> str:
    return hashlib.sha256(b"trajflight-kid:" + secret).hexdigest()[:12]


class Keyring:
    """The keys of a deployment: ``kid -> secret``; the first one signs, every one verifies.

    A token whose ``kid`` is not in the keyring is refused as revoked or unknown: rotating is adding a
    new first key, waiting for the old key's tokens to expire (or re-minting them), then dropping it.

    Args:
        keys: ``(kid, secret)`` pairs, the signing key first; each secret at least
            :data:`MIN_SECRET_BYTES` long.
        clock: The wall clock (Unix seconds) used where no ``now`` is passed.

    Raises:
        ConfigError: no key, a short secret, or a kid given twice.
    """

    __slots__ = ("_clock", "_keys", "_verified", "signing_kid")

    def __init__(self, keys: Iterable[tuple[str, bytes]], *, clock: Callable[[], float] = time.time) -> None:
        self._keys: dict[str, bytes] = {}
        for kid, secret in keys:
            if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
                raise ConfigError(
                    f"the deployment secret must be at least {MIN_SECRET_BYTES} bytes; generate 32 random "
                    "bytes (python -c 'import secrets; print(secrets.token_hex(32))')",
                    setting="secret",
                )
            if not kid or kid in self._keys:
                raise ConfigError(f"key id {brief(kid)} is empty or given twice", setting="secret")
            self._keys[kid] = _derive(secret, kid)
        if not self._keys:
            raise ConfigError("a keyring needs at least one key", setting="secret")
        self.signing_kid = next(iter(self._keys))
        self._clock = clock
        # Tokens whose signature verified, with their claims: a client sends one token for many calls,
        # and decoding a JWT costs ~100 us in Python. Only the expiry is re-checked per call; a keyring
        # never changes, so no entry outlives its key.
        self._verified: dict[str, Claims] = {}

    @classmethod
    def from_secret(cls, secret: bytes | str, *, clock: Callable[[], float] = time.time) -> Keyring:
        """The keyring of a secret's text: one entry per line (or comma-separated), each ``KID:SECRET``
        or a bare ``SECRET`` (its kid derived from it); the first entry signs.

        Raises:
            ConfigError: an empty or short secret.
        """
        text = secret.decode("utf-8", errors="strict") if isinstance(secret, bytes) else secret
        entries = [e.strip() for line in text.splitlines() for e in line.split(",") if e.strip()]
        keys = []
        for entry in entries:
            kid, sep, value = entry.partition(":")
            if sep and kid and value and len(kid) <= 64 and kid.replace("-", "").replace("_", "").isalnum():
                keys.append((kid, value.encode()))
            else:
                keys.append((_kid_of(entry.encode()), entry.encode()))
        return cls(keys, clock=clock)

    def __repr__(self) -> str:
        return f"Keyring(kids={list(self._keys)!r}, signing={self.signing_kid!r})"

    @property
    def kids(self) -> tuple[str, ...]:
        """The key ids this keyring accepts, the signing one first."""
        return tuple(self._keys)

    def now(self) -> float:
        """The keyring's clock."""
        return self._clock()

    def mint(
        self,
        sub: str,
        role: Role | str,
        jobs: Iterable[str] = (ALL_JOBS,),
        *,
        ttl: float = DEFAULT_STORAGE_TTL,
        now: float | None = None,
    ) -> Credential:
        """A token for ``sub`` with ``role`` on ``jobs``, valid ``ttl`` seconds from ``now``.

        Raises:
            ConfigError: an unknown role, no job, or a ttl that is not positive.
        """
        try:
            role = Role(role)
        except ValueError:
            raise ConfigError(
                f"unknown role {brief(role)}; use one of {', '.join(r.value for r in Role)}", setting="role"
            ) from None
        jobs = tuple(jobs)
        if not jobs or not all(isinstance(j, str) and j for j in jobs):
            raise ConfigError("a token needs at least one job id (or '*' for every job)", setting="jobs")
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < 10 * 365 * 86400:
            raise ConfigError(f"ttl must be a positive number of seconds, got {brief(ttl)}", setting="ttl")
        now = self._clock() if now is None else now
        claims = {
            "iss": ISSUER,
            "sub": str(sub),
            "role": role.value,
            "jobs": list(jobs),
            "iat": int(now),
            "exp": int(now) + ttl,  # the life is exactly ttl, ending no later than now + ttl
            "jti": uuid.uuid4().hex,
        }
        token = jwt.encode(
            claims, self._keys[self.signing_kid], algorithm=_ALGORITHM, headers={"kid": self.signing_kid}
        )
        return Credential(token)

    def verify(self, token: Credential | str | None, *, now: float | None = None) -> Claims:
        """The claims of a token this keyring's keys signed, unexpired at ``now``.

        Raises:
            AuthenticationError: no token, a malformed one, a bad signature, an expired token, or one
                signed by a key not in this keyring (revoked or unknown); ``reason`` says which.
        """
        raw = token.reveal() if isinstance(token, Credential) else token
        known = self._verified.get(raw) if isinstance(raw, str) else None
        if known is not None:
            known.check_fresh(self._clock() if now is None else now)
            return known
        if not raw:
            raise AuthenticationError(
                "no credential: this endpoint requires a bearer token (authorization: Bearer <token>); "
                "pass token= to connect() or set TRAJFLIGHT_TOKEN (an operator mints one with "
                "`trajflight token --role ROLE --job JOB`)",
                reason="missing",
            )
        if not isinstance(raw, str) or len(raw) > _MAX_TOKEN_CHARS:
            raise _malformed("it is not a token string of at most 8192 characters")
        try:
            header = jwt.get_unverified_header(raw)
        except jwt.PyJWTError:
            raise _malformed("it is not a JWT (header.payload.signature)") from None
        kid = header.get("kid")
        if header.get("alg") != _ALGORITHM or not isinstance(kid, str):
            raise _malformed(f"its header must name alg {_ALGORITHM} and a kid")
        key = self._keys.get(kid)
        if key is None:
            raise AuthenticationError(
                f"the credential was signed by key {brief(kid)}, which this deployment does not accept "
                "(revoked or unknown key); mint a fresh credential with the current secret",
                reason="revoked",
            )
        try:
            payload = jwt.decode(
                raw,
                key,
                algorithms=[_ALGORITHM],
                issuer=ISSUER,
                options={
                    "verify_exp": False,  # checked below against ``now`` (a fake clock in tests)
                    "verify_iat": False,
                    "verify_nbf": False,
                    "require": ["iss", "sub", "role", "jobs", "iat", "exp", "jti"],
                },
            )
        except jwt.InvalidSignatureError:
            raise AuthenticationError(
                "the credential's signature does not verify: it was not minted with this deployment's "
                "secret (or was altered); mint one with the secret the servers use",
                reason="bad_signature",
            ) from None
        except jwt.PyJWTError as exc:
            raise _malformed(type(exc).__name__) from None
        claims = _claims(payload, kid)
        claims.check_fresh(self._clock() if now is None else now)
        if len(self._verified) >= _VERIFIED_TOKENS:
            self._verified.clear()  # bounded: a flood of distinct tokens costs their decoding only
        self._verified[raw] = claims
        return claims


def _malformed(why: str) -> AuthenticationError:
    return AuthenticationError(
        f"the credential is malformed ({why}); use a token from `trajflight token` or from the controller",
        reason="malformed",
    )


def _claims(payload: Mapping[str, Any], kid: str) -> Claims:
    role, jobs, exp, iat = payload.get("role"), payload.get("jobs"), payload.get("exp"), payload.get("iat")
    if not isinstance(role, str) or role not in {r.value for r in Role}:
        raise _malformed(f"unknown role {brief(role)}")
    if not isinstance(jobs, list) or not jobs or not all(isinstance(j, str) and j for j in jobs):
        raise _malformed("jobs must be a list of job ids")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (exp, iat)):
        raise _malformed("iat and exp must be numbers")
    issued, expires = cast(float, iat), cast(float, exp)  # checked numbers just above
    return Claims(str(payload["sub"]), Role(role), tuple(jobs), issued, expires, str(payload["jti"]), kid)


def authorize(claims: Claims | None, operation: str, roles: Iterable[Role], jobs: Iterable[str] = ()) -> None:
    """Check that ``claims`` may run ``operation``, which needs one of ``roles``, on every job in ``jobs``.

    ``claims`` None means the endpoint runs without authentication (a loopback deployment without a
    secret): everything is allowed.

    Raises:
        PermissionDeniedError: the role is not one of ``roles`` (``reason="role"``) or a job is outside
            the token's scope (``reason="job"``).
    """
    if claims is None:
        return
    roles = tuple(roles)
    if not claims.has_role(roles):
        needed = " or ".join(r.value for r in roles) or "admin"
        raise PermissionDeniedError(
            f"{operation} needs role {needed}; the credential of {brief(claims.sub)} has role "
            f"{claims.role.value}; ask the operator for a credential with that role",
            reason="role",
            operation=operation,
        )
    if claims.all_jobs:
        return
    for job_id in jobs:
        if not claims.covers(job_id):
            raise PermissionDeniedError(
                f"{operation} on job {brief(job_id)} is outside the credential's jobs "
                f"{brief(list(claims.jobs))}; ask the operator for a credential scoped to that job",
                reason="job",
                operation=operation,
            )


def parse_bearer(values: Iterable[str] | None) -> str | None:
    """The token of an ``authorization`` header's values (``Bearer <token>``); None when absent.

    Raises:
        AuthenticationError: a header that is not ``Bearer <token>`` (``reason="malformed"``).
    """
    values = list(values or ())
    if not values:
        return None
    scheme, _, token = str(values[0]).partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _malformed("the authorization header must be 'Bearer <token>'")
    return token.strip()


def bearer_header(credential: Credential) -> tuple[bytes, bytes]:
    """The ``(b"authorization", b"Bearer <token>")`` header of a Flight call."""
    return (b"authorization", b"Bearer " + credential.reveal().encode())


def unverified_expiry(credential: Credential) -> float | None:
    """The ``exp`` a token claims, read without verifying it (a client has no key; for refreshing only).
    None when it is not a readable token."""
    try:
        part = credential.reveal().split(".")[1]
        exp = json.loads(jwt.utils.base64url_decode(part.encode())).get("exp")
    except (IndexError, ValueError, TypeError, AttributeError, binascii.Error):
        return None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


class RefreshingCredential:
    """A credential that renews itself: :meth:`current` returns a token with at least ``margin`` of its
    life left, fetching a new one with ``fetch`` when the one held is closer to its expiry.

    Args:
        fetch: Returns a fresh credential (a controller's ``token`` call); called under a lock.
        margin: Fraction of a token's life (0..1) left at which it is replaced; 0.5 by default.
        clock: The wall clock.
    """

    def __init__(
        self,
        fetch: Callable[[], Credential],
        *,
        margin: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._fetch = fetch
        self._margin = margin
        self._clock = clock
        self._lock = threading.Lock()
        self._held: Credential | None = None
        self._renew_at = 0.0

    def __repr__(self) -> str:
        return "RefreshingCredential(<hidden>)"

    def current(self) -> Credential:
        """A credential valid for a while yet (fetching one if needed)."""
        with self._lock:
            now = self._clock()
            if self._held is None or now >= self._renew_at:
                fresh = self._fetch()
                exp = unverified_expiry(fresh)
                life = 0.0 if exp is None else exp - now
                self._held, self._renew_at = fresh, now + max(0.0, life * (1 - self._margin))
            return self._held

    def __call__(self) -> Credential:
        """The same as :meth:`current` (a credential source of a client)."""
        return self.current()


def minted(
    keyring: Keyring | None, sub: str, role: Role = Role.ADMIN, *, ttl: float = DEFAULT_STORAGE_TTL
) -> RefreshingCredential | None:
    """Tokens of ``role`` for ``sub`` minted in this process from ``keyring`` (refreshed before they
    expire): how a host that holds the secret authenticates its own calls. None without a keyring."""
    if keyring is None:
        return None
    return RefreshingCredential(lambda: keyring.mint(sub, role, ttl=ttl))


def mint_for_client(
    keyring: Keyring | None,
    role: Role | str = Role.ADMIN,
    jobs: Iterable[str] | None = None,
    *,
    ttl: float = 3600.0,
    sub: str = "",
) -> Credential:
    """A plane's credential for another process's ``trajflight.connect(address, token=...)`` (what
    ``trajflight token`` mints from the same secret): ``role`` on ``jobs`` (None or empty: every job)
    for ``sub`` (default ``"<role>-client"``), valid ``ttl`` seconds. ``LocalCluster.mint`` and
    ``RayCluster.mint`` are this with their plane's keyring.

    Raises:
        ConfigError: no keyring (the plane has no deployment secret: it takes no tokens), or a bad role,
            job or ttl.
    """
    if keyring is None:
        raise ConfigError(
            "this cluster has no deployment secret: it takes no tokens (start it with secret= or "
            "TRAJFLIGHT_SECRET)",
            setting="secret",
        )
    return keyring.mint(sub or f"{role}-client", role, list(jobs or ()) or [ALL_JOBS], ttl=ttl)


def load_keyring(
    secret_file: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
) -> Keyring | None:
    """The deployment keyring from ``secret_file`` or else ``TRAJFLIGHT_SECRET``; None when neither is set.

    Raises:
        ConfigError: the file cannot be read, or the secret is too short.
    """
    secret = deployment_secret(None, secret_file, environ=environ)
    return None if secret is None else secret.keyring(clock=clock)


def add_secret_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """Register ``--secret-file`` and ``--insecure`` on a command that serves ``what``."""
    parser.add_argument(
        "--secret-file",
        default=None,
        help="file holding the deployment secret (else TRAJFLIGHT_SECRET): every call then needs a token",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help=f"serve {what} on a non-loopback --host without a secret (anyone reaching it may do anything)",
    )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback interface (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
