"""A same-host control channel: a server's actions over a Unix domain socket in a private directory.

A Flight ``do_action`` pays gRPC and its Python shims on both sides; the same-host data path needs a few
small control messages per put-lease-get cycle (``shm_reserve``, ``shm_publish``, ``shm_open``), so it
sends them over a Unix socket instead, several times cheaper (BENCHMARKS.md, *Transport*).
It carries exactly the action names and JSON bodies of ``do_action`` (``docs/wire-format.md``), decoded and
checked by the same server code, and errors as the same ``{"v", "code", "message", "fields"}`` record the
Flight error carries in ``extra_info``. Group data travels on it only for groups small enough that one
copy through the socket costs less than a second round trip (``shm_put``).

Framing, both ways: a 4-byte big-endian length, then that many bytes. Request: ``name``, ``body`` and
``payload`` (three frames; the payload is empty except for ``shm_put``, the one action that carries a
small group's bytes, see ``StorageServer``). Response: one status byte (``0`` result JSON, ``1`` error
record) then one frame.

Access control is first the filesystem's: the socket lives in the arena's 0700 directory, so only the
server's user can connect (as only it can map the segments). Where the server authenticates (a deployment
secret), a connection must also present a bearer token before anything else: a request named
:data:`AUTHENTICATE` whose body is the token; the server keeps it for the connection and verifies it
again at every request (a lookup in the keyring's cache; expiry by the keyring's clock): an expired
connection is refused until it presents a fresh token the same way. A client that stalls mid-request
holds one server thread until it disconnects or the server closes.

The controller's endpoint serves its actions on such a channel too (``trajflight._control_local``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from trajflight.auth import Claims, Credential
from trajflight.errors import DeadlineExceededError, TrajflightError, UnavailableError
from trajflight.flight_server._errors import from_flight_error, server_errors, to_flight_error
from trajflight.flight_server._wire_bounds import echo

__all__ = ["AUTHENTICATE", "MAX_FRAME", "LocalChannel", "LocalChannelServer"]

log = logging.getLogger("trajflight.flight_server")

_LEN = struct.Struct(">I")
MAX_FRAME = 16 * 2**20
"""Largest frame either side accepts (a ``shm_put`` payload included)."""
MAX_NAME_FRAME = 256
"""Largest action-name frame the server accepts (names are a few characters)."""
AUTHENTICATE = "authenticate"
"""The request that presents a connection's bearer token (body: the token)."""
Handler = Callable[[str, bytearray, bytearray, Claims | None], bytes]
"""``handler(action name, body, payload, claims) -> result JSON bytes``; raises Flight errors (see
``server_errors``). ``claims``: the connection's verified token, None where it presented none."""
Authenticate = Callable[[str], Claims]
"""Verify a token (``Keyring.verify``); raises AuthenticationError."""


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    """``n`` bytes, received into one buffer (returned as it is: a payload is not copied again)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return buf


class FrameError(ConnectionError):
    """A frame over its bound: the request is refused and the connection closed (its framing is lost)."""


def _recv_frame(sock: socket.socket, limit: int = MAX_FRAME, what: str = "frame") -> bytearray:
    (n,) = _LEN.unpack(_recv_exact(sock, 4))
    if n > limit:
        raise FrameError(f"local channel: a {what} of {n} bytes is larger than the {limit} allowed")
    return _recv_exact(sock, n)


def _error_record(message: str, **fields: Any) -> bytes:
    """The error record of ``docs/wire-format.md`` for a refused request (an invalid_request)."""
    return json.dumps({"v": 1, "code": "invalid_request", "message": message, "fields": fields}).encode()


def _frame(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


def _send_all(sock: socket.socket, parts: list[Any]) -> None:
    """``sendall`` of several buffers with ``sendmsg`` (gather I/O: the payload is not copied to join it)."""
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


class LocalChannelServer:
    """Serve ``handler`` on a Unix socket at ``path`` (created 0600), one thread per connection.

    Args:
        path: Socket path (inside the arena's private directory).
        handler: Runs one action; the server's ``do_action`` logic.
        authenticate: Verifies the token of an :data:`AUTHENTICATE` request; None: the channel takes no
            tokens (the server does not authenticate).
    """

    def __init__(self, path: str, handler: Handler, *, authenticate: Authenticate | None = None) -> None:
        self.path = path
        self._handler = handler
        self._authenticate = authenticate
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a socket file left by a dead incarnation
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self._sock.bind(path)
        except OSError:
            self._sock.close()  # a path too long for a socket, or a directory that is gone
            raise
        finally:
            os.umask(old)
        self._sock.listen(64)
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._current = threading.local()  # the connection each serving thread answers
        threading.Thread(target=self._accept, name="trajflight-local-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="trajflight-local", daemon=True).start()

    def _present(self, body: bytearray) -> tuple[str, bytes]:
        """Verify a presented token: the token and the reply (a Flight error when it does not verify)."""
        if self._authenticate is None:
            raise to_flight_error(
                TrajflightError("this server does not authenticate: send no token on its local channel")
            )
        token = body.decode("utf-8", errors="replace")
        try:
            claims = self._authenticate(token)
        except TrajflightError as exc:
            raise to_flight_error(exc) from None
        return token, json.dumps({"sub": claims.sub, "exp": claims.exp}).encode()

    def _run(self, name: str, body: bytearray, payload: bytearray, token: str | None) -> bytes:
        claims: Claims | None = None
        if token is not None and self._authenticate is not None:
            # Verified again at each request: the keyring's cache makes it a lookup, and its clock (not
            # this process's) decides expiry, as it did when the token was presented.
            try:
                claims = self._authenticate(token)
            except TrajflightError as exc:
                raise to_flight_error(exc) from None
        return self._handler(name, body, payload, claims)

    def caller_gone(self) -> bool:
        """Whether the client of the request this thread is running has closed its connection.

        For a handler that parks (a long poll): a client that gave up or died sends nothing more before
        its reply, so a readable connection here means it was closed. False outside a request."""
        conn: socket.socket | None = getattr(self._current, "conn", None)
        if conn is None:
            return False
        try:
            readable, _, _ = select.select([conn], [], [], 0)
            return bool(readable) and conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except (OSError, ValueError):
            return True

    def _serve(self, conn: socket.socket) -> None:
        token: str | None = None  # the connection's verified bearer token
        self._current.conn = conn
        try:
            while True:
                try:
                    name = _recv_frame(conn, MAX_NAME_FRAME, "name").decode("utf-8", errors="replace")
                    body = _recv_frame(conn, what="body")
                    payload = _recv_frame(conn, what="payload")
                except FrameError as exc:
                    # Tell the client why, then drop the connection: the rest of its bytes are unframed.
                    conn.sendall(b"\x01" + _frame(_error_record(str(exc), field="frame")))
                    return
                try:
                    if name == AUTHENTICATE:
                        token = None  # a refused token leaves the connection unauthenticated
                        token, result = self._present(body)
                    else:
                        result = self._run(name, body, payload, token)
                    reply = b"\x00" + _frame(result)
                except flight.FlightError as exc:
                    extra = (
                        getattr(exc, "extra_info", None)
                        or json.dumps(
                            {"v": 1, "code": "trajflight", "message": str(exc), "fields": {}}
                        ).encode()
                    )
                    reply = b"\x01" + _frame(extra)
                conn.sendall(reply)
        except (OSError, ConnectionError):
            pass  # the client went away
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def close(self) -> None:
        """Stop accepting, drop every connection and unlink the socket file (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns = list(self._conns)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class LocalChannel:
    """Client of a :class:`LocalChannelServer`: a small pool of connections, thread-safe.

    Args:
        path: The server's socket path (from its ``health``).
        credential: The bearer token to present on each connection, asked before every request (a
            connection presents it again when it changed: refreshed); None presents none.
    """

    max_frame = MAX_FRAME
    """Largest body or payload a request may carry (the server drops a connection that sends more)."""

    def __init__(self, path: str, credential: Callable[[], Credential | None] | None = None) -> None:
        self.path = path
        self._credential = credential
        self._idle: list[socket.socket] = []
        self._presented: dict[socket.socket, Credential] = {}
        self._lock = threading.Lock()

    def _connect(self, timeout: float) -> socket.socket:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            # sent=False: nothing of the request left this process (safe to send it another way).
            raise UnavailableError(f"local channel {self.path}: cannot connect ({exc})", sent=False) from exc
        return sock

    def call(
        self, name: str, body: bytes, timeout: float, payload: bytes | pa.Buffer = b""
    ) -> dict[str, Any]:
        """Run action ``name`` with ``body`` (and ``payload``, sent without joining it to the frames);
        returns its JSON result or raises the server's error.

        Raises:
            The server's trajflight error; DeadlineExceededError after ``timeout``; UnavailableError when
            the server is gone.
        """
        result: dict[str, Any] = json.loads(self.call_bytes(name, body, timeout, payload))
        return result

    def call_bytes(
        self, name: str, body: bytes, timeout: float, payload: bytes | pa.Buffer = b""
    ) -> bytearray:
        """:meth:`call`, returning the result's bytes as the server sent them (for a server whose results
        are not plain JSON, such as the controller's typed JSON); same errors."""
        sock = self._connect(timeout)
        credential = None if self._credential is None else self._credential()
        if credential is not None and self._presented.get(sock) != credential:
            status, reply = self._exchange(sock, AUTHENTICATE, credential.reveal().encode(), timeout)
            if status != b"\x00":
                self._drop(sock)  # never pool a connection whose token was refused
                raise _error_of(reply, AUTHENTICATE)
            with self._lock:
                self._presented[sock] = credential
        status, reply = self._exchange(sock, name, body, timeout, payload)
        with self._lock:
            self._idle.append(sock)
        if status == b"\x00":
            return reply
        raise _error_of(reply, name)

    def _exchange(
        self, sock: socket.socket, name: str, body: bytes, timeout: float, payload: bytes | pa.Buffer = b""
    ) -> tuple[bytes, bytearray]:
        """One request and its reply's status byte and frame; a broken connection is dropped."""
        sent = False
        try:
            sock.settimeout(timeout)
            head = _frame(name.encode()) + _frame(body) + _LEN.pack(len(payload))
            if len(payload):
                _send_all(sock, [head, memoryview(payload)])
            else:
                sock.sendall(head)
            sent = True
            status = bytes(_recv_exact(sock, 1))
            return status, _recv_frame(sock)
        except TimeoutError as exc:
            self._drop(sock)
            raise DeadlineExceededError(f"action {name}: no answer within {timeout:g}s") from exc
        except (OSError, ConnectionError) as exc:
            self._drop(sock)
            # sent=False: the server had closed the connection before the request was whole (a pooled
            # connection to a server that restarted), so it cannot have run it.
            raise UnavailableError(
                f"action {name}: the server's same-host channel {self.path} broke ({exc})", sent=sent
            ) from exc

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            self._presented.pop(sock, None)
        sock.close()

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._presented.clear()
        for sock in idle:
            sock.close()

    def __del__(self) -> None:
        # A client dropped without close(): close its sockets rather than leave them to the collector
        # (which warns with a ResourceWarning).
        for sock in getattr(self, "_idle", ()):
            sock.close()


def _error_of(record: bytearray, name: str) -> TrajflightError:
    err = from_flight_error(flight.FlightServerError("local channel error", bytes(record)))
    return err if err is not None else TrajflightError(f"action {name} failed")


def run_handler(run: Callable[[str, bytearray, bytearray, Claims | None], dict[str, Any]]) -> Handler:
    """Wrap the server's action runner so errors leave it as Flight errors (as ``do_action`` does)."""

    def handler(name: str, body: bytearray, payload: bytearray, claims: Claims | None) -> bytes:
        with server_errors(f"action {echo(name)}"):
            return json.dumps(run(name, body, payload, claims)).encode()

    return handler
