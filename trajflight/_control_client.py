"""Reaching an embedded controller from another process: :class:`FlightTransport` and
:func:`connect_control`.

The transport sends the actions of :class:`~trajflight._control.ControlServer` (typed JSON,
:mod:`trajflight._rpc`; errors as the project's classes) over Flight, or, on the controller's host, over
its same-host socket (:mod:`trajflight._control_local`): the same requests and answers, without gRPC.
A client decides once, at its first call, from the server's ``info``: the socket is used where ``info``
names one, reports this host's :func:`~trajflight.flight_server.host_id`, and this process can reach it.
``checkpoint`` and ``restore`` always go over Flight (their bytes may exceed the socket's frame).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import pyarrow.flight as flight

from trajflight import _rpc
from trajflight.auth import Credential
from trajflight.controller import ControllerClient, Lease
from trajflight.errors import DeadlineExceededError, TrajflightError, UnavailableError
from trajflight.flight_server import (
    CredentialSource,
    LocalChannel,
    TlsConfig,
    call_headers,
    credential_source,
    host_id,
    tls_client_kwargs,
    translate_errors,
)

__all__ = ["LOCAL_ACTIONS", "FlightTransport", "connect_control", "same_host_channel"]

LOCAL_ACTIONS = frozenset({"call", "many", "acquire", "token"})
"""The actions a client sends over the same-host socket (the others over Flight; the server answers any)."""


def same_host_channel(info: dict[str, Any], credential: CredentialSource | None) -> LocalChannel | None:
    """A channel to the controller's socket where ``info`` (the controller's ``info`` answer) names one
    on this host that this process can reach; None otherwise (the caller stays on Flight)."""
    path = info.get("control_socket")
    if not isinstance(path, str) or info.get("node") != host_id():
        return None
    if not os.access(os.path.dirname(path), os.R_OK | os.X_OK) or not os.path.exists(path):
        return None  # another user's controller, or a container that does not share the directory
    return LocalChannel(path, credential)


class FlightTransport:
    """A ``ControllerClient`` transport to a :class:`ControlServer` (every call under a deadline).

    On the controller's host its calls go over the server's same-host socket (:mod:`._control_local`:
    the same actions, several times cheaper), decided at the first call from the server's ``info``;
    elsewhere, and for ``checkpoint`` and ``restore``, over Flight.

    Args:
        location: The control server's ``grpc://`` (``grpc+tls://``) location.
        tls: TLS material for a ``grpc+tls://`` location.
        credential: The bearer token of every call (a credential, or a callable asked per call); None:
            calls carry none (a plane without a secret).
        local: Use the same-host socket where there is one; False: every call over Flight.
    """

    def __init__(
        self,
        location: str,
        tls: TlsConfig | None = None,
        credential: Credential | CredentialSource | None = None,
        *,
        local: bool = True,
    ) -> None:
        self.location = location
        self._credential = credential_source(credential)
        self._channel: LocalChannel | None = None
        self._decided = not local
        self._decide = threading.Lock()
        with translate_errors(f"connect to controller at {location}"):
            self._client = flight.FlightClient(location, **tls_client_kwargs(location, tls))

    def close(self) -> None:
        """Close the connection."""
        if self._channel is not None:
            self._channel.close()
        self._client.close()

    @property
    def route(self) -> str:
        """``"socket"`` or ``"flight"``: how calls travel now (``"flight"`` before the first call)."""
        return "flight" if self._channel is None else "socket"

    def _same_host(self, timeout: float) -> LocalChannel | None:
        """The channel to the server's socket, decided once from its ``info``. While ``info`` is not
        answered (the server is down or busy), calls go over Flight, whose errors are the calls' own,
        and the next call asks again."""
        if self._decided:
            return self._channel
        with self._decide:
            if not self._decided:
                try:
                    self._channel = same_host_channel(self.info(timeout), self._credential)
                except (UnavailableError, DeadlineExceededError):
                    return None
                except TrajflightError:
                    pass  # refused (an old server, a credential without info): Flight from now on
                self._decided = True
        return self._channel

    def _forget(self, channel: LocalChannel) -> None:
        """Drop a broken channel; the next call asks ``info`` again."""
        with self._decide:
            if self._channel is channel:
                self._channel, self._decided = None, False
        channel.close()

    def _action(self, kind: str, body: dict[str, Any], timeout: float) -> Any:
        # The server gets a slightly shorter budget than the wire so its own deadline error wins.
        request = _rpc.dumps({**body, "timeout": max(0.0, timeout - 0.05)})
        channel = self._same_host(timeout) if kind in LOCAL_ACTIONS else None
        if channel is not None and len(request) <= channel.max_frame:  # larger: Flight's refusal names it
            try:
                return _rpc.loads(bytes(channel.call_bytes(kind, request, timeout)))
            except UnavailableError as exc:
                # The socket is gone (a restarted controller serves a new one): the next call decides
                # again; a request that never left goes over Flight now, one that did fails as over Flight.
                self._forget(channel)
                if exc.fields.get("sent") is not False:
                    raise
        options = self._options(timeout)
        with translate_errors(f"controller {kind}"):
            results = list(self._client.do_action(flight.Action(kind, request), options=options))
        if len(results) != 1:
            raise TrajflightError(f"controller {kind}: expected one result, got {len(results)}")
        return _rpc.loads(results[0].body.to_pybytes())

    def _options(self, timeout: float) -> flight.FlightCallOptions:
        return flight.FlightCallOptions(timeout=timeout, headers=call_headers(self._credential))

    @property
    def authenticated(self) -> bool:
        """Whether this transport sends a credential."""
        return self._credential is not None

    def storage_token(self, timeout: float, *, role: str | None = None) -> Credential:
        """A short-lived storage token from the controller (``token`` action): the caller's role and
        jobs (or ``role``, for an admin caller)."""
        body = {} if role is None else {"role": role}
        token = self._action("token", body, timeout)
        return Credential(str(token))

    def invoke(self, method: str, kwargs: dict[str, Any], timeout: float, wait: float = 0.0) -> Any:
        body = {"method": method, "kwargs": kwargs, **({"wait": wait} if wait else {})}
        return self._action("call", body, timeout)

    def invoke_many(self, calls: list[tuple[str, dict[str, Any]]], timeout: float) -> list[Any]:
        """Run several operations in one round trip (stops at the first error, which is raised)."""
        out: list[Any] = self._action("many", {"calls": [list(c) for c in calls]}, timeout)
        return out

    def acquire(self, kwargs: dict[str, Any], wait: float, timeout: float) -> Lease | None:
        lease: Lease | None = self._action("acquire", {"kwargs": kwargs, "wait": wait}, timeout + 0.5)
        return lease

    def checkpoint(self, job_id: str, path: str | None, timeout: float) -> bytes:
        data: bytes = self._action("checkpoint", {"job_id": job_id, "path": path}, timeout)
        return data

    def restore(self, source: bytes | str, kwargs: dict[str, Any], timeout: float) -> dict[str, int]:
        out: dict[str, int] = self._action("restore", {"source": source, "kwargs": kwargs}, timeout)
        return out

    def info(self, timeout: float) -> dict[str, Any]:
        """Deployment facts of the controller host (``info`` action: plain JSON, docs/wire-format.md)."""
        options = self._options(timeout)
        with translate_errors("controller info"):
            results = list(self._client.do_action(flight.Action("info", b'{"v": 1}'), options=options))
        out: dict[str, Any] = json.loads(results[0].body.to_pybytes())
        return out


def connect_control(
    location: str,
    *,
    timeout: float = 30.0,
    tls: TlsConfig | None = None,
    credential: Credential | CredentialSource | None = None,
    local: bool = True,
) -> ControllerClient:
    """A :class:`ControllerClient` for the embedded controller served at ``location`` (``tls``: see
    :class:`~trajflight.flight_server.TlsConfig`, for a ``grpc+tls://`` location; ``credential``: the
    bearer token of every call, for a plane with a deployment secret; ``local``: see
    :class:`FlightTransport`)."""
    return ControllerClient(FlightTransport(location, tls, credential, local=local), timeout=timeout)
