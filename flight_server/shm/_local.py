"""A same-host control channel: the server's actions over a Unix domain socket in its arena directory.

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

Access control is the filesystem's: the socket lives in the arena's 0700 directory, so only the server's
user can connect (as only it can map the segments). This module does not authenticate beyond that, and a
client that stalls mid-request holds one server thread until it disconnects or the server closes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from trajflight.errors import DeadlineExceededError, TrajflightError, UnavailableError
from trajflight.flight_server._errors import from_flight_error, server_errors
from trajflight.flight_server._wire_bounds import echo

__all__ = ["MAX_FRAME", "LocalChannel", "LocalChannelServer"]

log = logging.getLogger("trajflight.flight_server")

_LEN = struct.Struct(">I")
MAX_FRAME = 16 * 2**20
"""Largest frame either side accepts (a ``shm_put`` payload included)."""
MAX_NAME_FRAME = 256
"""Largest action-name frame the server accepts (names are a few characters)."""
Handler = Callable[[str, bytearray, bytearray], bytes]
"""``handler(action name, body, payload) -> result JSON bytes``; raises Flight errors (see
``server_errors``)."""


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
    """

    def __init__(self, path: str, handler: Handler) -> None:
        self.path = path
        self._handler = handler
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a socket file left by a dead incarnation
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self._sock.bind(path)
        finally:
            os.umask(old)
        self._sock.listen(64)
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
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

    def _serve(self, conn: socket.socket) -> None:
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
                    reply = b"\x00" + _frame(self._handler(name, body, payload))
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
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._idle: list[socket.socket] = []
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
            raise UnavailableError(f"local channel {self.path}: cannot connect ({exc})") from exc
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
        sock = self._connect(timeout)
        try:
            sock.settimeout(timeout)
            head = _frame(name.encode()) + _frame(body) + _LEN.pack(len(payload))
            if len(payload):
                _send_all(sock, [head, memoryview(payload)])
            else:
                sock.sendall(head)
            status = _recv_exact(sock, 1)
            payload = _recv_frame(sock)
        except TimeoutError as exc:
            sock.close()
            raise DeadlineExceededError(f"action {name}: no answer within {timeout:g}s") from exc
        except (OSError, ConnectionError) as exc:
            sock.close()
            raise UnavailableError(
                f"action {name}: the storage server's local channel broke ({exc})"
            ) from exc
        with self._lock:
            self._idle.append(sock)
        if status == b"\x00":
            result: dict[str, Any] = json.loads(payload)
            return result
        err = from_flight_error(flight.FlightServerError("local channel error", bytes(payload)))
        raise err if err is not None else TrajflightError(f"action {name} failed")

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    def __del__(self) -> None:
        # A client dropped without close(): close its sockets rather than leave them to the collector
        # (which warns with a ResourceWarning).
        for sock in getattr(self, "_idle", ()):
            sock.close()


def run_handler(run: Callable[[str, bytearray, bytearray], dict[str, Any]]) -> Handler:
    """Wrap the server's action runner so errors leave it as Flight errors (as ``do_action`` does)."""

    def handler(name: str, body: bytearray, payload: bytearray) -> bytes:
        with server_errors(f"action {echo(name)}"):
            return json.dumps(run(name, body, payload)).encode()

    return handler
