"""The storage server: a ``pyarrow.flight.FlightServerBase`` over a :class:`GroupStore`.

* Authentication: with a :class:`~trajflight.auth.Keyring` every call needs a bearer token (the Flight
  middleware of :mod:`._auth` verifies it; the same-host socket verifies it on a connection's first
  message and its expiry at every request), and every operation needs the role :data:`ROLES` names and a
  token scoped to the jobs it touches. Without one (loopback only, unless ``insecure``) nothing is checked.
* ``do_put`` receives a whole group (or appended columns), checks the writer's credentials, the schema,
  ``validate_group(full=True)`` and the size limits, and publishes it atomically: a stream that fails, is
  cancelled or whose client dies leaves nothing visible and gives its reservation back. Every put
  announces its row count, and a stream whose call was cancelled is refused even when the count
  matches (:mod:`._put_stream`).
* ``do_get`` streams one or more stored groups, projected, from C++ (``RecordBatchStream`` over a table
  that aliases the stored buffers: no Python loop per batch, no re-serialisation in Python).
* ``list_flights`` / ``get_flight_info`` / ``get_schema`` let any Flight client list and read groups.
* ``do_action``: ``delete``, ``fence``, ``advance_generation``, ``stats``, ``health``; with a shared-memory
  arena (:class:`~.shm._arena.ShmArena`) also ``shm_reserve`` / ``shm_publish`` / ``shm_abort`` (same-host
  writers write their groups straight into a segment, validated at publish) and ``shm_open`` (same-host
  readers get the segments of leased groups and map them read-only), also over the arena's Unix socket
  (:mod:`.shm._local`), which alone carries ``shm_put`` (a small group in one call). ``do_get`` serves the
  same memory.

Errors leave a handler only as Flight errors from :mod:`trajflight.flight_server._errors`.

It does not guarantee that :meth:`StorageServer.close` returns quickly while a client stalls a stream
(gRPC waits for in-flight calls): it gives up after its deadline and reports it; a process that must exit
then exits (see :mod:`trajflight.flight_server._cli`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from trajflight.auth import Claims, Keyring, Role, authorize
from trajflight.codec import STANDARD_SCHEMA, TrajectorySchema, validate_group, validate_groups
from trajflight.errors import (
    AuthenticationError,
    ConfigError,
    InvalidRequestError,
    PermissionDeniedError,
    SchemaError,
)
from trajflight.flight_server._auth import call_claims, check_bind, server_middleware
from trajflight.flight_server._errors import server_errors
from trajflight.flight_server._metrics import MetricsEndpoint, ServerMetrics
from trajflight.flight_server._put_stream import check_stream_schema, receive, receive_groups
from trajflight.flight_server._store import GroupStore, Stored, StoreLimits
from trajflight.flight_server._tls import TlsConfig, scheme
from trajflight.flight_server._wire import (
    WIRE_VERSION,
    AppendDescriptor,
    DeleteRequest,
    FenceRequest,
    GenerationRequest,
    GetTicket,
    GroupRead,
    PutManyDescriptor,
    ShmAbortRequest,
    ShmBatchPublishRequest,
    ShmBatchReserveRequest,
    ShmPublishRequest,
    ShmReserveRequest,
    decode_action_body,
    decode_criteria,
    decode_descriptor,
    decode_shm_put,
    decode_ticket,
    encode,
    group_descriptor,
)
from trajflight.flight_server._wire_bounds import echo
from trajflight.flight_server.shm._arena import ShmArena, host_id
from trajflight.flight_server.shm._local import LocalChannelServer, run_handler
from trajflight.flight_server.shm._store import ShmStore
from trajflight.keys import Partition

__all__ = ["ACTIONS", "FLIGHT_METHODS", "ROLES", "StorageServer"]

log = logging.getLogger("trajflight.flight_server")

ACTIONS: dict[str, str] = {
    "delete": (
        'Delete groups. Body {"v":1,"groups":[{"job_id","epoch","group_id","generation"}]}; each '
        "needs a lease generation >= the highest seen for the group. Idempotent. Result "
        '{"deleted","bytes_freed","missing"}.'
    ),
    "fence": (
        "Refuse puts of epochs of a job below min_epoch (stored groups stay, fenced by generation). "
        'Body {"v":1,"job_id","min_epoch","purge"?}; '
        'monotonic; purge also deletes stored groups of fenced epochs. Result {"job_id","min_epoch",'
        '"purged_groups","bytes_freed"}.'
    ),
    "advance_generation": (
        'Raise the highest lease generation of groups (the controller re-granted them). Body {"v":1,'
        '"groups":[{"job_id","epoch","group_id","generation"}]}. Result {"raised","missing"}: missing '
        "lists the groups the server neither stores nor is receiving."
    ),
    "stats": 'Groups, bytes, reservations, capacity, per job and epoch. Empty body or {"v":1}. Result: JSON.',
    "health": (
        'Liveness. Empty body or {"v":1}. Result {"status":"ok","location","wire_version","host_id",'
        '"shm_dir",...}; host_id and shm_dir let a client on the same host choose shared memory.'
    ),
    "shm_reserve": (
        'Same-host put, step 1 (servers with an arena). Body {"v":1,"writer"?,"ttl"?,"batch_bytes",'
        '"groups":[{"job_id","epoch","group_id","num_rows"}]}: the checks of a put, then one segment '
        'of batch_bytes for the groups, written as one stream. Result {"segments":[{"reservation","path",'
        '"capacity"}]}. Compact batch form: {"v":1,"writer"?,"ttl"?,"batch_bytes","batch":{"job_id",'
        '"epoch","group_ids":[...],"rows":[...]}}, result {"batch":{"reservation","path",'
        '"capacity"}}: one reservation for the whole batch.'
    ),
    "shm_publish": (
        'Same-host put, step 2. Body {"v":1,"groups":[{"reservation","size"}]}, or {"v":1,"batch":'
        '{"reservation","size"}} for a batch reserved in the compact form: validates each segment\'s IPC '
        'stream as do_put does and publishes all or none. Result {"published","bytes"}.'
    ),
    "shm_put": (
        "Same-host put of one small group in one call, on the same-host channel only (its Unix socket "
        "carries the group's IPC stream as a payload frame). Body like shm_reserve with one group whose "
        'nbytes is the payload size; checks and validation as for do_put. Result {"published","bytes"}.'
    ),
    "shm_abort": 'Give same-host reservations up. Body {"v":1,"reservations":[...]}. Result {"aborted"}.',
    "shm_open": (
        'Same-host read. Body like a do_get ticket {"v":1,"groups":[...],"columns"?}; tokens checked as '
        'for do_get. Result {"segments":[{"path","capacity","columns"}],"groups":[{"num_rows","parts":'
        "[[segment, first_row, rows]]}]}: map each segment read-only, one IPC stream at offset 0."
    ),
}
"""Action name -> description, as ``list_actions`` returns them (``docs/wire-format.md`` has more)."""

FLIGHT_METHODS = ("put", "append", "do_get", "list_flights", "get_flight_info", "get_schema", "list_actions")
"""The operations of the server that are not actions (``put`` and ``append`` are the two kinds of
``do_put``)."""

_ANY = (Role.WRITER, Role.TRAINER, Role.READER)
ROLES: dict[str, tuple[Role, ...]] = {
    "put": (Role.WRITER,),
    "append": (Role.TRAINER,),
    "do_get": (Role.TRAINER, Role.READER),
    "list_flights": (Role.TRAINER, Role.READER),
    "get_flight_info": (Role.TRAINER, Role.READER),
    "get_schema": (Role.TRAINER, Role.READER),
    "list_actions": _ANY,
    "delete": (Role.ADMIN,),
    "fence": (Role.ADMIN,),
    "advance_generation": (Role.TRAINER,),  # a trainer fences its new lease's groups (as a read does)
    "stats": _ANY,
    "health": _ANY,
    "shm_reserve": (Role.WRITER,),
    "shm_publish": (Role.WRITER,),
    "shm_put": (Role.WRITER,),
    "shm_abort": (Role.WRITER,),
    "shm_open": (Role.TRAINER, Role.READER),
}
"""Operation (every action and Flight method) -> the roles that may run it; admin may run all. The one
table the server checks (``tests/trajflight/test_auth_table.py`` checks it names every operation)."""


class StorageServer(flight.FlightServerBase):  # type: ignore[misc]  # pyarrow ships no type stubs
    """One trajflight storage server; starts serving on construction. Use it as a context manager.

    Args:
        host: Interface to listen on; loopback by default.
        port: TCP port; 0 picks a free one (see :attr:`location`).
        limits: Capacity and size bounds.
        schema: The trajectory schema puts are validated against.
        keyring: The deployment's keys (:func:`trajflight.auth.load_keyring`): every call then needs a
            bearer token they signed, with the role :data:`ROLES` names for its operation and its jobs
            in scope. None: no authentication (loopback only, unless ``insecure``).
        insecure: Serve a non-loopback ``host`` without a keyring (refused otherwise).
        arena: A shared-memory arena for same-host transport; the server owns it from now on and closes
            it (unlinking every segment) in :meth:`close`.
        shm_ttl: Seconds a same-host writer has between ``shm_reserve`` and ``shm_publish`` before its
            reservation is swept (a background thread sweeps twice a second): the default, and the most
            a writer's own ``ttl`` gets (it may ask for less, never more).
        tls: Serve ``grpc+tls://`` with this certificate and key; with its ``ca``, demand client
            certificates signed by it (mutual TLS). None: plaintext ``grpc://``.
        metrics_port: Serve Prometheus metrics (:attr:`metrics`) over HTTP on this port (0: a free one;
            :attr:`metrics_url` names it). None (the default): no endpoint; the metrics are still kept.
        metrics_host: Interface of the metrics endpoint; loopback by default.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        limits: StoreLimits | None = None,
        schema: TrajectorySchema = STANDARD_SCHEMA,
        keyring: Keyring | None = None,
        insecure: bool = False,
        arena: ShmArena | None = None,
        shm_ttl: float = 30.0,
        tls: TlsConfig | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise InvalidRequestError(f"port must be an int in 0..65535, got {port!r}")
        if isinstance(shm_ttl, bool) or not isinstance(shm_ttl, int | float) or not shm_ttl > 0:
            raise InvalidRequestError(f"shm_ttl must be a positive number of seconds, got {shm_ttl!r}")
        try:
            check_bind(host, keyring, insecure=insecure, what="the storage server")
        except ConfigError:
            if arena is not None:
                arena.close()
            raise
        self.keyring = keyring
        self.store: GroupStore = GroupStore(limits, schema=schema, arena=arena)
        self.arena = arena
        self.shm_ttl = float(shm_ttl)
        self.host_id = host_id()
        self._started = time.monotonic()
        self._close_lock = threading.Lock()
        self._closed = False
        self._stop_sweeper = threading.Event()
        try:
            super().__init__(
                f"{scheme(tls)}://{host}:{port}",
                middleware=server_middleware(keyring, self._count_refusal),
                **(tls.server_kwargs() if tls else {}),
            )
        except BaseException:
            if arena is not None:
                arena.close()
            raise
        self._location = f"{scheme(tls)}://{host}:{self.port}"
        self.metrics = ServerMetrics(self.store.stats, self._location)
        """This server's Prometheus metrics (its own registry); ``count_refusal`` is the credential hook."""
        self._metrics_endpoint: MetricsEndpoint | None = None
        if metrics_port is not None:
            try:
                self._metrics_endpoint = MetricsEndpoint(self.metrics.registry, metrics_host, metrics_port)
            except BaseException:
                self.shutdown()
                if arena is not None:
                    arena.close()
                raise
        self._local: LocalChannelServer | None = None
        if arena is not None:
            # Same-host clients send their (small) actions over a Unix socket in the private arena
            # directory: cheaper than a gRPC action (see shm/_local).
            self._local = LocalChannelServer(
                os.path.join(arena.directory, "ctl.sock"),
                run_handler(self._run_local),
                authenticate=None if keyring is None else keyring.verify,
            )
            threading.Thread(target=self._sweep_loop, name="trajflight-shm-sweeper", daemon=True).start()

    def _count_refusal(self, reason: str) -> None:
        """The middleware's hook: count a call refused before its handler (a call may arrive while the
        constructor is still making the metrics)."""
        metrics = getattr(self, "metrics", None)
        if metrics is not None:
            metrics.count_refusal(reason)

    def _run_local(
        self, name: str, body: bytes | bytearray, payload: bytes | bytearray, claims: Claims | None
    ) -> dict[str, Any]:
        """An action from the same-host channel; ``shm_put`` is the one that carries a payload.

        ``claims`` are the connection's (verified when it authenticated; the channel re-checks expiry)."""
        with self.metrics.timed(_op(name)):
            if self.keyring is not None and claims is None:
                raise AuthenticationError(
                    "no credential on the same-host channel: send the bearer token first (the client does "
                    "when it has one: connect(token=...) or TRAJFLIGHT_TOKEN)",
                    reason="missing",
                )
            if name == "shm_put":
                return self._shm_put_inline(body, payload, claims)
            if payload:
                raise InvalidRequestError(
                    f"action {echo(name)} takes no payload; only shm_put carries group bytes", field="payload"
                )
            return self._run_action(name, decode_action_body(name, body), claims)

    def _shm_put_inline(
        self, body: bytes | bytearray, payload: bytes | bytearray, claims: Claims | None
    ) -> dict[str, Any]:
        """One small group sent whole over the same-host channel (see :meth:`ShmStore.put_inline`).

        The body is a ``shm_reserve`` body naming exactly one group whose ``nbytes`` is the payload's
        size; the payload is the group's Arrow IPC stream."""
        request = decode_shm_put(body)
        (put,) = request.puts
        if put.nbytes != len(payload):
            raise InvalidRequestError(
                f"shm_put: the payload has {len(payload)} bytes, the body announces {put.nbytes}"
            )
        authorize(claims, "shm_put", ROLES["shm_put"], [put.key.job_id])
        group = self._shm().put_inline(put.key, payload, writer=request.writer, num_rows=put.num_rows)
        return {"published": 1, "bytes": group.nbytes}

    def _shm(self) -> ShmStore:
        shm = self.store.shm
        if shm is None:
            raise InvalidRequestError(
                "this server has no shared-memory arena (start it with --shm-dir); put and read over "
                "Flight (transport='flight')"
            )
        return shm

    def _sweep_loop(self) -> None:
        while not self._stop_sweeper.wait(0.5):
            try:
                self._shm().sweep()
            except Exception:  # never let the sweeper die on one bad segment
                log.exception("server %s: shared-memory sweep failed", self._location)

    @property
    def location(self) -> str:
        """The URI clients connect to, with the real port (``grpc://127.0.0.1:40123``)."""
        return self._location

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics`` of the Prometheus endpoint, or None without one."""
        return None if self._metrics_endpoint is None else self._metrics_endpoint.url

    # ------------------------------------------------------------------------------------ lifecycle

    def close(self, timeout: float = 5.0) -> bool:
        """Shut down from a helper thread, waiting at most ``timeout`` seconds; idempotent.

        Returns:
            True when the server stopped; False when in-flight calls (a stalled client) kept it up past
            the deadline. The gRPC server then stops when they end; a process that must exit now
            should exit (``os._exit``), as the CLI does.
        """
        with self._close_lock:
            if self._closed:
                return True
            self._closed = True
        # Calling shutdown() inside a handler deadlocks, and with a stalled DoGet it does not return:
        # always from another thread, with a deadline.
        done = threading.Event()

        def _shutdown() -> None:
            try:
                self.shutdown()
            finally:
                done.set()

        threading.Thread(target=_shutdown, name="trajflight-server-shutdown", daemon=True).start()
        stopped = done.wait(timeout)
        self._stop_sweeper.set()
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.close()
        if self._local is not None:
            self._local.close()
        if self.store.board is not None:
            self.store.board.close()  # readers that kept segments ask the server (gone) from now on
        if self.arena is not None:
            self.arena.close()  # unlinks every segment; mappings in other processes stay valid
        if stopped:
            return True
        log.warning(
            "server %s: shutdown still waiting for in-flight calls after %.1fs", self.location, timeout
        )
        return False

    def __enter__(self) -> StorageServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --------------------------------------------------------------------------------------- checks

    @staticmethod
    def _authorize(
        context: flight.ServerCallContext, operation: str, jobs: Sequence[str] = ()
    ) -> Claims | None:
        """Check the call's token against :data:`ROLES` for ``operation`` on ``jobs``; its claims."""
        claims: Claims | None = call_claims(context)
        authorize(claims, operation, ROLES[operation], jobs)
        return claims

    # ------------------------------------------------------------------------------------------ put

    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        """Receive a group (or appended columns) and publish it atomically; see the module docstring."""
        with server_errors("do_put"), self.metrics.timed("do_put"):
            request = decode_descriptor(descriptor)
            if isinstance(request, AppendDescriptor):
                self._authorize(context, "append", [request.key.job_id])
                self._append(context, request, reader)
                return
            if isinstance(request, PutManyDescriptor):
                self._authorize(context, "put", [p.key.job_id for p in request.puts])
                self._put_many(context, request, reader)
                return
            if isinstance(request, Partition):
                raise InvalidRequestError(
                    "a path-descriptor put names its row count: FlightDescriptor.for_path(job_id, "
                    "str(epoch), str(group_id), str(num_rows)); a stream's end alone does not prove the "
                    "group complete (a writer that fails mid-stream may still close it cleanly)",
                    field="num_rows",
                )
            self._authorize(context, "put", [request.key.job_id])
            key, schema = request.key, check_stream_schema(reader.schema)
            with self.store.begin_put(key, schema, request.nbytes) as res:
                batches = receive(context, reader, res, f"put of group {key.group_id}")
                rows = sum(b.num_rows for b in batches)
                if rows == 0:
                    raise InvalidRequestError(f"put of group {key.group_id}: the stream carried no samples")
                if request.num_rows is not None and rows != request.num_rows:
                    raise InvalidRequestError(
                        f"put of group {key.group_id}: {rows} rows arrived, {request.num_rows} announced; "
                        "the stream was cut short: put the group again",
                    )
                for batch in batches:
                    validate_group(batch, self.store.schema, expect=key, full=True)
                self.store.publish(res, batches, schema, request.writer)

    def _put_many(
        self,
        context: flight.ServerCallContext,
        request: PutManyDescriptor,
        reader: flight.MetadataRecordBatchReader,
    ) -> None:
        puts = request.puts
        for put in puts:
            if not put.num_rows:
                raise InvalidRequestError(f"put_many: group {put.key.group_id} announces no samples")
        schema = check_stream_schema(reader.schema)
        keys = [p.key for p in puts]
        # One admission for the whole stream (one hold of the store's lock, the schema checked once).
        reservations = self.store.begin_puts(keys, [p.nbytes or 0 for p in puts], schema)
        try:
            per_group = receive_groups(context, reader, puts, reservations)
            # The stream's batches share its schema: validated as one table, group by group where unsure.
            stream = pa.Table.from_batches([b for batches in per_group for b in batches], schema)
            validate_groups(stream, self.store.schema, keys, [p.num_rows or 0 for p in puts])
            self.store.publish_many(list(zip(reservations, per_group, strict=True)), schema, request.writer)
        finally:
            for res in reservations:
                res.release()  # a no-op for those published

    def _append(
        self,
        context: flight.ServerCallContext,
        request: AppendDescriptor,
        reader: flight.MetadataRecordBatchReader,
    ) -> None:
        schema = check_stream_schema(reader.schema)
        for name in ("job_id", "epoch", "group_id", "sample_index"):
            if name in schema.names:
                raise SchemaError(
                    f"column {echo(name)} is a key column; appends add new columns only", column=name
                )
        with self.store.begin_append(request.key, request.token, schema, request.nbytes) as res:
            batches = receive(context, reader, res, f"column append to group {request.key.group_id}")
            for batch in batches:
                batch.validate(full=True)
            self.store.publish_append(res, request.token, batches, schema)

    # ------------------------------------------------------------------------------------------ get

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.RecordBatchStream:
        """Stream the groups a ticket names, projected; C++ drives the stream over the stored buffers."""
        with server_errors("do_get"), self.metrics.timed("do_get"):
            request = decode_ticket(ticket.ticket)
            claims = self._authorize(context, "do_get", [r.key.job_id for r in request.groups])
            _no_lease_for_readers(claims, request.groups, "do_get")
            return flight.RecordBatchStream(self.store.read(request.groups, request.columns))

    # ---------------------------------------------------------------------------------------- flights

    def _info(self, group: Stored) -> flight.FlightInfo:
        ticket = flight.Ticket(encode(GetTicket((GroupRead(group.key),))))
        endpoint = flight.FlightEndpoint(ticket, [self._location])
        return flight.FlightInfo(
            group.schema, group_descriptor(group.key), [endpoint], group.num_rows, group.nbytes
        )

    def list_flights(self, context: flight.ServerCallContext, criteria: bytes) -> Iterator[flight.FlightInfo]:
        """One FlightInfo per stored group matching the criteria (empty, or ``{"v":1,"job_id","epoch"}``)."""
        with server_errors("list_flights"):
            criteria_ = decode_criteria(criteria)
            claims = self._authorize(
                context, "list_flights", [] if criteria_.job_id is None else [criteria_.job_id]
            )
            groups = self.store.list_groups(criteria_)
        for group in groups:
            if claims is None or claims.covers(group.key.job_id):  # a scoped token lists its jobs only
                yield self._info(group)

    def _group_of(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor, operation: str
    ) -> Stored:
        key = decode_descriptor(descriptor)
        if not isinstance(key, Partition):
            raise InvalidRequestError(
                "flight info needs a group descriptor: path [job_id, epoch, group_id] or "
                '{"v":1,"kind":"group",...}'
            )
        self._authorize(context, operation, [key.job_id])
        return self.store.get(key)

    def get_flight_info(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        """Schema, rows, bytes and an endpoint (ticket + location) for one stored group."""
        with server_errors("get_flight_info"):
            return self._info(self._group_of(context, descriptor, "get_flight_info"))

    def get_schema(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.SchemaResult:
        """The stored schema of one group.

        pyarrow's get_schema callback does not turn a FlightError into its Flight status (its
        get_flight_info callback does): a refusal reaches the client as an unknown error whose text
        carries ``[trajflight:<code>]`` and the handler's traceback, so it is raised unchained here."""
        try:
            with server_errors("get_schema"):
                return flight.SchemaResult(self._group_of(context, descriptor, "get_schema").schema)
        except flight.FlightError as exc:
            raise exc.with_traceback(None) from None

    # ---------------------------------------------------------------------------------------- actions

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        """Every action with its description."""
        with server_errors("list_actions"):
            self._authorize(context, "list_actions")
        return list(ACTIONS.items())

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> list[flight.Result]:
        """Run one action; the result is one JSON message."""
        name = action.type
        with server_errors(f"action {echo(name)}"), self.metrics.timed(_op(name)):
            claims = call_claims(context)
            if name not in ROLES:  # an unknown action: the decoder names the known ones
                authorize(claims, f"action {echo(name)}", (Role.ADMIN,))
            body = decode_action_body(name, action.body.to_pybytes() if action.body is not None else b"")
            result = self._run_action(name, body, claims)
            return [flight.Result(json.dumps(result).encode())]

    def _run_action(self, name: str, body: Any, claims: Claims | None) -> dict[str, Any]:
        authorize(claims, name, ROLES[name], _jobs_of(body))
        if isinstance(body, GetTicket):
            _no_lease_for_readers(claims, body.groups, name)
        if isinstance(body, DeleteRequest):
            return self.store.delete(body.groups)
        if isinstance(body, GenerationRequest):
            raised, absent = self.store.advance_generation(body.groups)
            return {"raised": raised, "missing": absent}
        if isinstance(body, FenceRequest):
            return self.store.fence(body.job_id, body.min_epoch, purge=body.purge)
        if name.startswith("shm_"):  # shm_reserve, shm_publish, shm_abort, shm_open (decoded above)
            return self._shm_action(body)
        if name == "stats":
            return self.store.stats()
        stats = self.store.stats()
        return {
            "status": "ok",
            "location": self._location,
            "wire_version": WIRE_VERSION,
            "uptime_s": round(time.monotonic() - self._started, 3),
            "groups": stats["groups"],
            "bytes": stats["bytes"],
            "free_bytes": stats["free_bytes"],
            "authenticated": self.keyring is not None,
            "host_id": self.host_id,
            "shm_dir": None if self.arena is None else self.arena.directory,
            "shm_socket": None if self._local is None else self._local.path,
            "metrics": self.metrics_url,
        }

    def _shm_deadline(self, asked: float | None) -> float:
        """The seconds a same-host reservation lives: what the writer asked for, at most ``shm_ttl``.

        A writer asks for its own put deadline (15-60 s); a killed writer's segment must come back at the
        server's own limit, not at the deadline of the process that died."""
        return self.shm_ttl if asked is None else min(asked, self.shm_ttl)

    def _shm_action(self, body: Any) -> dict[str, Any]:
        if isinstance(body, ShmBatchReserveRequest | ShmReserveRequest):
            return self._shm_reserve(body)
        if isinstance(body, ShmBatchPublishRequest | ShmPublishRequest):
            items = body.items if isinstance(body, ShmPublishRequest) else ((body.reservation, body.size),)
            published = self._shm().publish(items)
            return {"published": len(published), "bytes": sum(g.nbytes for g in published)}
        if isinstance(body, ShmAbortRequest):
            return {"aborted": self._shm().abort(body.reservations)}
        return self._shm_open(body)

    def _shm_reserve(self, body: ShmBatchReserveRequest | ShmReserveRequest) -> dict[str, Any]:
        """One segment for the groups a ``shm_reserve`` names (either form)."""
        shm = self._shm()
        rows: list[int | None]
        if isinstance(body, ShmBatchReserveRequest):
            keys, rows = body.keys(), list(body.rows)
        else:
            keys, rows = [p.key for p in body.puts], [p.num_rows for p in body.puts]
        nbytes = body.batch_bytes or 0  # the decoder requires it of shm_reserve; 0 is refused
        put = shm.reserve(keys, rows, nbytes, writer=body.writer, ttl=self._shm_deadline(body.ttl))
        seg = put.segment
        if isinstance(body, ShmBatchReserveRequest):
            return {"batch": {"reservation": put.id, "path": seg.path, "capacity": seg.capacity}}
        return {
            "segments": [
                {"reservation": rid, "path": seg.path, "capacity": seg.capacity} for rid in put.member_ids()
            ]
        }

    def _shm_open(self, ticket: GetTicket) -> dict[str, Any]:
        """The segments of the ticket's groups for a same-host reader (the result of ``shm_open``)."""
        self._shm()
        opened = self.store.shm_open(ticket.groups, ticket.columns)
        # A stream is listed once (the groups of a batch put together share one segment; in a slab of
        # small groups each group's own stream sits at its byte "offset", omitted when 0); each group
        # names its parts as [stream index, first row in that stream, rows].
        index: dict[tuple[int, int], int] = {}
        segments: list[dict[str, Any]] = []
        groups: list[dict[str, Any]] = []
        for g, fence in opened:
            parts = []
            for i, seg in enumerate(g.segments):
                start = g.start(i)
                at = index.get((id(seg), start))
                if at is None:
                    at = index[(id(seg), start)] = len(segments)
                    entry = {"path": seg.path, "capacity": seg.capacity, "columns": g.parts[i].column_names}
                    if start:
                        entry["offset"] = start
                    segments.append(entry)
                parts.append([at, g.row_offset(i), g.num_rows])
            groups.append({"num_rows": g.num_rows, "parts": parts, "fence": fence})
        return {
            "segments": segments,
            "groups": groups,
            "fences": None if self.store.board is None else self.store.board.path,
        }


def _op(name: str) -> str:
    """The ``op`` label of an action: its name when it is one, else ``unknown`` (callers choose names)."""
    return name if name in ACTIONS else "unknown"


def _no_lease_for_readers(claims: Claims | None, reads: Sequence[GroupRead], operation: str) -> None:
    """A reader reads without lease tokens: a token raises the group's generation, fencing its holder."""
    if claims is not None and claims.role is Role.READER and any(r.token is not None for r in reads):
        raise PermissionDeniedError(
            f"{operation} under a lease token needs role trainer; a reader credential reads without "
            "tokens (it never affects a lease): drop the generation, or use a trainer credential",
            reason="role",
            operation=operation,
        )


def _jobs_of(body: Any) -> list[str]:
    """The jobs a decoded action body touches (none for stats, health and reservation ids: a reservation
    id is a random capability only the writer that reserved it, for its job, was given)."""
    if isinstance(body, DeleteRequest | GenerationRequest | GetTicket):
        return [r.key.job_id for r in body.groups]
    if isinstance(body, FenceRequest):
        return [body.job_id]
    if isinstance(body, ShmBatchReserveRequest):
        return [body.job_id]
    if isinstance(body, ShmReserveRequest):
        return [p.key.job_id for p in body.puts]
    return []
