"""The same-host half of the storage client: puts written into the server's segments, reads that map them.

:class:`ShmClient` is composed by :class:`~trajflight.flight_server._client.StorageClient`, whose actions
it sends (over the server's Unix socket once the client uses it, :mod:`._local`). One route each way:

* **put**: a list of groups (one group is a list of one) becomes one Arrow IPC stream in one segment,
  reserved, written and published all together or not at all (``shm_reserve``, a write into the file,
  ``shm_publish``); a lone small group instead travels whole in one ``shm_put`` call on the socket (see
  :data:`INLINE_PUT_BYTES`).
* **read**: ``shm_open`` hands over the groups' segments (under the lease tokens), which are mapped
  read-only and read with no copy (:class:`~._reader.ShmOpened`); an open kept by the caller is read
  again with no call while the server's fence board (:mod:`._fences`) shows every group unchanged.

Tables read alias read-only mappings of the server's segments (no copy; valid after the group is deleted,
until the last reference is dropped). Inputs to puts are only read, never kept. It does not retry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from trajflight.auth import Credential
from trajflight.errors import InvalidRequestError, NotFoundError, TrajflightError, UnavailableError
from trajflight.flight_server._segments import (
    heap_placement,
    join_batches,
    serialize_segment,
    stream_size,
    write_stream,
)
from trajflight.flight_server._wire import (
    GetTicket,
    GroupRead,
    PutDescriptor,
    ShmAbortRequest,
    ShmBatchPublishRequest,
    ShmBatchReserveRequest,
    ShmPublishRequest,
    ShmReserveRequest,
    encode,
)
from trajflight.flight_server.shm._fences import MappedBoard
from trajflight.flight_server.shm._local import MAX_FRAME, LocalChannel
from trajflight.flight_server.shm._reader import ShmOpened
from trajflight.flight_server.shm._writer import SegmentWriter
from trajflight.keys import Partition

__all__ = ["INLINE_PUT_BYTES", "ShmClient"]

INLINE_PUT_BYTES = 256 * 1024
"""A lone group whose IPC stream is at most this large travels whole in the one ``shm_put`` call (over the
server's Unix socket) instead of a reservation, a write and a publish in two calls: one copy through the
socket costs less than the second round trip up to about this size (BENCHMARKS.md, *Transport*)."""

_REOPENS = 3  # reads of groups whose segments change under them (appends) before a read gives up
_STREAM_ROOM = 64 * 1024
"""Bytes an IPC stream may need beyond its buffers' (schema and batch metadata, padding) before
:func:`_inline_stream` sizes it exactly."""

Action = Callable[[str, bytes, float | None], dict[str, Any]]
"""``action(name, body, timeout)``: the storage client's action call."""


class ShmClient:
    """Same-host puts and reads of one storage client. Thread-safe.

    Args:
        action: The client's action call (Flight ``do_action``, or the Unix socket once set).
        timeout: The client's default deadline (the inline put's, when none is given).
        inline_put_bytes: Lone groups whose stream is at most this large travel in one ``shm_put`` call
            (:data:`INLINE_PUT_BYTES`); 0 always reserves a segment.

    Raises:
        InvalidRequestError: ``inline_put_bytes`` is out of range.
    """

    def __init__(
        self,
        action: Action,
        timeout: float,
        inline_put_bytes: int = INLINE_PUT_BYTES,
        credential: Callable[[], Credential | None] | None = None,
    ) -> None:
        if not 0 <= inline_put_bytes <= MAX_FRAME // 2:
            raise InvalidRequestError(
                f"inline_put_bytes must be between 0 and {MAX_FRAME // 2} (half the same-host channel's "
                f"largest frame), got {inline_put_bytes!r}"
            )
        self._action = action
        self._credential = credential
        self._timeout = timeout
        self.inline_put_bytes = inline_put_bytes
        self.local: LocalChannel | None = None
        """The server's Unix socket (:meth:`use_local_channel`), or None: actions over Flight."""
        self._segments = SegmentWriter()  # keeps mappings of the segments it is handed again
        self._boards: dict[str, MappedBoard] = {}  # each server's fence board, mapped once

    def use_local_channel(self, path: str | None) -> None:
        """Send actions over the server's Unix socket at ``path`` from now on; None goes back to Flight."""
        old, self.local = self.local, (LocalChannel(path, self._credential) if path else None)
        if old is not None:
            old.close()

    def close(self) -> None:
        """Close the socket's connections and drop the kept mappings (idempotent)."""
        if self.local is not None:
            self.local.close()
        self._segments.close()

    # ----------------------------------------------------------------------------------------- put

    def put(
        self,
        groups: Sequence[tuple[Partition, pa.RecordBatch | pa.Table]],
        *,
        joined: pa.RecordBatch | None = None,
        writer: str = "",
        ttl: float | None = None,
        timeout: float | None = None,
    ) -> None:
        """Put groups through the server's arena as one IPC stream in one segment; see
        :meth:`StorageClient.shm_put_groups <trajflight.flight_server.StorageClient.shm_put_groups>`."""
        if not groups:
            return
        for _, data in groups:
            if not isinstance(data, pa.RecordBatch | pa.Table):
                raise InvalidRequestError(
                    f"expected a pyarrow RecordBatch or Table, got {type(data).__name__}"
                )
        schema = groups[0][1].schema
        for key, data in groups[1:]:
            if not data.schema.equals(schema):
                raise InvalidRequestError(
                    f"shm_put_groups: group {key.group_id} has another schema than the first group"
                )
        keys = [key for key, _ in groups]
        rows = [data.num_rows for _, data in groups]
        batches = self._stream_of(groups, joined, schema, sum(rows))
        nbytes = sum(b.get_total_buffer_size() for b in batches)
        if len(groups) == 1 and self.local is not None and nbytes <= self.inline_put_bytes:
            payload = _inline_stream(schema, batches, nbytes)
            if payload.size <= self.inline_put_bytes:
                put = PutDescriptor(keys[0], writer, payload.size, rows[0])
                body = encode(ShmReserveRequest((put,), writer, ttl))
                self.local.call(
                    "shm_put", body, self._timeout if timeout is None else timeout, payload=payload
                )
                return
        size = stream_size(schema, batches)
        reserved, publish = self._reserve(keys, rows, size, writer, ttl, timeout)
        try:
            written = self._segments.write(reserved["path"], int(reserved["capacity"]), schema, batches)
            if written != size:  # pragma: no cover - the sizer and the writer agree
                raise InvalidRequestError(f"shm put: wrote {written} bytes, announced {size}")
            self._action("shm_publish", publish(written), timeout)
        except BaseException:
            # The server sweeps the reservation at its deadline anyway.
            with contextlib.suppress(TrajflightError):
                abort = ShmAbortRequest((reserved["reservation"],))
                self._action("shm_abort", encode(abort), timeout)
            raise

    @staticmethod
    def _stream_of(
        groups: Sequence[tuple[Partition, pa.RecordBatch | pa.Table]],
        joined: pa.RecordBatch | None,
        schema: pa.Schema,
        rows: int,
    ) -> list[pa.RecordBatch]:
        """The batches of the one stream: ``joined`` as it is, a lone group's own batches, or the groups
        joined into one batch (one copy here, so that a reader of them in order gets one slice)."""
        if len(groups) > 1 and not all(data.num_rows for _, data in groups):
            raise InvalidRequestError(
                "shm_put_groups: a group has no samples; the groups' rows must be > 0 (and add up to the "
                "joined batch's, when given)"
            )
        if joined is not None:
            if joined.num_rows != rows or not joined.schema.equals(schema):
                raise InvalidRequestError(
                    f"shm_put_groups: the joined batch's {joined.num_rows} rows do not add up to its "
                    f"{len(groups)} groups' {rows}, or it has another schema than theirs"
                )
            return [joined]
        parts = [b for _, data in groups for b in _batches_of(data) if b.num_rows or len(groups) == 1]
        return parts if len(groups) == 1 else [join_batches(parts, schema)]

    def _reserve(
        self,
        keys: Sequence[Partition],
        rows: Sequence[int],
        size: int,
        writer: str,
        ttl: float | None,
        timeout: float | None,
    ) -> tuple[dict[str, Any], Callable[[int], bytes]]:
        """``shm_reserve`` of one segment of ``size`` for the groups: the reservation (``reservation``,
        ``path``, ``capacity``) and the body of its publish, given the size written.

        Groups of one job and epoch travel in the compact ``batch`` body (one reservation back); others
        name each group."""
        first = keys[0]
        if all(k.job_id == first.job_id and k.epoch == first.epoch for k in keys):
            ids = tuple(k.group_id for k in keys)
            body = ShmBatchReserveRequest(first.job_id, first.epoch, ids, tuple(rows), size, writer, ttl)
            reserved = self._action("shm_reserve", encode(body), timeout)["batch"]
            return reserved, lambda n: encode(ShmBatchPublishRequest(reserved["reservation"], n))
        puts = tuple(PutDescriptor(key, writer, None, n) for key, n in zip(keys, rows, strict=True))
        segments = self._action("shm_reserve", encode(ShmReserveRequest(puts, writer, ttl, size)), timeout)[
            "segments"
        ]
        members = tuple(s["reservation"] for s in segments)
        reserved = {**segments[0], "reservation": members[0]}

        def publish(n: int) -> bytes:
            return encode(ShmPublishRequest(tuple((m, n) for m in members)))

        return reserved, publish

    # ---------------------------------------------------------------------------------------- read

    def open(
        self, reads: Sequence[GroupRead], columns: Sequence[str] | None, timeout: float | None
    ) -> ShmOpened:
        """``shm_open`` of the reads: see :meth:`StorageClient.shm_open`."""
        ticket = GetTicket(tuple(reads), None if columns is None else tuple(columns))
        return ShmOpened.from_reply(reads, self._action("shm_open", encode(ticket), timeout))

    def get(
        self,
        reads: Sequence[GroupRead],
        columns: Sequence[str] | None,
        timeout: float | None,
        opened: ShmOpened | None,
    ) -> pa.Table:
        """Read the groups through their mapped segments: see :meth:`StorageClient.shm_get`."""
        # A kept open is read again with no call while the server's fence board shows every group
        # unchanged at the lease's generation; anything else is opened again, by the server.
        fresh = opened is None or not opened.covers(reads, columns)
        if opened is None or fresh:
            opened = self.open(reads, columns, timeout)
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
            again = self.open(reads, columns, timeout)
            if again.same_parts(opened, reads):
                return opened.read(reads, columns)
            opened, fresh = again, True
        raise UnavailableError(
            f"shm read: the segments of {len(reads)} groups changed on every try ({_REOPENS}); read again"
        )

    def lock(self, opened: ShmOpened) -> bool:
        """Map (and so lock against reuse) the segments of ``opened``'s reads now: see
        :meth:`StorageClient.shm_lock`."""
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


def _batches_of(data: pa.RecordBatch | pa.Table) -> list[pa.RecordBatch]:
    return [data] if isinstance(data, pa.RecordBatch) else data.to_batches()


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
