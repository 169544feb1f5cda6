"""Bearer-token authentication of Flight endpoints: the server middleware, and the client's header.

Every Flight server of an authenticated deployment (the storage servers, the controller's endpoint)
installs :func:`server_middleware`: its factory verifies the ``authorization: Bearer <token>`` header of
every call with the deployment's :class:`~trajflight.auth.Keyring` before any handler runs (a call
without a valid token is refused with :class:`~trajflight.errors.AuthenticationError`, nothing read), and
keeps the token's claims for the handler, which checks the operation's role and jobs
(:func:`~trajflight.auth.authorize`) against them (:func:`call_claims`).

:func:`check_bind` is the safe default of every server constructor: a non-loopback address without a
secret is refused unless the operator says ``insecure``.

It does not check roles itself (the handler knows the operation and its jobs) and keeps no state between
calls; the token is never logged nor put in an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow.flight as flight

from trajflight.auth import Claims, Credential, Keyring, bearer_header, is_loopback, parse_bearer
from trajflight.errors import ConfigError, TrajflightError
from trajflight.flight_server._errors import to_flight_error

__all__ = [
    "MIDDLEWARE_KEY",
    "CredentialSource",
    "call_claims",
    "call_headers",
    "check_bind",
    "credential_source",
    "server_middleware",
]

MIDDLEWARE_KEY = "trajflight-auth"
"""The name the middleware is installed under (``context.get_middleware``)."""

CredentialSource = Callable[[], Credential | None]
"""What a client asks, per call, for the credential to send (None: send none)."""


class _Authenticated(flight.ServerMiddleware):  # type: ignore[misc]  # pyarrow ships no type stubs
    """The verified claims of one call."""

    def __init__(self, claims: Claims) -> None:
        super().__init__()
        self.claims = claims


class _AuthFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    def __init__(self, keyring: Keyring, on_refusal: Callable[[str], None] | None) -> None:
        super().__init__()
        self.keyring = keyring
        self.on_refusal = on_refusal

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[str]]) -> _Authenticated:
        try:
            return _Authenticated(self.keyring.verify(parse_bearer(headers.get("authorization"))))
        except TrajflightError as exc:
            if self.on_refusal is not None:  # refused before any handler: the handlers' metrics never see it
                self.on_refusal("unauthenticated")
            raise to_flight_error(exc) from None


def server_middleware(
    keyring: Keyring | None, on_refusal: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """The ``middleware=`` argument of a ``FlightServerBase``: token checks with ``keyring``, none without.

    ``on_refusal`` is called with ``"unauthenticated"`` for each call refused for its credential (the
    refusal metrics' hook)."""
    return {} if keyring is None else {MIDDLEWARE_KEY: _AuthFactory(keyring, on_refusal)}


def call_claims(context: flight.ServerCallContext) -> Claims | None:
    """The verified claims of the call (None where the server runs without authentication)."""
    found = context.get_middleware(MIDDLEWARE_KEY)
    claims: Claims | None = None if found is None else found.claims
    return claims


def credential_source(credential: Credential | CredentialSource | None) -> CredentialSource | None:
    """What a client asks per call: a fixed credential, a callable (a refreshing token) or nothing."""
    if isinstance(credential, Credential):
        fixed = credential
        return lambda: fixed
    return credential


def call_headers(source: CredentialSource | None) -> list[tuple[bytes, bytes]]:
    """The headers of one client call: the bearer token of ``source``'s current credential, if any."""
    if source is None:
        return []
    credential = source()
    return [] if credential is None else [bearer_header(credential)]


def check_bind(host: str, keyring: Keyring | None, *, insecure: bool, what: str) -> None:
    """Refuse to serve a non-loopback ``host`` without authentication, unless ``insecure``.

    Raises:
        ConfigError: ``host`` is not loopback, no secret is configured and ``insecure`` is false.
    """
    if keyring is None and not insecure and not is_loopback(host):
        raise ConfigError(
            f"{what} would listen on {host!r} without authentication: set TRAJFLIGHT_SECRET (or "
            "--secret-file) so that every call needs a token, or pass --insecure / insecure=True to "
            "serve anyone who can reach the address",
            setting="insecure",
        )
