"""The controller over Arrow Flight: how other processes reach an embedded (in-process) controller.

:class:`ControlServer` serves a :class:`~trajflight.controller.LocalController` as Flight actions on
loopback, and the same actions on a same-host Unix socket (:mod:`trajflight._control_local`);
:class:`~trajflight._control_client.FlightTransport` is the matching transport of a
:class:`~trajflight.controller.ControllerClient`. Messages are typed JSON (:mod:`trajflight._rpc`),
errors travel as the project's error classes (:mod:`trajflight.flight_server._errors`). What is served
derives from the controller's declared commands (``trajflight.controller.COMMANDS``).

Actions (``do_action`` type -> JSON body -> one result):

* ``call``: ``{"method", "kwargs", "timeout", "wait"?}`` -> the ledger's answer; only the client operations
  in :data:`CALLS` (the commands of route ``CALL``) are served (no internal ledger method is reachable).
  With ``wait`` a call refused for capacity is parked until capacity comes back (``LocalController.run``).
* ``acquire``: ``{"kwargs", "wait", "timeout"}`` -> a lease or null (long poll; other calls proceed).
* ``checkpoint``: ``{"job_id", "timeout"}`` -> bytes; ``restore``: ``{"source", "kwargs", ...}`` with the
  checkpoint's bytes as ``source``. A ``path`` to write or a ``source`` path to read is refused: the
  controller writes and reads no file a caller names (a client does that I/O in its own process).
* ``info``: deployment facts (storage servers, host identity, counters, the timeline of job counts);
  unlike the others its body (empty or ``{"v": 1}``) and its answer are plain JSON, so that any Flight
  client can ask.
* ``token``: ``{"role"?, "jobs"?, "ttl"?}`` -> a short-lived storage token (a JWT string) with the
  caller's role and jobs or narrower, living at most ``storage_ttl`` seconds and never past the caller's
  own credential (only on a controller with a keyring).

Authentication: with a :class:`~trajflight.auth.Keyring` every call needs a bearer token (verified by the
Flight middleware of the storage servers, :func:`~trajflight.flight_server.auth_middleware`, or presented
once per connection on the same-host socket), and every
operation the role :data:`~trajflight.controller.ROLES` names for it, on jobs in the token's scope (a
lease's job for the calls that name a lease token). Without one nothing is checked: loopback only, unless
``insecure``.

Every request is bounded before it is parsed: at most :data:`MAX_REQUEST_BYTES` (``restore``:
:data:`MAX_RESTORE_BYTES`; a larger checkpoint is restored in the controller's own process) and
:data:`~trajflight._rpc.MAX_DEPTH` levels of nesting. Every number is checked by the ledger before it
touches state (ints in int64, seconds finite and >= 0; a float is never an int), every answer to bad input
is an :class:`~trajflight.errors.InvalidRequestError`, and no error repeats more than about 100
characters of what the caller sent.

A long-polling ``acquire`` is parked at most :data:`~trajflight.controller._host.MAX_WAIT` seconds. It
gives up as soon as its caller is gone (the call is cancelled: a killed trainer), and a lease granted to a
caller that left before the reply was delivered is released at once, so a dead poll never holds groups
until their TTL. A call waiting for capacity is held to the same rules: its put grants go back at once
when its caller left. :meth:`ControlServer.shutdown` answers parked calls with UnavailableError first, so
it never waits them out.

It does not bind a lease to the identity that acquired it: a trainer of a job may act on any lease
of that job.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow.flight as flight

from trajflight import _rpc
from trajflight._control_local import ControlSocket, verifying
from trajflight.auth import (
    DEFAULT_STORAGE_TTL,
    Claims,
    Credential,
    Keyring,
    Role,
    authorize,
)
from trajflight.controller import (
    CALLS,
    COMMANDS,
    ROLES,
    Command,
    Lease,
    LocalController,
    Partition,
    check_seconds,
    check_timeout,
    client_call,
)
from trajflight.errors import (
    AuthenticationError,
    InvalidRequestError,
    PermissionDeniedError,
    TrajflightError,
    UnavailableError,
    brief,
)
from trajflight.flight_server import (
    MetricsEndpoint,
    TlsConfig,
    auth_middleware,
    call_claims,
    check_bind,
    host_id,
    server_errors,
    tls_scheme,
)

__all__ = [
    "CALLS",
    "MAX_REQUEST_BYTES",
    "MAX_RESTORE_BYTES",
    "ControlServer",
]

log = logging.getLogger("trajflight.controller")

MAX_REQUEST_BYTES = 16 << 20
"""Largest request body of every action but ``restore`` (bytes)."""

MAX_RESTORE_BYTES = 256 << 20
"""Largest ``restore`` request body (bytes): checkpoint bytes travel base64-encoded inside it."""

_MAX_MESSAGE_CHARS = 2000  # an error longer than this is cut: gRPC refuses oversized error details
_RESTORE_KWARGS = frozenset(COMMANDS["restore"].argument_names) - {"data"}  # the bytes travel as "source"


# Calls whose success is an outcome worth counting for ``trajflight stats``.
_COUNTED = {
    "publish": "groups_published",
    "publish_many": "groups_published",
    "publish_ahead": "groups_published",
    "commit": "commits",
    "release": "releases",
    "resolve": "resolves",
}


class ControlServer(flight.FlightServerBase):  # type: ignore[misc]  # pyarrow has no type stubs
    """Serve a :class:`LocalController` to other processes over Flight.

    Args:
        controller: The in-process controller (the caller keeps ownership and closes it).
        host: Interface to bind; loopback by default.
        port: 0 picks a free port.
        tls: Serve ``grpc+tls://`` with this certificate and key (with its ``ca``: mutual TLS, clients
            must present a certificate it signed). None: plaintext.
        archive_status: What the host's archive did (``Archive.status``), reported by ``info`` under
            ``"archive"``; None when the data plane keeps no archive.
        metrics_port: Serve the controller's Prometheus metrics (``controller.metrics``) over HTTP on
            this port (0: a free one; :attr:`metrics_url` and ``info`` name it). None: no endpoint.
        metrics_host: Interface of the metrics endpoint; loopback by default.
        keyring: The deployment's keys: every call then needs a bearer token they signed (see the module
            docstring); None: no authentication (loopback only, unless ``insecure``).
        insecure: Serve a non-loopback ``host`` without a keyring (refused otherwise).
        storage_ttl: Longest life of a storage token the ``token`` action mints, seconds.
        local_socket: Also serve the same actions on a Unix socket for clients on this host
            (:mod:`trajflight._control_local`; ``info`` names it). False: Flight only.
    """

    def __init__(
        self,
        controller: LocalController,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: TlsConfig | None = None,
        archive_status: Callable[[], dict[str, Any]] | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        keyring: Keyring | None = None,
        insecure: bool = False,
        storage_ttl: float = DEFAULT_STORAGE_TTL,
        local_socket: bool = True,
    ) -> None:
        check_bind(host, keyring, insecure=insecure, what="the controller endpoint")
        self.scheme = tls_scheme(tls)
        self.keyring = keyring
        self.storage_ttl = storage_ttl
        self.metrics_endpoint = (
            None
            if metrics_port is None
            else MetricsEndpoint(controller.metrics.registry, metrics_host, metrics_port)
        )
        try:
            super().__init__(
                f"{self.scheme}://{host}:{port}",
                middleware=auth_middleware(keyring, controller.metrics.count_refusal),
                **(tls.server_kwargs() if tls else {}),
            )
        except BaseException:
            if self.metrics_endpoint is not None:
                self.metrics_endpoint.close()
            raise
        self.controller = controller
        self.archive_status = archive_status
        self.host = host
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._closing = False
        self.started_at = time.time()
        self._socket: ControlSocket | None = None
        if local_socket:
            verify = None if keyring is None else verifying(keyring.verify, controller.metrics.count_refusal)
            try:
                self._socket = ControlSocket(self._local_action, verify)
            except OSError as exc:  # a temporary directory whose path is too long for a Unix socket
                log.warning(
                    "the controller's same-host socket could not be created (%s); clients on this host "
                    "call it over Flight",
                    exc,
                )

    def shutdown(self) -> None:
        """Stop serving: parked long-polling acquires are answered with UnavailableError first (so this
        never waits them out), then in-flight calls finish and the server stops."""
        self._closing = True
        self.controller.wake()
        super().shutdown()
        if self._socket is not None:  # after Flight's calls finished: the woken polls answered meanwhile
            self._socket.close()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics`` of the controller's Prometheus endpoint, or None without one."""
        return None if self.metrics_endpoint is None else self.metrics_endpoint.url

    @property
    def location(self) -> str:
        """``grpc://host:port`` (``grpc+tls://`` with TLS) other processes connect to."""
        return f"{self.scheme}://{self.host}:{self.port}"

    def _count(self, key: str, amount: int = 1) -> None:
        with self._lock:
            self.counters[key] += amount

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        with server_errors("controller list_actions"):
            authorize(call_claims(context), "list_actions", _ANY)
        return [
            ("call", "run one controller operation: {method, kwargs, timeout}"),
            ("many", "run several operations in order: {calls: [[method, kwargs], ...], timeout} -> results"),
            ("acquire", "long-poll lease: {kwargs, wait, timeout} -> lease or null"),
            ("checkpoint", "take a job checkpoint: {job_id, path, timeout} -> bytes"),
            ("restore", "restore a job from a checkpoint: {source, kwargs, timeout}"),
            ("info", "deployment facts: storage servers, host identity, counters, timeline"),
            ("token", "a short-lived storage token: {role?, jobs?, ttl?} -> token (authenticated only)"),
        ]

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Any:
        kind = action.type
        with server_errors(f"controller action {brief(kind)}"):
            payload, granted = self._respond(
                kind, action.body.to_pybytes(), call_claims(context), context.is_cancelled
            )
        if granted is not None:
            if context.is_cancelled():  # the caller left while it was granted: give it all back
                self._give_back(granted)
                return []
            return self._deliver(granted, payload)
        return [payload]

    def _local_action(self, kind: str, body: bytearray, payload: bytearray, claims: Claims | None) -> bytes:
        """An action from the same-host socket: the same answer as :meth:`do_action`'s."""
        assert self._socket is not None
        gone = self._socket.caller_gone
        with server_errors(f"controller action {brief(kind)}"):
            if self.keyring is not None and claims is None:
                raise AuthenticationError(
                    "no credential on the controller's same-host socket: send the bearer token first "
                    "(the client does when it has one: connect(token=...) or TRAJFLIGHT_TOKEN)",
                    reason="missing",
                )
            if payload:
                raise InvalidRequestError(
                    f"controller action {brief(kind)} takes no payload", field="payload"
                )
            answer, granted = self._respond(kind, bytes(body), claims, gone)
        if granted is not None and gone():  # as over Flight: a grant nobody will receive goes back at once
            self._give_back(granted)
            return _rpc.dumps(None)
        return answer

    def _respond(
        self, kind: str, raw: bytes, claims: Claims | None, gone: Callable[[], bool]
    ) -> tuple[bytes, Any]:
        """The answer to action ``kind`` with body ``raw`` from a caller holding ``claims`` (``gone``: whether
        that caller left, for a long poll), and what a long poll granted if anything: the lease of an
        ``acquire``, the put grants of a ``call`` that waited for capacity.

        Raises:
            TrajflightError: bounded (:func:`_bounded`); the endpoint turns it into its wire error.
        """
        if kind == "info":  # plain JSON both ways, so that a bare Flight client can ask
            authorize(claims, "info", _ANY)
            return json.dumps(self._info(raw)).encode(), None
        try:
            limit = MAX_RESTORE_BYTES if kind == "restore" else MAX_REQUEST_BYTES
            body = _rpc.loads(raw, max_bytes=limit) if raw else {}
            if not isinstance(body, dict):
                raise InvalidRequestError(f"controller action {brief(kind)}: the body must be an object")
            try:
                result = self._dispatch(kind, body, gone, claims)
            except TypeError as exc:  # arguments the operation does not take: the caller's mistake
                raise InvalidRequestError(
                    f"controller action {brief(kind)}: bad arguments: {brief(str(exc))}"
                ) from exc
            payload = _rpc.dumps(result)
        except TrajflightError as exc:
            raise _bounded(exc) from exc
        polled = kind == "acquire" or (kind == "call" and body.get("wait"))
        return payload, result if polled else None

    def _give_back(self, granted: Any) -> None:
        """Give back what a long poll granted a caller that is gone: a lease, or a waiting call's grants."""
        if isinstance(granted, Lease):
            self.controller.release_abandoned(granted, timeout=5.0)
        else:
            self.controller.abandon_grants(granted, timeout=5.0)

    def _deliver(self, granted: Any, payload: bytes) -> Iterator[bytes]:
        """Send a long poll's grant (a lease, or put grants); give it back at once when the reply cannot be
        delivered (the caller is gone: Flight stops iterating after a failed write, and this generator is
        closed without resuming)."""
        delivered = False
        try:
            yield payload
            delivered = True
        finally:
            if not delivered:
                self._give_back(granted)

    def _dispatch(
        self, kind: str, body: dict[str, Any], gone: Callable[[], bool], claims: Claims | None
    ) -> Any:
        timeout = check_timeout(body.get("timeout"))
        for name in ("kwargs",):
            if name in body and body[name] is not None and not isinstance(body[name], dict):
                raise InvalidRequestError(f"controller action {brief(kind)}: {name!r} must be an object")
        if kind == "token":
            return self._mint(body, claims).reveal()
        if kind == "call":
            command = self._authorized(body.get("method"), body.get("kwargs") or {}, claims)
            wait = check_seconds(body.get("wait", 0.0), "wait")
            return self._run(command, timeout, wait, lambda: self._closing or gone())
        if kind == "many":
            calls = body.get("calls")
            if not isinstance(calls, list) or not all(
                isinstance(c, list | tuple) and len(c) == 2 and isinstance(c[1], dict) for c in calls
            ):
                raise InvalidRequestError("controller action many: calls must be a list of [method, kwargs]")
            commands = [self._authorized(method, kwargs, claims) for method, kwargs in calls]
            return [self._run(command, timeout) for command in commands]  # all checked before any runs
        if kind == "acquire":
            wait = check_seconds(body.get("wait", 0.0), "wait")
            kwargs = body.get("kwargs") or {}
            authorize(claims, "acquire", ROLES["acquire"], _named_jobs(claims, kwargs.get("job_id")))
            lease: Lease | None = self.controller.acquire(
                kwargs,
                wait=wait,
                timeout=timeout,
                abandoned=lambda: self._closing or gone(),
            )
            if lease is None and self._closing:
                raise UnavailableError(
                    "the controller is shutting down; connect to its successor and lease again"
                )
            self._count("leases_granted" if lease is not None else "acquires_empty")
            if lease is not None:
                self._count("groups_leased", len(lease.groups))
            return lease
        if kind == "checkpoint":
            job_id = _required(body, "job_id", str)
            authorize(claims, "checkpoint", ROLES["checkpoint"], [job_id])
            if body.get("path") is not None:  # a caller must not name files on the controller's machine
                raise InvalidRequestError(
                    "controller action checkpoint: path is refused over the wire (the controller writes no "
                    "file a caller names); send null and store the returned bytes yourself, as "
                    "trajflight.Client.checkpoint(job_id, path) does in the caller's process"
                )
            return self.controller.checkpoint(job_id, None, timeout=timeout)
        if kind == "restore":
            source = _required(body, "source", (bytes, str))
            if not isinstance(source, bytes):  # nor read one
                raise InvalidRequestError(
                    "controller action restore: source must be the checkpoint's bytes, not a path (the "
                    "controller reads no file a caller names); trajflight.Client.restore(path, ...) reads "
                    "the file in the caller's process and sends its bytes"
                )
            kwargs = body.get("kwargs") or {}
            authorize(claims, "restore", ROLES["restore"], _named_jobs(claims, kwargs.get("job_id")))
            unknown = set(kwargs) - _RESTORE_KWARGS
            if unknown:
                raise InvalidRequestError(
                    f"controller action restore: unknown arguments {brief(sorted(unknown))}; "
                    f"known: {sorted(_RESTORE_KWARGS)}"
                )
            return self.controller.restore(source, timeout=timeout, **kwargs)
        if kind == "info":
            return self._info(b"")
        raise InvalidRequestError(f"unknown controller action {brief(kind)}")

    def _info(self, body: bytes) -> dict[str, Any]:
        """The ``info`` action: its body is empty or ``{"v": 1}``; its answer plain JSON (no type tags).

        Raises:
            InvalidRequestError: a body that is not such an object, or of another wire version.
        """
        if len(body) > 1024 or body.strip():  # the one request this action takes is tiny
            try:
                request = json.loads(body) if len(body) <= 1024 else None
            except (UnicodeDecodeError, ValueError, RecursionError):
                request = None
            if not isinstance(request, dict) or type(request.get("v")) is not int or request["v"] != 1:
                raise InvalidRequestError(
                    'controller action info: the body must be empty or {"v": 1} (wire version 1)'
                )
        servers = self.controller.call("servers", {}, timeout=None)
        with self._lock:
            counters = dict(self.counters)
        out = {
            "v": 1,
            "kind": "embedded",
            "node": host_id(),
            "servers": [dataclasses.asdict(s) for s in servers],
            "counters": counters,
            "uptime_s": time.time() - self.started_at,
            "metrics": self.metrics_url,
            "timeline": self.controller.timeline(),
        }
        if self._socket is not None:
            out["control_socket"] = self._socket.path
        if self.archive_status is not None:
            out["archive"] = self.archive_status()
        return out

    def _mint(self, body: dict[str, Any], claims: Claims | None) -> Credential:
        """The ``token`` action: a storage token no wider than the caller's credential."""
        if self.keyring is None or claims is None:
            raise InvalidRequestError(
                "controller action token: this plane does not authenticate (no deployment secret); its "
                "storage servers take no token: connect without one"
            )
        role = body.get("role") or claims.role.value
        if claims.role is not Role.ADMIN and role != claims.role.value:
            raise PermissionDeniedError(
                f"a token of role {brief(role)} needs role {brief(role)} or admin; a {claims.role.value} "
                f"credential mints {claims.role.value} tokens only",
                reason="role",
                operation="token",
            )
        jobs = body.get("jobs") or list(claims.jobs)
        if not isinstance(jobs, list) or not all(isinstance(j, str) for j in jobs):
            raise InvalidRequestError("controller action token: jobs must be a list of job ids")
        authorize(claims, "token", (claims.role,), jobs)
        ttl = check_seconds(body.get("ttl", self.storage_ttl), "ttl")
        now = self.keyring.now()
        ttl = min(ttl, self.storage_ttl, claims.exp - now)  # never outlives the caller's credential
        if ttl < 1.0:  # a token lives whole seconds: one past the credential's end would outlive it
            raise AuthenticationError(
                "the credential expires within a second; get a new one (trajflight token) and connect again",
                reason="expired",
            )
        return self.keyring.mint(claims.sub, role, jobs, ttl=ttl, now=now)

    def _authorized(self, method: Any, kwargs: dict[str, Any], claims: Claims | None) -> Command[Any]:
        """The client operation ``method`` with ``kwargs``, once the caller may run it on its jobs."""
        command = client_call(method, kwargs)
        if claims is not None:
            authorize(claims, command.name, ROLES[command.name], ())  # the role first: it is cheap
            if not claims.all_jobs:
                jobs = self._jobs_of(command)
                if not jobs and ROLES[command.name] == (Role.ADMIN,):
                    raise PermissionDeniedError(
                        f"{command.name} acts on the whole deployment, outside the credential's jobs "
                        f"{brief(list(claims.jobs))}; it needs an admin credential of every job ('*')",
                        reason="job",
                        operation=command.name,
                    )
                authorize(claims, command.name, ROLES[command.name], jobs)
        return command

    def _jobs_of(self, command: Command[Any]) -> list[str]:
        """The jobs a command acts on: its ``job_id`` and its items' jobs (``publish_ahead`` names both:
        a credential must cover each), its partition's job, or its lease's job."""
        args = command.arguments()
        jobs = [] if args.get("job_id") is None else [_job_id(args["job_id"])]
        if "items" in args:
            items = args["items"] if isinstance(args["items"], list | tuple) else [args["items"]]
            jobs += [_job_of(getattr(item, "partition", item)) for item in items]
        if jobs:
            return jobs
        if "partition" in args:
            return [_job_of(args["partition"])]
        if "token" in args:
            return [self.controller.call("lease_job", {"token": args["token"]}, timeout=None)]
        return []

    def _run(
        self,
        command: Command[Any],
        timeout: float | None,
        wait: float = 0.0,
        abandoned: Callable[[], bool] | None = None,
    ) -> Any:
        method = command.name
        result = self.controller.run(command, timeout=timeout, wait=wait, abandoned=abandoned)
        published = result.groups if method == "publish_ahead" else result
        if method in _COUNTED:
            self._count(_COUNTED[method], len(published) if isinstance(published, tuple | list) else 1)
        if method == "publish":
            self._count("bytes_published", result.nbytes)
        elif method in ("publish_many", "publish_ahead"):
            self._count("bytes_published", sum(info.nbytes for info in published))
        return result


_ANY = (Role.WRITER, Role.TRAINER, Role.READER)


def _named_jobs(claims: Claims | None, job_id: object) -> list[str]:
    """``[job_id]`` for a job id, to check a scoped token against (nothing to check without claims or for
    a token of every job); another value is refused, since the job must be known."""
    return [] if claims is None or claims.all_jobs else [_job_id(job_id)]


def _job_id(job_id: object) -> str:
    if not isinstance(job_id, str):
        raise InvalidRequestError(f"job_id must be a string, got {brief(job_id)}")
    return job_id


def _job_of(partition: object) -> str:
    """The job of a partition as a caller sends it (a Partition or ``[job_id, epoch, group_id]``)."""
    if isinstance(partition, Partition):
        return str(partition.job_id)
    if isinstance(partition, list | tuple) and partition and isinstance(partition[0], str):
        return partition[0]
    raise InvalidRequestError(f"a partition is (job_id, epoch, group_id), got {brief(partition)}")


def _bounded(exc: TrajflightError) -> TrajflightError:
    """``exc`` with its message cut to a size gRPC always carries and its fields to short values: a last
    guard, so that no caller input, however large, makes the error itself fail on the wire."""
    long_fields = {
        k: v
        for k, v in exc.fields.items()
        if isinstance(v, str | bytes | list | tuple | dict) and len(v) > 100
    }
    if len(exc.message) <= _MAX_MESSAGE_CHARS and not long_fields:
        return exc
    message = (
        exc.message if len(exc.message) <= _MAX_MESSAGE_CHARS else exc.message[:_MAX_MESSAGE_CHARS] + "..."
    )
    fields = {**exc.fields, **{k: brief(v) for k, v in long_fields.items()}}
    try:
        return type(exc)(message, **fields)
    except TypeError:
        return type(exc)(message)


def _required(body: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(name)
    if not isinstance(value, kind):
        raise InvalidRequestError(f"controller action: field {name!r} is missing or of the wrong type")
    return value
