"""The error table: each trajflight error class <-> one ``pyarrow.flight`` error type at the wire.

On the server, :func:`to_flight_error` turns a :class:`~trajflight.errors.TrajflightError` into the Flight
error of :data:`WIRE_ERRORS`, with the message prefixed ``[trajflight:<code>]`` (what a bare Flight client
sees) and ``extra_info`` holding ``{"v": 1, "code": ..., "message": ..., "fields": {...}}`` (checked to
survive the wire on pyarrow 26 for every Flight error type). On the client, :func:`from_flight_error`
rebuilds the same class with the same message and fields; an error without trajflight details (a
deadline hit by the client, a refused connection) maps by its Flight type.

Several classes share one Flight type (Flight has seven); the ``code`` disambiguates. This module does
not guarantee that fields which are not JSON-serialisable travel: they are sent as their ``repr``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from trajflight.errors import (
    AlreadyExistsError,
    AuthenticationError,
    CapacityExceededError,
    ConfigError,
    DeadlineExceededError,
    InvalidRequestError,
    InvalidStateError,
    LeaseExpiredError,
    NotFoundError,
    PermissionDeniedError,
    SchemaError,
    StaleFenceError,
    TrajflightError,
    UnavailableError,
    error_class_for_code,
)

__all__ = ["WIRE_ERRORS", "from_flight_error", "server_errors", "to_flight_error", "translate_errors"]

log = logging.getLogger("trajflight.flight_server")

WIRE_ERRORS: dict[type[TrajflightError], type[flight.FlightError]] = {
    StaleFenceError: flight.FlightUnauthorizedError,
    LeaseExpiredError: flight.FlightUnauthorizedError,
    AuthenticationError: flight.FlightUnauthenticatedError,
    PermissionDeniedError: flight.FlightUnauthorizedError,
    CapacityExceededError: flight.FlightUnavailableError,
    UnavailableError: flight.FlightUnavailableError,
    DeadlineExceededError: flight.FlightTimedOutError,
    NotFoundError: flight.FlightServerError,
    AlreadyExistsError: flight.FlightServerError,
    SchemaError: flight.FlightServerError,
    InvalidStateError: flight.FlightServerError,
    InvalidRequestError: flight.FlightServerError,
    ConfigError: flight.FlightServerError,
    TrajflightError: flight.FlightInternalError,
}
"""trajflight class -> Flight error type raised at the wire (the table the tests check)."""

# Flight errors that carry no trajflight details: mapped by type alone. A cancelled call (the server
# or controller shutting down or restarting cancels the calls it cannot finish) means the peer went away:
# retrying, or reconnecting, is what helps, as for an unreachable one.
_BY_FLIGHT_TYPE: tuple[tuple[type[Exception], type[TrajflightError]], ...] = (
    (flight.FlightTimedOutError, DeadlineExceededError),
    (flight.FlightUnauthenticatedError, AuthenticationError),
    (flight.FlightUnauthorizedError, PermissionDeniedError),
    (flight.FlightUnavailableError, UnavailableError),
    (flight.FlightCancelledError, UnavailableError),
    (pa.ArrowCancelled, UnavailableError),
    (flight.FlightWriteSizeExceededError, InvalidRequestError),
)
# The same failures where they surface untyped (a generic ArrowException, FlightInternalError or OSError
# whose text carries gRPC's status): the peer went away mid-call.
_PEER_GONE = re.compile(
    r"\b(?:CANCELLED|UNAVAILABLE)\b|Stream removed|Socket closed|Connection reset|Broken pipe|GOAWAY|"
    r"failed to connect|Connection refused",
    re.IGNORECASE,
)
_DETAIL_CHARS = 300

# Anywhere in the text: pyarrow prefixes some errors ("Unknown error: ..." from a get_schema handler,
# whose Flight type pyarrow does not carry; apache/arrow#43556 for the client side of get_schema).
_PREFIX = re.compile(r"\[trajflight:([a-z_]+)\] ")
_EXTRA_VERSION = 1


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


_MAX_MESSAGE_CHARS = 1500
_MAX_FIELD_CHARS = 1100  # a job id (at most 1024 characters on the wire) fits whole
_MAX_EXTRA_BYTES = 6000
# The message travels twice (grpc-message and extra_info, in gRPC trailers); past ~10 KB of trailers the
# client gets an untyped RESOURCE_EXHAUSTED instead of the error, so both are bounded here, whatever the
# raiser put in them.


def _bounded(value: Any) -> Any:
    value = _jsonable(value)
    if isinstance(value, str) and len(value) > _MAX_FIELD_CHARS:
        return value[: _MAX_FIELD_CHARS - 3] + "..."
    return value


def to_flight_error(exc: TrajflightError) -> flight.FlightError:
    """Build the Flight error that carries ``exc`` to the client (class, message, fields).

    The message is cut to 1500 characters and string fields to 1100; fields are dropped where they would
    still make the error too large to cross gRPC (the message always travels)."""
    flight_type = WIRE_ERRORS.get(type(exc))
    if flight_type is None:  # a subclass defined elsewhere: use its nearest mapped ancestor
        flight_type = next(WIRE_ERRORS[c] for c in type(exc).__mro__ if c in WIRE_ERRORS)
    message = exc.message
    if len(message) > _MAX_MESSAGE_CHARS:
        message = message[: _MAX_MESSAGE_CHARS - 3] + "..."
    extra = {
        "v": _EXTRA_VERSION,
        "code": exc.code,
        "message": message,
        "fields": {k: _bounded(v) for k, v in exc.fields.items()},
    }
    body = json.dumps(extra).encode()
    if len(body) > _MAX_EXTRA_BYTES:
        body = json.dumps({**extra, "fields": {}}).encode()
    return flight_type(f"[trajflight:{exc.code}] {message}", body)


def from_flight_error(exc: BaseException, what: str = "") -> TrajflightError | None:
    """Rebuild the trajflight error a server sent; None when ``exc`` is not a Flight/Arrow error.

    Errors without trajflight details map by their Flight type; a cancelled call and transport failures
    that mean the peer went away (gRPC's CANCELLED or UNAVAILABLE, a removed stream, a reset connection)
    become :class:`~trajflight.errors.UnavailableError`, whose message says to retry or reconnect.
    ``what`` names the call in those messages.

    The result is a new exception object; chain it (``raise err from exc``) to keep the gRPC detail.
    """
    if not isinstance(exc, flight.FlightError | pa.ArrowException):
        return None
    extra = getattr(exc, "extra_info", None) or b""
    if extra:
        try:
            body = json.loads(extra.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            body = None
        if isinstance(body, dict) and body.get("v") == _EXTRA_VERSION and isinstance(body.get("code"), str):
            cls = error_class_for_code(body["code"])
            raw = body.get("fields")
            fields: dict[str, Any] = raw if isinstance(raw, dict) else {}
            return _build(cls, str(body.get("message", exc)), fields)
    text = str(exc)
    match = _PREFIX.search(text)
    if match is not None:  # extra_info lost (a proxy, get_schema): the message prefix still names the class
        message = text[match.end() :].split(". Detail:", 1)[0]
        return _build(error_class_for_code(match.group(1)), message, {})
    for flight_type, cls in _BY_FLIGHT_TYPE:
        if isinstance(exc, flight_type):
            return cls(_hint(cls, text, what, cancelled=isinstance(exc, pa.ArrowCancelled)))
    if _PEER_GONE.search(text):
        return UnavailableError(_hint(UnavailableError, text, what, cancelled="cancel" in text.lower()))
    return TrajflightError(f"Flight call failed: {text}")


def _build(cls: type[TrajflightError], message: str, fields: dict[str, Any]) -> TrajflightError:
    try:
        return cls(message, **fields)
    except TypeError:  # fields the class's constructor does not take (a newer server): keep the class
        return cls(message)


def _hint(cls: type[TrajflightError], text: str, what: str = "", *, cancelled: bool = False) -> str:
    call = f"{what}: " if what else ""
    detail = text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 3] + "..."
    if cls is DeadlineExceededError:
        return f"{call}the call did not finish before its deadline; retry with a longer timeout ({detail})"
    if cls is UnavailableError and cancelled:
        return (
            f"{call}the call was cancelled: the server or controller went away mid-call (shut down or "
            f"restarting); retry, or reconnect to its new location ({detail})"
        )
    if cls is UnavailableError and _TLS_REFUSED.search(text):
        return (
            f"{call}the TLS handshake failed: this client does not trust the server's certificate, or the "
            "server does not trust this client's; pass tls= with the deployment's CA (and the client "
            "certificate and key for mutual TLS), or set TRAJFLIGHT_TLS_CA / _CERT / _KEY "
            f"({detail})"
        )
    if cls is UnavailableError and "Socket closed" in text:
        return (
            f"{call}the server closed the connection: it may have gone away, or it serves TLS and refused "
            "this connection (a grpc:// location for a grpc+tls:// server, or no client certificate where "
            "it asks for one: pass tls= or set TRAJFLIGHT_TLS_*); check that it runs, its location and "
            f"the TLS settings, then retry ({detail})"
        )
    if cls is UnavailableError:
        return (
            f"{call}the server could not be reached or went away mid-call; check that it runs and its "
            f"location, then retry or reconnect ({detail})"
        )
    return text


_TLS_REFUSED = re.compile(
    r"Ssl handshake failed|certificate verify failed|TSI_PROTOCOL_FAILURE|SSL_ERROR_SSL"
)
"""gRPC's words for a TLS handshake that failed on a certificate (either side's)."""


@contextlib.contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Client side: re-raise Flight/Arrow errors of the block as trajflight errors (chained)."""
    try:
        yield
    except TrajflightError:
        raise
    except OSError as exc:  # pyarrow's IOError: the call's stream broke under a read or a write
        match = _PREFIX.search(str(exc))
        if match is not None:  # a refusal get_schema reports as IOError (apache/arrow#43556)
            message = str(exc)[match.end() :].split(". Detail:", 1)[0]
            raise _build(error_class_for_code(match.group(1)), message, {}) from exc
        raise UnavailableError(_hint(UnavailableError, str(exc), what)) from exc
    except (flight.FlightError, pa.ArrowException) as exc:
        err = from_flight_error(exc, what)
        if (
            err is not None
            and type(err) is TrajflightError
            and not err.fields
            and "[trajflight:" not in str(exc)
        ):
            err = TrajflightError(f"{what}: {err.message}")  # no server details: say which call failed
        if err is None:  # pragma: no cover - from_flight_error handles every Flight/Arrow error
            raise
        raise err from exc


def _cut(exc: BaseException, limit: int = 300) -> str:
    """An exception's text for a message, cut: it may quote what the caller sent."""
    text = str(exc)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def server_errors(what: str) -> Iterator[None]:
    """Server side: turn errors of a handler into Flight errors a client maps back.

    trajflight errors go by :data:`WIRE_ERRORS`; Arrow decode errors of client data become
    ``InvalidRequestError``; anything else is logged with its traceback and sent as an internal error
    (never a crashed server).
    """
    try:
        yield
    except TrajflightError as exc:
        raise to_flight_error(exc) from exc
    except flight.FlightError:
        raise  # cancellation or transport errors of the stream itself: already Flight errors
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowIndexError, pa.ArrowSerializationError) as exc:
        raise to_flight_error(InvalidRequestError(f"{what}: malformed Arrow data: {_cut(exc)}")) from exc
    except OSError as exc:  # the stream broke (client gone, cancelled): nothing to tell it, little to log
        log.info("%s: stream broke: %s", what, exc)
        raise to_flight_error(UnavailableError(f"{what}: the stream broke: {exc}")) from exc
    except Exception as exc:
        log.exception("%s failed unexpectedly", what)
        raise to_flight_error(
            TrajflightError(
                f"{what}: internal server error ({type(exc).__name__}: {_cut(exc)}); see the server log"
            )
        ) from exc
