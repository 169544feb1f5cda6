"""The controller over Arrow Flight: how other processes reach an embedded (in-process) controller.

:class:`ControlServer` serves a :class:`~trajflight.controller.LocalController` as Flight actions on
loopback; :class:`FlightTransport` is the matching transport of a
:class:`~trajflight.controller.ControllerClient`. Messages are typed JSON (:mod:`trajflight._rpc`),
errors travel as the project's error classes (:mod:`trajflight.flight_server._errors`).

Actions (``do_action`` type -> JSON body -> one result):

* ``call``: ``{"method", "kwargs", "timeout"}`` -> the ledger's answer; only the client operations in
  :data:`CALLS` are served (no internal ledger method is reachable).
* ``acquire``: ``{"kwargs", "wait", "timeout"}`` -> a lease or null (long poll; other calls proceed).
* ``checkpoint``: ``{"job_id", "path", "timeout"}`` -> bytes; ``restore``: ``{"source", "kwargs", ...}``.
* ``info``: deployment facts (storage servers, host identity, counters); unlike the others its body
  (empty or ``{"v": 1}``) and its answer are plain JSON, so that any Flight client can ask.

It does not authenticate callers: bind it to loopback (the default) or a trusted network.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from collections import Counter
from typing import Any

import pyarrow.flight as flight

from trajflight import _rpc
from trajflight.controller import (
    ControllerClient,
    DeleteWork,
    GroupInfo,
    GroupState,
    JobConfig,
    Lease,
    LocalController,
    OldReady,
    Partition,
    PolicyStatus,
    Publication,
    PutGrant,
    ResolveAction,
    ServerInfo,
)
from trajflight.errors import InvalidRequestError, TrajflightError
from trajflight.flight_server._errors import server_errors, translate_errors

__all__ = ["CALLS", "ControlServer", "FlightTransport", "connect_control"]

_rpc.register(
    DeleteWork,
    GroupInfo,
    GroupState,
    JobConfig,
    Lease,
    OldReady,
    Partition,
    PolicyStatus,
    Publication,
    PutGrant,
    ResolveAction,
    ServerInfo,
)

CALLS = frozenset(
    {
        "register_server",
        "open_job",
        "register_writer",
        "announce_policy",
        "ack_policy",
        "policy_status",
        "allocate",
        "allocate_many",
        "publish",
        "publish_many",
        "group",
        "renew",
        "prepare",
        "start_training",
        "finish_training",
        "commit",
        "release",
        "resolve",
        "counts",
        "usage",
        "lease_groups",
        "gc_list",
        "servers",
    }
)
"""Controller operations a remote client may call (the methods of ``ControllerClient``)."""

# Calls whose success is an outcome worth counting for ``trajflight stats``.
_COUNTED = {
    "publish": "groups_published",
    "publish_many": "groups_published",
    "commit": "commits",
    "release": "releases",
    "resolve": "resolves",
}


def host_identity() -> str:
    """This machine's identity for same-node placement: its hostname (not an IP address)."""
    return socket.gethostname()


class ControlServer(flight.FlightServerBase):  # type: ignore[misc]  # pyarrow has no type stubs
    """Serve a :class:`LocalController` to other processes over Flight.

    Args:
        controller: The in-process controller (the caller keeps ownership and closes it).
        host: Interface to bind; loopback by default.
        port: 0 picks a free port.
    """

    def __init__(self, controller: LocalController, *, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(f"grpc://{host}:{port}")
        self.controller = controller
        self.host = host
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.started_at = time.time()

    @property
    def location(self) -> str:
        """``grpc://host:port`` other processes connect to."""
        return f"grpc://{self.host}:{self.port}"

    def _count(self, key: str, amount: int = 1) -> None:
        with self._lock:
            self.counters[key] += amount

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return [
            ("call", "run one controller operation: {method, kwargs, timeout}"),
            ("many", "run several operations in order: {calls: [[method, kwargs], ...], timeout} -> results"),
            ("acquire", "long-poll lease: {kwargs, wait, timeout} -> lease or null"),
            ("checkpoint", "take a job checkpoint: {job_id, path, timeout} -> bytes"),
            ("restore", "restore a job from a checkpoint: {source, kwargs, timeout}"),
            ("info", "deployment facts: storage servers, host identity, counters"),
        ]

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> list[bytes]:
        with server_errors(f"controller action {action.type}"):
            if action.type == "info":  # plain JSON both ways, so that a bare Flight client can ask
                return [json.dumps(self._info(action.body.to_pybytes())).encode()]
            body = _rpc.loads(action.body.to_pybytes()) if action.body.size else {}
            if not isinstance(body, dict):
                raise InvalidRequestError(f"controller action {action.type}: the body must be an object")
            try:
                result = self._dispatch(action.type, body)
            except TypeError as exc:  # arguments the operation does not take: the caller's mistake
                raise InvalidRequestError(f"controller action {action.type}: bad arguments: {exc}") from exc
            return [_rpc.dumps(result)]

    def _dispatch(self, kind: str, body: dict[str, Any]) -> Any:
        timeout = body.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
            raise InvalidRequestError(f"controller action {kind}: timeout must be a number of seconds")
        for name in ("kwargs",):
            if name in body and not isinstance(body[name], dict):
                raise InvalidRequestError(f"controller action {kind}: {name!r} must be an object")
        if kind == "call":
            return self._call(body.get("method"), body.get("kwargs") or {}, timeout)
        if kind == "many":
            calls = body.get("calls")
            if not isinstance(calls, list) or not all(
                isinstance(c, list | tuple) and len(c) == 2 and isinstance(c[1], dict) for c in calls
            ):
                raise InvalidRequestError("controller action many: calls must be a list of [method, kwargs]")
            return [self._call(method, kwargs, timeout) for method, kwargs in calls]
        if kind == "acquire":
            lease: Lease | None = self.controller.acquire(
                body.get("kwargs") or {}, wait=body.get("wait", 0.0), timeout=timeout
            )
            self._count("leases_granted" if lease is not None else "acquires_empty")
            if lease is not None:
                self._count("groups_leased", len(lease.groups))
            return lease
        if kind == "checkpoint":
            return self.controller.checkpoint(
                _required(body, "job_id", str), body.get("path"), timeout=timeout
            )
        if kind == "restore":
            source = _required(body, "source", (bytes, str))
            return self.controller.restore(source, timeout=timeout, **(body.get("kwargs") or {}))
        if kind == "info":
            return self._info(b"")
        raise InvalidRequestError(f"unknown controller action {kind!r}")

    def _info(self, body: bytes) -> dict[str, Any]:
        """The ``info`` action: its body is empty or ``{"v": 1}``; its answer plain JSON (no type tags).

        Raises:
            InvalidRequestError: a body that is not such an object, or of another wire version.
        """
        if body.strip():
            try:
                request = json.loads(body)
            except (UnicodeDecodeError, ValueError):
                request = None
            if not isinstance(request, dict) or request.get("v") != 1 or isinstance(request.get("v"), bool):
                raise InvalidRequestError(
                    'controller action info: the body must be empty or {"v": 1} (wire version 1)'
                )
        servers = self.controller.call("servers", {}, timeout=None)
        with self._lock:
            counters = dict(self.counters)
        return {
            "v": 1,
            "kind": "embedded",
            "node": host_identity(),
            "servers": [dataclasses.asdict(s) for s in servers],
            "counters": counters,
            "uptime_s": time.time() - self.started_at,
        }

    def _call(self, method: Any, kwargs: dict[str, Any], timeout: float | None) -> Any:
        if method not in CALLS:
            raise InvalidRequestError(f"unknown controller operation {method!r}; known: {sorted(CALLS)}")
        result = self.controller.call(method, kwargs, timeout=timeout)
        if method in _COUNTED:
            self._count(_COUNTED[method], len(result) if isinstance(result, tuple | list) else 1)
        if method == "publish":
            self._count("bytes_published", result.nbytes)
        elif method == "publish_many":
            self._count("bytes_published", sum(info.nbytes for info in result))
        return result


def _required(body: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(name)
    if not isinstance(value, kind):
        raise InvalidRequestError(f"controller action: field {name!r} is missing or of the wrong type")
    return value


class FlightTransport:
    """A ``ControllerClient`` transport to a :class:`ControlServer` (every call under a deadline)."""

    def __init__(self, location: str) -> None:
        self.location = location
        with translate_errors(f"connect to controller at {location}"):
            self._client = flight.FlightClient(location)

    def close(self) -> None:
        """Close the connection."""
        self._client.close()

    def _action(self, kind: str, body: dict[str, Any], timeout: float) -> Any:
        # The server gets a slightly shorter budget than the wire so its own deadline error wins.
        body = {**body, "timeout": max(0.0, timeout - 0.05)}
        options = flight.FlightCallOptions(timeout=timeout)
        with translate_errors(f"controller {kind}"):
            results = list(self._client.do_action(flight.Action(kind, _rpc.dumps(body)), options=options))
        if len(results) != 1:
            raise TrajflightError(f"controller {kind}: expected one result, got {len(results)}")
        return _rpc.loads(results[0].body.to_pybytes())

    def invoke(self, method: str, kwargs: dict[str, Any], timeout: float) -> Any:
        return self._action("call", {"method": method, "kwargs": kwargs}, timeout)

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
        options = flight.FlightCallOptions(timeout=timeout)
        with translate_errors("controller info"):
            results = list(self._client.do_action(flight.Action("info", b'{"v": 1}'), options=options))
        out: dict[str, Any] = json.loads(results[0].body.to_pybytes())
        return out


def connect_control(location: str, *, timeout: float = 30.0) -> ControllerClient:
    """A :class:`ControllerClient` for the embedded controller served at ``location``."""
    return ControllerClient(FlightTransport(location), timeout=timeout)
