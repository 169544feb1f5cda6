"""The low-level client of the storage server, and parallel reads from several servers.

Every call has a deadline (``FlightCallOptions(timeout=...)``): a server that accepts TCP but never
answers costs at most the timeout. Reads use ``IpcReadOptions(ensure_alignment=...)`` (Flight receive
buffers can be misaligned; DLPack consumers need natural alignment). Errors come back as the trajflight
classes the server raised (:mod:`trajflight.flight_server._errors`).

Tables returned by Flight reads own their memory (received buffers, or aligned copies of them); they
alias nothing on the server. Tables returned by same-node reads (:meth:`StorageClient.shm_get`) alias
read-only mappings of the server's shared-memory segments instead (no copy; valid after the group is
deleted, until the last reference is dropped). Inputs to puts are only read, never kept.

This module does not retry: capacity refusals carry ``retry_after`` for the caller's own policy, and a
failed put leaves nothing stored, so putting the same group again is safe.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc

from trajflight.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    NotFoundError,
    TrajflightError,
    UnavailableError,
)
from trajflight.flight_server._errors import translate_errors
from trajflight.flight_server._segments import (
    heap_placement,
    join_batches,
    serialize_segment,
    stream_size,
    write_stream,
)
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
    ShmAbortRequest,
    ShmBatchPublishRequest,
    ShmBatchReserveRequest,
    ShmPublishRequest,
    ShmReserveRequest,
    encode,
    encode_json,
)
from trajflight.flight_server.shm._fences import MappedBoard
from trajflight.flight_server.shm._local import MAX_FRAME, LocalChannel
from trajflight.flight_server.shm._reader import ShmOpened
from trajflight.flight_server.shm._writer import SegmentWriter
from trajflight.keys import Partition

__all__ = ["INLINE_PUT_BYTES", "GroupInfo", "ShmOpened", "StorageClient", "get_parallel"]


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """What ``list_flights`` says about one stored group.

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


INLINE_PUT_BYTES = 256 * 1024
"""Same-host puts of one group up to this size send its bytes in the single ``shm_put`` call (over the
server's Unix socket) instead of reserving a segment, writing it and publishing it in two calls. Measured
here on a group of 8 samples (130 KB): one round trip saved (~0.1-0.2 ms) against two extra copies of the
payload (~0.03 ms); at 1 MiB the copies cost as much as the round trip."""


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
        inline_put_bytes: Same-host puts of one group whose IPC stream is at most this large travel in
            one ``shm_put`` call (see :data:`INLINE_PUT_BYTES`); 0 always reserves a segment.
    """

    def __init__(
        self,
        location: str,
        *,
        timeout: float = 30.0,
        write_size_limit_bytes: int | None = None,
        alignment: ipc.Alignment = ipc.Alignment.DataTypeSpecific,
        inline_put_bytes: int = INLINE_PUT_BYTES,
    ) -> None:
        if timeout <= 0:
            raise InvalidRequestError(f"timeout must be > 0 seconds, got {timeout!r}")
        if not 0 <= inline_put_bytes <= MAX_FRAME // 2:
            raise InvalidRequestError(
                f"inline_put_bytes must be between 0 and {MAX_FRAME // 2} (half the same-host channel's "
                f"largest frame), got {inline_put_bytes!r}"
            )
        if write_size_limit_bytes is not None and write_size_limit_bytes <= 0:
            raise InvalidRequestError(f"write_size_limit_bytes must be > 0, got {write_size_limit_bytes!r}")
        self.location = location
        self.timeout = float(timeout)
        self.write_size_limit_bytes = write_size_limit_bytes
        self._read_options = ipc.IpcReadOptions(ensure_alignment=alignment)
        self._local: LocalChannel | None = None
        self._boards: dict[str, MappedBoard] = {}  # the server's fence board, mapped once (same host)
        self.inline_put_bytes = inline_put_bytes
        self._segments = SegmentWriter()  # same-host puts: keeps mappings of the segments it is handed again
        with translate_errors(f"connect to {location}"):
            self._client = flight.FlightClient(location, write_size_limit_bytes=write_size_limit_bytes or 0)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._local is not None:
            self._local.close()
        self._segments.close()
        self._client.close()

    def use_local_channel(self, path: str | None) -> None:
        """Send actions over the server's same-host Unix socket (``health()["shm_socket"]``) from now on;
        None goes back to Flight. Only for a server on this host (the caller checked its host id)."""
        old, self._local = self._local, (LocalChannel(path) if path else None)
        if old is not None:
            old.close()

    def __enter__(self) -> StorageClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _options(self, timeout: float | None) -> flight.FlightCallOptions:
        return flight.FlightCallOptions(
            timeout=self.timeout if timeout is None else timeout, read_options=self._read_options
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
        # get_total_buffer_size is O(buffers); RecordBatch.nbytes walks list offsets and costs ~20 us.
        nbytes = sum(b.get_total_buffer_size() for b in batches)
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
                # Never read the metadata stream before done_writing(): that hangs (PITFALLS.md).
                writer.done_writing()
            except BaseException:
                # The server refused mid-stream (capacity, schema): its status, not the broken write, is
                # the error to report; close() raises it.
                writer.close()
                raise
            writer.close()

    def put_group(
        self,
        key: Partition,
        data: pa.RecordBatch | pa.Table,
        *,
        writer: str = "",
        sig: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Put one whole group; it is visible to readers only once every row arrived.

        Args:
            key: The partition; every row's ``job_id``/``epoch``/``group_id`` must match it.
            data: The group (read, not kept).
            writer: Writer id for logs and stats.
            sig: Put credential from the controller where the server requires signatures.
            timeout: Deadline of the whole put (default: the client's).

        Raises:
            AlreadyExistsError, StaleFenceError (fenced epoch), SchemaError, CapacityExceededError (with
            ``retry_after``; nothing was stored), InvalidRequestError, DeadlineExceededError,
            UnavailableError.
        """
        batches, nbytes, rows = self._batches(data)
        descriptor = PutDescriptor(key, writer, nbytes=nbytes, num_rows=rows, sig=sig)
        self._put(encode(descriptor), batches, data.schema, timeout, f"put of group {key.group_id}")

    def put_groups(
        self,
        groups: Sequence[tuple[Partition, pa.RecordBatch | pa.Table]],
        *,
        writer: str = "",
        sigs: Sequence[str | None] | None = None,
        timeout: float | None = None,
    ) -> None:
        """Put several whole groups in one stream: all become visible together, or none does.

        Cheaper than one :meth:`put_group` per group (one call's overhead for all). Every group needs the
        same schema.

        Args:
            groups: ``(key, data)`` per group (read, not kept).
            writer: Writer id for logs and stats.
            sigs: Put credentials, one per group, where the server requires signatures.
            timeout: Deadline of the whole put.

        Raises:
            Like :meth:`put_group`; on any error nothing of this call is stored.
        """
        if not groups:
            return
        if sigs is not None and len(sigs) != len(groups):
            raise InvalidRequestError(f"put_groups: {len(sigs)} signatures for {len(groups)} groups")
        schema = groups[0][1].schema
        puts: list[PutDescriptor] = []
        batches: list[pa.RecordBatch] = []
        for i, (key, data) in enumerate(groups):
            if not data.schema.equals(schema):
                raise InvalidRequestError(
                    f"put_groups: group {key.group_id} has another schema than the first group; put groups "
                    "of different schemas separately"
                )
            group_batches, nbytes, rows = self._batches(data)
            puts.append(
                PutDescriptor(key, nbytes=nbytes, num_rows=rows, sig=None if sigs is None else sigs[i])
            )
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

    # ------------------------------------------------------------------------------- same-node puts

    def shm_put_groups(
        self,
        groups: Sequence[tuple[Partition, pa.RecordBatch | pa.Table]],
        *,
        writer: str = "",
        sigs: Sequence[str | None] | None = None,
        ttl: float | None = None,
        timeout: float | None = None,
        contiguous: bool = False,
    ) -> None:
        """Put groups through the server's shared-memory arena (same host only): no socket copy.

        One ``shm_reserve`` call gets a segment per group (every check of a put runs there), each group is
        written as one Arrow IPC stream straight into its segment file (one copy, from ``data`` into the
        shared pages, :class:`~._segment_writer.SegmentWriter`), and one ``shm_publish`` call validates and
        publishes them all at once, or none. On any failure the reservations are given up. ``data`` is read,
        not kept.

        Args:
            groups: ``(key, data)`` per group; every group needs the same schema.
            writer: Writer id for logs and stats.
            sigs: Put credentials, one per group, where the server requires signatures.
            ttl: Seconds the server waits for the publish before dropping the reservation (its default).
            timeout: Deadline of each of the two calls.
            contiguous: Write all the groups as one Arrow batch into one shared segment (one more copy
                here to join them), so that a reader of these groups in this order gets them as one slice
                with no copy; the segment is freed when the last of them is deleted.

        Raises:
            Like :meth:`put_group`; InvalidRequestError where the server has no arena; NotFoundError when
            a segment is not visible from this process (not the same host).
        """
        if not groups:
            return
        if sigs is not None and len(sigs) != len(groups):
            raise InvalidRequestError(f"shm_put_groups: {len(sigs)} signatures for {len(groups)} groups")
        schema = groups[0][1].schema
        per_group: list[list[pa.RecordBatch]] = []
        rows_of: list[int] = []
        nbytes = 0
        for key, data in groups:
            if not data.schema.equals(schema):
                raise InvalidRequestError(
                    f"shm_put_groups: group {key.group_id} has another schema than the first group"
                )
            group_batches, nbytes, rows = self._batches(data)
            per_group.append(group_batches)
            rows_of.append(rows)
        if contiguous and len(groups) > 1:
            # One stream of one batch for all groups (one copy here to join them, one into the
            # segment); readers of these groups in this order then get one slice with no copy.
            batch = join_batches([b for bs in per_group for b in bs], schema)
            keys_rows = [(key, rows) for (key, _), rows in zip(groups, rows_of, strict=True)]
            self.shm_put_batch(keys_rows, batch, writer=writer, sigs=sigs, ttl=ttl, timeout=timeout)
            return
        streams = per_group
        local = self._local
        payload = None
        if len(groups) == 1 and local is not None and nbytes <= self.inline_put_bytes:
            payload = _inline_stream(schema, streams[0], nbytes)
        if local is not None and payload is not None and payload.size <= self.inline_put_bytes:
            # A small group: its bytes ride in the one call that reserves, validates and publishes it
            # (one copy through the socket costs less here than a second round trip).
            key = groups[0][0]
            put = PutDescriptor(key, writer, payload.size, rows_of[0], None if sigs is None else sigs[0])
            body = encode(ShmReserveRequest((put,), writer, ttl, None))
            local.call("shm_put", body, self.timeout if timeout is None else timeout, payload=payload)
            return
        sizes = [stream_size(schema, bs) for bs in streams]
        puts = [
            PutDescriptor(key, writer, sizes[i], rows_of[i], None if sigs is None else sigs[i])
            for i, (key, _) in enumerate(groups)
        ]
        self._reserve_write_publish(puts, streams, sizes, schema, None, writer, ttl, timeout)

    def shm_put_batch(
        self,
        groups: Sequence[tuple[Partition, int]],
        batch: pa.RecordBatch,
        *,
        writer: str = "",
        sigs: Sequence[str | None] | None = None,
        ttl: float | None = None,
        timeout: float | None = None,
    ) -> None:
        """Put several groups already joined in one record batch through shared memory, as one segment.

        ``groups`` names each group's ``(key, rows)`` in the batch's row order; the batch's key columns
        must already hold them (the server checks every row). Written as one IPC stream (one copy, into
        the segment) and published all together or not at all: a reader of these groups in this order
        gets them as one slice with no copy. ``batch`` is read, not kept. Groups of one job and epoch (a
        writer's ``put_many``) travel in the compact batch form of ``shm_reserve``/``shm_publish`` (a few
        arrays out, one segment and one reservation back); others name each group.

        Raises:
            Like :meth:`shm_put_groups`; InvalidRequestError when the rows do not add up.
        """
        if not groups:
            return
        if sigs is not None and len(sigs) != len(groups):
            raise InvalidRequestError(f"shm_put_batch: {len(sigs)} signatures for {len(groups)} groups")
        if any(rows <= 0 for _, rows in groups) or sum(rows for _, rows in groups) != batch.num_rows:
            raise InvalidRequestError(
                f"shm_put_batch: the groups' rows must be > 0 and add up to the batch's {batch.num_rows}"
            )
        size = stream_size(batch.schema, [batch])
        first = groups[0][0]
        signed = None if sigs is None else tuple(s for s in sigs if isinstance(s, str))
        if all(k.job_id == first.job_id and k.epoch == first.epoch for k, _ in groups) and (
            signed is None or len(signed) == len(groups)
        ):
            # The compact form: a few arrays out, one segment and one reservation back, one publish.
            request = ShmBatchReserveRequest(
                first.job_id,
                first.epoch,
                tuple(k.group_id for k, _ in groups),
                tuple(rows for _, rows in groups),
                size,
                signed,  # every group's signature, or None
                writer,
                ttl,
            )
            reserved = self._action("shm_reserve", encode(request), timeout)["batch"]
            try:
                path, capacity = reserved["path"], int(reserved["capacity"])
                written = self._segments.write(path, capacity, batch.schema, [batch])
                if written != size:  # pragma: no cover - the sizer and the writer agree
                    raise InvalidRequestError(f"shm put: wrote {written} bytes, announced {size}")
                publish = ShmBatchPublishRequest(reserved["reservation"], written)
                self._action("shm_publish", encode(publish), timeout)
            except BaseException:
                # the server sweeps the reservation at its deadline anyway
                with contextlib.suppress(TrajflightError):
                    abort = ShmAbortRequest((reserved["reservation"],))
                    self._action("shm_abort", encode(abort), timeout)
                raise
            return
        puts = [
            PutDescriptor(key, writer, None, rows, None if sigs is None else sigs[i])
            for i, (key, rows) in enumerate(groups)
        ]
        self._reserve_write_publish(puts, [[batch]], [size], batch.schema, size, writer, ttl, timeout)

    def _reserve_write_publish(
        self,
        puts: Sequence[PutDescriptor],
        streams: Sequence[Sequence[pa.RecordBatch]],
        sizes: Sequence[int],
        schema: pa.Schema,
        batch_bytes: int | None,
        writer: str,
        ttl: float | None,
        timeout: float | None,
    ) -> None:
        """``shm_reserve``, write each stream into its segment (one shared one with ``batch_bytes``),
        ``shm_publish``; the reservations are given up on any failure."""
        request = ShmReserveRequest(tuple(puts), writer, ttl, batch_bytes)
        segments = self._action("shm_reserve", encode(request), timeout)["segments"]
        try:
            written = []
            for seg, stream, expected in zip(segments, streams, sizes, strict=False):
                size = self._segments.write(seg["path"], int(seg["capacity"]), schema, stream)
                if size != expected:  # pragma: no cover - the sizer and the writer agree
                    raise InvalidRequestError(f"shm put: wrote {size} bytes, announced {expected}")
                written.append(size)
            if batch_bytes is not None:
                written = [written[0]] * len(segments)
            items = tuple((seg["reservation"], n) for seg, n in zip(segments, written, strict=True))
            self._action("shm_publish", encode(ShmPublishRequest(items)), timeout)
        except BaseException:
            ids = tuple(s["reservation"] for s in segments)
            # the server sweeps the reservations at their deadline anyway
            with contextlib.suppress(TrajflightError):
                self._action("shm_abort", encode(ShmAbortRequest(ids)), timeout)
            raise

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
        reads = tuple(_as_read(g) for g in groups)
        ticket = GetTicket(reads, None if columns is None else tuple(columns))
        return ShmOpened.from_reply(reads, self._action("shm_open", encode(ticket), timeout))

    def shm_get(
        self,
        groups: Sequence[Partition | GroupRead],
        *,
        columns: Sequence[str] | None = None,
        timeout: float | None = None,
        opened: ShmOpened | None = None,
    ) -> pa.Table:
        """Read groups through shared memory (same host only): map their segments read-only, no copy.

        The lease tokens are checked by the server as for :meth:`get` (``shm_open``). When ``opened``
        (from :meth:`shm_open` under the same tokens) covers every group and column and the server's fence
        board shows every group unchanged at those tokens' generations, no call is made at all (a
        re-granted lease, a delete or an append changes the board, and the read goes to the server,
        which refuses or answers afresh). The result aliases read-only mappings of the segments (its
        buffers are neither received nor copied); the mappings stay valid after the group is deleted and
        are unmapped when the last buffer over them is dropped. Never write through tensors decoded from
        it (``torch.from_dlpack`` ignores the read-only flag; a write faults the process).

        Raises:
            NotFoundError (also when a segment is gone or not visible from this host), StaleFenceError,
            SchemaError, InvalidRequestError (no arena on the server), DeadlineExceededError.
        """
        reads = (
            groups if opened is not None and groups is opened.reads else tuple(_as_read(g) for g in groups)
        )
        # A kept open is read again with no call while the server's fence board shows every group
        # unchanged at the lease's generation; anything else is opened again, by the server.
        fresh = opened is None or not opened.covers(reads, columns)
        if opened is None or fresh:
            opened = self.shm_open(reads, columns=columns, timeout=timeout)
        for _ in range(_REOPENS):
            # One look at the server's fence board per read, after mapping: a segment is locked against
            # reuse only once mapped, so the groups must still be stored after that (else it may hold
            # another group already), and a kept open must still match them at the lease's generation.
            # Only then are the segments parsed.
            try:
                mapped_now = opened.map(reads)
            except NotFoundError:
                if fresh:
                    raise
                allowed = False  # a kept open's segment is gone: the server says why
            else:
                allowed = (fresh and not mapped_now) or self._board_allows(opened, reads)
            if allowed:
                return opened.read(reads, columns)
            # Ask the server, which refuses a deleted or re-granted group with the precise error; the same
            # segments mean the groups outlived the lock (their bytes are in the mappings).
            again = self.shm_open(reads, columns=columns, timeout=timeout)
            if again.same_parts(opened, reads):
                return opened.read(reads, columns)
            opened, fresh = again, True
        raise UnavailableError(
            f"shm read: the segments of {len(reads)} groups changed on every try ({_REOPENS}); read again"
        )

    def shm_lock(self, opened: ShmOpened) -> bool:
        """Map (and so lock against reuse) the segments of ``opened``'s reads now, ahead of the first read.

        Whether the groups are still stored after the mapping is checked on the fence board, as every
        read checks it; the answer is returned (False: a read will ask the server, as for any open the
        board does not vouch for). A trainer that maps at lease time keeps its groups' bytes from being
        recycled from then on, and its first read has nothing left to map.
        """
        try:
            mapped = opened.map(opened.reads)
        except NotFoundError:
            return False
        return not mapped or self._board_allows(opened, opened.reads)

    def _board_allows(self, opened: ShmOpened, reads: Sequence[GroupRead]) -> bool:
        query = opened.board_query(reads)
        path = opened.board_path
        if query is None or path is None:
            return False
        board = self._boards.get(path)
        if board is not None and query.matches(board):  # matches() checks the file is current
            return True
        if board is not None and board.current():
            return False  # the board itself says no: ask the server
        try:  # first use, or a restarted server replaced the file: map the current one
            board = self._boards[path] = MappedBoard(path)
        except (OSError, ValueError):
            return False
        return query.matches(board)

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
    ) -> list[GroupInfo]:
        """Stored groups, optionally of one job and epoch, sorted by key."""
        criteria = encode(ListCriteria(job_id, epoch)) if job_id is not None or epoch is not None else b""
        out = []
        with translate_errors("list_flights"):
            for info in self._client.list_flights(criteria, options=self._options(timeout)):
                job, ep, gid = (p.decode() for p in info.descriptor.path)
                endpoint = info.endpoints[0]
                out.append(
                    GroupInfo(
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
        local = self._local
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
        sig: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Refuse puts of every epoch of ``job_id`` below ``min_epoch`` on this server (controller's call).

        Stored groups of those epochs stay (reads, appends, deletes are fenced by lease generation) unless
        ``purge`` deletes them.
        """
        return self._action("fence", encode(FenceRequest(job_id, min_epoch, purge, sig)), timeout)

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


_REOPENS = 3  # reads of groups whose segments change under them (appends) before shm_get gives up


def _inline_stream(schema: pa.Schema, batches: Sequence[pa.RecordBatch], nbytes: int) -> pa.Buffer:
    """``batches`` as one IPC stream, written in one pass into a buffer sized from their buffers' bytes
    (``nbytes``) plus room for the messages' metadata; sized exactly first where that room is short."""
    buffer = pa.allocate_buffer(nbytes + _STREAM_ROOM)
    try:
        with pa.FixedSizeBufferWriter(buffer) as out:
            write_stream(out, schema, batches)
            return buffer.slice(0, out.tell())
    except OSError:  # "write out of bounds": many columns or batches; measure the stream, write it again
        return serialize_segment(batches, schema, heap_placement)


_STREAM_ROOM = 64 * 1024
"""Bytes an IPC stream may need beyond its buffers' (schema and batch metadata, padding) before
:func:`_inline_stream` sizes it exactly."""


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

    if len(requests) == 1:
        return [_one(requests[0])]
    with ThreadPoolExecutor(max_workers=len(requests), thread_name_prefix="trajflight-get") as pool:
        futures = [pool.submit(_one, r) for r in requests]
        return [f.result() for f in futures]
