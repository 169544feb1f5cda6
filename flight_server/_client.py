"""The low-level client of the storage server, and parallel calls to several servers.

One route per transport: :meth:`StorageClient.put_groups` and :meth:`StorageClient.get` over Flight,
:meth:`StorageClient.shm_put_groups` and :meth:`StorageClient.shm_get` through the server's shared-memory
arena (same host only; the work is :class:`~.shm._client.ShmClient`'s). A list of groups is put in one
call, published all together or not at all; one group is a list of one.

Every call has a deadline (``FlightCallOptions(timeout=...)``): a server that accepts TCP but never
answers costs at most the timeout. Reads use ``IpcReadOptions(ensure_alignment=...)`` (Flight receive
buffers can be misaligned; DLPack consumers need natural alignment). Errors come back as the trajflight
classes the server raised (:mod:`trajflight.flight_server._errors`).

Tables returned by Flight reads own their memory (received buffers, or aligned copies of them); they
alias nothing on the server. Tables returned by same-host reads alias read-only mappings of the server's
shared-memory segments instead (no copy; valid after the group is deleted, until the last reference is
dropped). Inputs to puts are only read, never kept.

This module does not retry: capacity refusals carry ``retry_after`` for the caller's own policy, and a
failed put leaves nothing stored, so putting the same groups again is safe.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import wait
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc

from trajflight.auth import Credential
from trajflight.errors import DeadlineExceededError, InvalidRequestError, TrajflightError
from trajflight.flight_server._auth import CredentialSource, call_headers, credential_source
from trajflight.flight_server._errors import translate_errors
from trajflight.flight_server._tls import TlsConfig, client_kwargs
from trajflight.flight_server._wire import (
    AppendDescriptor,
    DeleteRequest,
    FenceRequest,
    GenerationRequest,
    GetTicket,
    GroupRead,
    LeaseToken,
    ListCriteria,
    PutDescriptor,
    PutManyDescriptor,
    encode,
    encode_json,
)
from trajflight.flight_server._workers import shared_workers
from trajflight.flight_server.shm._client import INLINE_PUT_BYTES, ShmClient
from trajflight.flight_server.shm._reader import ShmOpened
from trajflight.keys import Partition

T = TypeVar("T")

__all__ = ["INLINE_PUT_BYTES", "GroupListing", "ShmOpened", "StorageClient", "get_parallel", "run_parallel"]


@dataclass(frozen=True, slots=True)
class GroupListing:
    """What ``list_flights`` says about one stored group (:meth:`StorageClient.list_groups`).

    Attributes:
        key: The partition.
        schema: Its columns.
        num_rows: Samples.
        nbytes: Bytes the server holds for it.
        ticket: A ticket any Flight client can pass to ``do_get``.
        locations: Where to read it (empty: the same server).
    """

    key: Partition
    schema: pa.Schema
    num_rows: int
    nbytes: int
    ticket: bytes
    locations: tuple[str, ...]


def _sent_bytes(batch: pa.RecordBatch) -> int:
    """The bytes a server holds for ``batch`` sent in a ``do_put``: its IPC message, an upper bound of the
    buffers the server decodes it to (within the message's metadata and padding, under 1 KiB).

    Not ``get_total_buffer_size()``: a slice (a group of an ``EncodedGroups``) points into its parent's
    buffers, and IPC writes only the slice's rows, so that counts every group at the whole batch. Not
    ``RecordBatch.nbytes``: it walks every list's offsets, several times the cost of this.
    """
    return ipc.get_record_batch_size(batch)


def _read_stream(reader: flight.FlightStreamReader) -> pa.Table:
    """The rest of a ``do_get`` stream as one table, read chunk by chunk.

    Not ``reader.read_all()``: it runs under pyarrow's SignalStopHandler (apache/arrow#10318,
    ARROW-12050), which turns any ArrowCancelled, a server's CANCELLED status included, into a simulated
    SIGINT: a KeyboardInterrupt in the main thread, whichever thread read, instead of an error here.
    """
    schema = reader.schema
    batches: list[pa.RecordBatch] = []
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return pa.Table.from_batches(batches, schema)
        if chunk.data is not None:
            batches.append(chunk.data)


def _as_read(group: Partition | GroupRead) -> GroupRead:
    if isinstance(group, GroupRead):
        return group
    if isinstance(group, Partition):
        return GroupRead(group)
    raise InvalidRequestError(f"expected a Partition or GroupRead, got {type(group).__name__}")


class StorageClient:
    """A connection to one storage server. Thread-safe; use one per server and share it across threads.

    Args:
        location: ``grpc://host:port`` of the server.
        timeout: Default deadline of every call, seconds.
        write_size_limit_bytes: Largest record batch sent in one message; a larger group is split by rows
            into several batches of the same group (one put, one atomic publish). None: no limit.
        alignment: ``ensure_alignment`` of reads; ``DataTypeSpecific`` copies only misaligned buffers.
        inline_put_bytes: Same-host puts of a lone group whose IPC stream is at most this large travel in
            one ``shm_put`` call (see :data:`~.shm._client.INLINE_PUT_BYTES`); 0 always reserves a segment.
        tls: TLS material for a ``grpc+tls://`` location: the CA that signed the server's certificate
            (None: the system's roots), and this client's certificate and key for mutual TLS.
        credential: The bearer token of every call, for a server that authenticates: a
            :class:`~trajflight.auth.Credential`, or a callable asked before each call for the current one
            (a refreshing token). None: calls carry no token.
    """

    def __init__(
        self,
        location: str,
        *,
        timeout: float = 30.0,
        write_size_limit_bytes: int | None = None,
        alignment: ipc.Alignment = ipc.Alignment.DataTypeSpecific,
        inline_put_bytes: int = INLINE_PUT_BYTES,
        tls: TlsConfig | None = None,
        credential: Credential | CredentialSource | None = None,
    ) -> None:
        if timeout <= 0:
            raise InvalidRequestError(f"timeout must be > 0 seconds, got {timeout!r}")
        if write_size_limit_bytes is not None and write_size_limit_bytes <= 0:
            raise InvalidRequestError(f"write_size_limit_bytes must be > 0, got {write_size_limit_bytes!r}")
        self.location = location
        self.timeout = float(timeout)
        self.write_size_limit_bytes = write_size_limit_bytes
        self._read_options = ipc.IpcReadOptions(ensure_alignment=alignment)
        self._credential = credential_source(credential)
        # Through self._action at each call (not the bound method of now): one action route to patch.
        self._shm = ShmClient(
            lambda name, body, t: self._action(name, body, t),
            self.timeout,
            inline_put_bytes,
            self._credential,
        )
        with translate_errors(f"connect to {location}"):
            self._client = flight.FlightClient(
                location, write_size_limit_bytes=write_size_limit_bytes or 0, **client_kwargs(location, tls)
            )

    @property
    def inline_put_bytes(self) -> int:
        """Lone groups whose IPC stream is at most this large travel in one ``shm_put`` call."""
        return self._shm.inline_put_bytes

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._shm.close()
        self._client.close()

    def use_local_channel(self, path: str | None) -> None:
        """Send actions over the server's same-host Unix socket (``health()["shm_socket"]``) from now on;
        None goes back to Flight. Only for a server on this host (the caller checked its host id)."""
        self._shm.use_local_channel(path)

    def __enter__(self) -> StorageClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _options(self, timeout: float | None) -> flight.FlightCallOptions:
        return flight.FlightCallOptions(
            timeout=self.timeout if timeout is None else timeout,
            read_options=self._read_options,
            headers=call_headers(self._credential),
        )

    # ------------------------------------------------------------------------------------------ writes

    def _batches(self, data: pa.RecordBatch | pa.Table) -> tuple[list[pa.RecordBatch], int, int]:
        """The batches to send (split by rows to respect the write size limit), their bytes and rows."""
        if isinstance(data, pa.RecordBatch):
            batches = [data]
        elif isinstance(data, pa.Table):
            batches = data.to_batches()
        else:
            raise InvalidRequestError(f"expected a pyarrow RecordBatch or Table, got {type(data).__name__}")
        nbytes = sum(map(_sent_bytes, batches))
        rows = sum(b.num_rows for b in batches)
        limit = self.write_size_limit_bytes
        if limit is not None and nbytes > limit and rows > 1:
            chunk = max(1, int(rows * limit / nbytes / 2))  # half the limit: framing headroom
            batches = [b.slice(i, chunk) for b in batches for i in range(0, b.num_rows, chunk)]
        return batches, nbytes, rows

    def _put(
        self,
        descriptor: bytes,
        batches: list[pa.RecordBatch],
        schema: pa.Schema,
        timeout: float | None,
        what: str,
    ) -> None:
        with translate_errors(what):
            writer, _ = self._client.do_put(
                flight.FlightDescriptor.for_command(descriptor), schema, options=self._options(timeout)
            )
            try:
                for batch in batches:
                    writer.write_batch(batch)
                # Never read the metadata stream before done_writing(): that hangs (pyarrow 26).
                writer.done_writing()
            except BaseException:
                # The server refused mid-stream (capacity, schema): its status, not the broken write, is
                # the error to report; close() raises it.
                writer.close()
                raise
            writer.close()

    def put_groups(
        self,
        groups: Sequence[tuple[Partition, pa.RecordBatch | pa.Table]],
        *,
        writer: str = "",
        timeout: float | None = None,
    ) -> None:
        """Put whole groups in one Flight stream: all become visible together, or none does.

        The one Flight route of a put (one group is a list of one); each group is visible to readers only
        once every row of the call arrived. Every group needs the same schema; its key columns must
        match its key.

        Args:
            groups: ``(key, data)`` per group (read, not kept).
            writer: Writer id for logs and stats.
            timeout: Deadline of the whole put.

        Raises:
            AlreadyExistsError, StaleFenceError (fenced epoch), LeaseExpiredError (a deleted partition),
            SchemaError, CapacityExceededError (with ``retry_after``), InvalidRequestError,
            DeadlineExceededError, UnavailableError; on any error nothing of this call is stored.
        """
        if not groups:
            return
        schema = groups[0][1].schema
        puts: list[PutDescriptor] = []
        batches: list[pa.RecordBatch] = []
        for key, data in groups:
            if not data.schema.equals(schema):
                raise InvalidRequestError(
                    f"put_groups: group {key.group_id} has another schema than the first group; put groups "
                    "of different schemas separately"
                )
            group_batches, nbytes, rows = self._batches(data)
            puts.append(PutDescriptor(key, nbytes=nbytes, num_rows=rows))
            batches.extend(b for b in group_batches if b.num_rows)
        descriptor = PutManyDescriptor(tuple(puts), writer)
        self._put(encode(descriptor), batches, schema, timeout, f"put of {len(groups)} groups")

    def append_columns(
        self,
        key: Partition,
        data: pa.RecordBatch | pa.Table,
        token: LeaseToken,
        *,
        timeout: float | None = None,
    ) -> None:
        """Add new columns (one value per stored row, in stored order) to a group, under a lease token.

        Existing columns are not rewritten; readers see the group with or without all new columns.

        Raises:
            StaleFenceError (older generation), NotFoundError, AlreadyExistsError (a column
            exists), SchemaError (row count or type), CapacityExceededError.
        """
        batches, nbytes, _ = self._batches(data)
        descriptor = AppendDescriptor(key, token, nbytes=nbytes)
        self._put(encode(descriptor), batches, data.schema, timeout, f"column append to group {key.group_id}")

    # ------------------------------------------------------------------------------------- same host

    def shm_put_groups(
        self,
        groups: Sequence[tuple[Partition, pa.RecordBatch | pa.Table]],
        *,
        joined: pa.RecordBatch | None = None,
        writer: str = "",
        ttl: float | None = None,
        timeout: float | None = None,
    ) -> None:
        """Put groups through the server's shared-memory arena (same host only): no socket copy.

        The one same-host route of a put (one group is a list of one): one ``shm_reserve`` call admits
        every group (every check of a put runs there) and gets one segment, the groups are written into
        it as one Arrow IPC stream (one copy, from the data into the shared pages), and one
        ``shm_publish`` call validates and publishes them all at once, or none; on any failure the
        reservation is given up. Several groups are joined into one batch for the stream (one more copy
        here, unless ``joined`` is given), so a reader of them in this order gets one slice with no copy;
        the segment is freed when the last of them is deleted. A lone group whose stream is at most
        :attr:`inline_put_bytes` travels whole in one ``shm_put`` call instead (once the client uses the
        server's socket). ``data`` and ``joined`` are read, not kept.

        Args:
            groups: ``(key, data)`` per group, in stream order; every group needs the same schema.
            joined: The groups' rows already joined in one batch, in order (a writer's
                ``encode_groups``): written as it is, with no copy here.
            writer: Writer id for logs and stats.
            ttl: Seconds the server waits for the publish before dropping the reservation (its default).
            timeout: Deadline of each of the two calls.

        Raises:
            Like :meth:`put_groups`; InvalidRequestError where the server has no arena or ``joined`` does
            not hold the groups' rows; NotFoundError when a segment is not visible from this process
            (not the same host).
        """
        self._shm.put(groups, joined=joined, writer=writer, ttl=ttl, timeout=timeout)

    def shm_open(
        self,
        groups: Sequence[Partition | GroupRead],
        *,
        columns: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> ShmOpened:
        """Ask the server for the segments of groups (same host only), under the read checks of :meth:`get`.

        One ``shm_open`` call: tokens are fenced (and raise the groups' generations, so this is also what
        ``advance_generation`` does), projected columns must be stored. Nothing is mapped yet: pass the
        result to :meth:`shm_get` (now or later, any number of times) to read without another call.

        Raises:
            NotFoundError, StaleFenceError, SchemaError, InvalidRequestError (no arena on the server),
            DeadlineExceededError.
        """
        return self._shm.open(tuple(_as_read(g) for g in groups), columns, timeout)

    def shm_get(
        self,
        groups: Sequence[Partition | GroupRead],
        *,
        columns: Sequence[str] | None = None,
        timeout: float | None = None,
        opened: ShmOpened | None = None,
    ) -> pa.Table:
        """Read groups through shared memory (same host only): map their segments read-only, no copy.

        The one same-host route of a read. The lease tokens are checked by the server as for :meth:`get`
        (``shm_open``). When ``opened`` (from :meth:`shm_open` under the same tokens) covers every group
        and column and the server's fence board shows every group unchanged at those tokens'
        generations, no call is made at all (a re-granted lease, a delete or an append changes the board,
        and the read goes to the server, which refuses or answers afresh). The result aliases read-only
        mappings of the segments (its buffers are neither received nor copied); the mappings stay valid
        after the group is deleted and are unmapped when the last buffer over them is dropped. Never write
        through tensors decoded from it (``torch.from_dlpack`` ignores the read-only flag; a write faults
        the process).

        Raises:
            NotFoundError (also when a segment is gone or not visible from this host), StaleFenceError,
            SchemaError, InvalidRequestError (no arena on the server), DeadlineExceededError.
        """
        # The very tuple ``opened`` was opened with skips the per-group work of a kept open.
        reads = (
            opened.reads if opened is not None and groups is opened.reads else tuple(map(_as_read, groups))
        )
        return self._shm.get(reads, columns, timeout, opened)

    def shm_lock(self, opened: ShmOpened) -> bool:
        """Map (and so lock against reuse) the segments of ``opened``'s reads now, ahead of the first read.

        Whether the groups are still stored after the mapping is checked on the fence board, as every
        read checks it; the answer is returned (False: a read will ask the server, as for any open the
        board does not vouch for). A trainer that maps at lease time keeps its groups' bytes from being
        recycled from then on, and its first read has nothing left to map.
        """
        return self._shm.lock(opened)

    # ------------------------------------------------------------------------------------------- reads

    def get(
        self,
        groups: Sequence[Partition | GroupRead],
        *,
        columns: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> pa.Table:
        """Read groups in one stream, rows in the order given, projected to ``columns``.

        The result owns its memory (nothing aliases the server). Groups of one job share column types;
        a column appended to only some groups reads as null for the others (unless projected, then it is
        an error).

        Raises:
            NotFoundError, StaleFenceError, SchemaError (unknown projected column), DeadlineExceededError.
        """
        ticket = GetTicket(tuple(_as_read(g) for g in groups), None if columns is None else tuple(columns))
        with translate_errors("get"):
            reader = self._client.do_get(flight.Ticket(encode(ticket)), options=self._options(timeout))
            return _read_stream(reader)

    def list_groups(
        self, job_id: str | None = None, epoch: int | None = None, *, timeout: float | None = None
    ) -> list[GroupListing]:
        """Stored groups, optionally of one job and epoch, sorted by key."""
        criteria = encode(ListCriteria(job_id, epoch)) if job_id is not None or epoch is not None else b""
        out = []
        with translate_errors("list_flights"):
            for info in self._client.list_flights(criteria, options=self._options(timeout)):
                job, ep, gid = (p.decode() for p in info.descriptor.path)
                endpoint = info.endpoints[0]
                out.append(
                    GroupListing(
                        Partition(job, int(ep), int(gid)),
                        info.schema,
                        info.total_records,
                        info.total_bytes,
                        endpoint.ticket.ticket,
                        tuple(loc.uri.decode() for loc in endpoint.locations),
                    )
                )
        return out

    # ----------------------------------------------------------------------------------------- actions

    def _action(self, name: str, body: bytes, timeout: float | None) -> dict[str, Any]:
        local = self._shm.local
        if local is not None:
            return local.call(name, body, self.timeout if timeout is None else timeout)
        with translate_errors(f"action {name}"):
            results = list(self._client.do_action(flight.Action(name, body), options=self._options(timeout)))
        if len(results) != 1:
            raise TrajflightError(f"action {name}: expected one result, got {len(results)}")
        value: dict[str, Any] = json.loads(results[0].body.to_pybytes())
        return value

    def delete(self, groups: Sequence[GroupRead], *, timeout: float | None = None) -> dict[str, Any]:
        """Delete groups under their lease tokens; idempotent.

        Returns:
            ``{"deleted", "bytes_freed", "missing"}``.

        Raises:
            StaleFenceError: a token is missing or stale (nothing was deleted).
        """
        return self._action("delete", encode(DeleteRequest(tuple(groups))), timeout)

    def fence(
        self,
        job_id: str,
        min_epoch: int,
        *,
        purge: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Refuse puts of every epoch of ``job_id`` below ``min_epoch`` on this server (controller's call).

        Stored groups of those epochs stay (reads, appends, deletes are fenced by lease generation) unless
        ``purge`` deletes them.
        """
        return self._action("fence", encode(FenceRequest(job_id, min_epoch, purge)), timeout)

    def advance_generation(
        self, groups: Sequence[GroupRead], *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Raise the highest lease generation of groups (controller's call after a re-grant)."""
        return self._action("advance_generation", encode(GenerationRequest(tuple(groups))), timeout)

    def stats(self, *, timeout: float | None = None) -> dict[str, Any]:
        """Groups, bytes, reservations, capacity and per-job counts of the server."""
        return self._action("stats", encode_json({}), timeout)

    def health(self, *, timeout: float | None = None) -> dict[str, Any]:
        """Liveness: ``{"status": "ok", ...}``; raises UnavailableError/DeadlineExceededError otherwise."""
        return self._action("health", b"", timeout)

    def list_actions(self, *, timeout: float | None = None) -> list[tuple[str, str]]:
        """``(name, description)`` of every action the server offers."""
        with translate_errors("list_actions"):
            return [
                (a.type, a.description) for a in self._client.list_actions(options=self._options(timeout))
            ]


def run_parallel(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Run calls at once, each on its own thread (the first runs on this thread, the others on kept
    threads, :mod:`~trajflight.flight_server._workers`: none is started per call); results in call order.

    Flight releases the GIL while it streams, so calls to several servers overlap. The kept threads are
    named ``trajflight-call-<n>``.

    Raises:
        The first error in call order, once every call ended.
    """
    if len(calls) <= 1:
        return [call() for call in calls]
    workers = shared_workers()
    futures = [workers.submit(call) for call in calls[1:]]
    first: list[T] = []
    error: BaseException | None = None
    try:
        first.append(calls[0]())
    except BaseException as exc:  # raised once every call ended, as the others' errors are
        error = exc
    wait(futures)
    if error is not None:
        raise error
    return first + [f.result() for f in futures]


def get_parallel(
    requests: Sequence[tuple[StorageClient, Sequence[Partition | GroupRead]]],
    *,
    columns: Sequence[str] | None = None,
    timeout: float = 30.0,
) -> list[pa.Table]:
    """Read from several servers at once: one stream per server, each on its own thread.

    Flight releases the GIL while streaming, so the streams overlap. One deadline covers the whole call.

    Args:
        requests: ``(client, groups)`` per server.
        columns: Projection applied on every server.
        timeout: Deadline of the whole call, seconds.

    Returns:
        One table per request, in request order (each owns its memory).

    Raises:
        The first error in request order (after every stream ended or hit the deadline).
    """
    if not requests:
        return []
    deadline = time.monotonic() + timeout

    def _one(request: tuple[StorageClient, Sequence[Partition | GroupRead]]) -> pa.Table:
        client, groups = request
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceededError(
                f"get_parallel: deadline of {timeout:g}s passed before {client.location}"
            )
        return client.get(groups, columns=columns, timeout=remaining)

    return run_parallel([functools.partial(_one, r) for r in requests])
