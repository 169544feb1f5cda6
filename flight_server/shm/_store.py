"""The group store's shared-memory collaborator: the arena holding every stored part, and the same-host
puts whose segments writers of this host fill themselves (``docs/wire-format.md``, *Same-host transport*).

:class:`ShmStore` owns the arena, the fence board and the same-host reservations. The group store
(:class:`~trajflight.flight_server._store.GroupStore`) composes it: it hands over every part to place
(:meth:`ShmStore.place`) and every dropped group to release, and it keeps admission and the commit to
itself, which :class:`ShmStore` reaches through :class:`Puts`. So every rule of a Flight put holds here
too: the epoch fence, no overwrite, the tombstones, capacity (a segment's size class),
``validate_group(full=True)`` before anything becomes visible, the fence again at commit.

A same-host put is one reservation of one segment for a list of groups (one group is a list of one),
written as one Arrow IPC stream, one group after another, and published all together or not at all. A
small group may also arrive whole over the same-host channel (:meth:`ShmStore.put_inline`), packed into
a slab.

This module does no I/O beyond the segments it places and validates; it does not guarantee that a writer
stops writing after it published (writers are the deployment's own processes).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.ipc as ipc

from trajflight.codec import TrajectorySchema, validate_group, validate_groups
from trajflight.errors import CapacityExceededError, InvalidRequestError, NotFoundError, SchemaError
from trajflight.flight_server._segments import open_segment, serialize_segment
from trajflight.flight_server._store_records import Reservation, StoredGroup, StoreLimits, fmt_key
from trajflight.flight_server._wire_bounds import echo
from trajflight.flight_server.shm._arena import SLAB_ALIGN, ShmArena
from trajflight.flight_server.shm._fences import FenceBoard
from trajflight.flight_server.shm._segment import Segment, size_class
from trajflight.keys import Partition

__all__ = ["Puts", "ShmReservation", "ShmStore"]

T = TypeVar("T")
Stored = StoredGroup[Segment]


class Puts(Protocol):
    """What :class:`ShmStore` needs of the store it serves: admission and the commit of puts."""

    def begin_put(
        self, key: Partition, schema: pa.Schema | None, announced_bytes: int | None = None
    ) -> Reservation:
        """Admit a put of ``key`` (every check of a put but the schema's when None) for its bytes."""

    def begin_puts(self, keys: Sequence[Partition], announced: Sequence[int]) -> list[Reservation]:
        """Admit puts of ``keys`` (schema checked at publish) for their bytes, all or none."""

    def commit_puts(
        self, reservations: Sequence[Reservation], groups: list[Stored], schema: pa.Schema
    ) -> list[Stored]:
        """Re-check the fences and make ``groups`` visible all at once (releasing their segments on a
        refusal)."""


@dataclass(slots=True)
class ShmReservation:
    """A same-host put in flight: one segment that a writer fills with one IPC stream of its groups.

    Attributes:
        id: Opaque id the writer publishes (or aborts) the whole reservation with; the ``groups`` form of
            ``shm_reserve`` names each group ``"<id>-<i>"`` instead (see :meth:`member_ids`).
        reservations: One capacity reservation per group (its share of the segment, one group slot), in
            stream order; their keys are the groups'.
        segment: The segment the writer writes the stream into, from offset 0.
        deadline: Monotonic time after which :meth:`ShmStore.sweep` drops it (its writer died).
        writer: Writer id.
        rows: Rows announced per group, in stream order; None for a lone group whose stream tells.
        shares: Bytes of the segment each group counts against capacity (by rows; they add up to it).
    """

    id: str
    reservations: list[Reservation]
    segment: Segment
    deadline: float
    writer: str
    rows: list[int | None]
    shares: list[int]

    def member_ids(self) -> list[str]:
        """One reservation id per group (the ``groups`` form of ``shm_reserve``)."""
        return [f"{self.id}-{i}" for i in range(len(self.reservations))]


class ShmStore:
    """The arena side of a group store; thread-safe (its own lock guards its reservations).

    Args:
        arena: The server's arena; this store places every part in it.
        puts: The store's admission and commit (:class:`Puts`).
        schema: The trajectory schema published streams are validated against.
        limits: The store's bounds (``retry_after`` of capacity refusals).
        clock: Monotonic clock (reservation deadlines, publish times).
    """

    def __init__(
        self,
        arena: ShmArena,
        puts: Puts,
        *,
        schema: TrajectorySchema,
        limits: StoreLimits,
        clock: Callable[[], float],
    ) -> None:
        self.arena = arena
        self.board = FenceBoard(arena.directory)
        """Generations published for same-host readers; the store writes it under its own lock."""
        self._puts = puts
        self._schema = schema
        self._limits = limits
        self._clock = clock
        self._lock = threading.Lock()
        self._reserved: dict[str, ShmReservation] = {}  # same-host puts not yet published, by id

    # ---------------------------------------------------------------------------------- placement

    def place(self, batches: Sequence[pa.RecordBatch], schema: pa.Schema) -> tuple[pa.Table, int, Segment]:
        """Copy a received part once into a segment of its own, as one IPC stream: ``(table aliasing the
        segment, bytes counted, segment)``.

        Raises:
            CapacityExceededError: tmpfs is full (nothing is kept).
        """
        placed: list[Segment] = []

        def allocate(size: int) -> pa.Buffer:
            seg, buf = self.arena.place(size)
            placed.append(seg)
            return buf

        try:
            buffer = self._from_arena(lambda: serialize_segment(batches, schema, allocate), ())
        except BaseException:
            for seg in placed:
                self.arena.release(seg)
            raise
        return open_segment(buffer), placed[0].capacity, placed[0]

    def place_together(
        self,
        items: Sequence[tuple[Reservation, Sequence[pa.RecordBatch]]],
        schema: pa.Schema,
        writer: str,
    ) -> list[Stored]:
        """Received groups placed in one segment as one IPC stream of their batches, in order (one copy
        and one segment write for all, not one per group), as a same-host batch is: each group holds the
        whole stream as its first part from its first row (sliced on first use), and a share of the
        segment by the bytes it received (the shares add up to the segment). The segment goes back to the
        arena with the last of them, so a group kept long keeps the whole segment in tmpfs.

        Raises:
            CapacityExceededError: tmpfs is full (nothing is kept).
        """
        table, capacity, seg = self.place([b for _, batches in items for b in batches], schema)
        seg.refs = len(items)  # one reference per group, released with each
        weights = [max(1, res.received) for res, _ in items]
        total = sum(weights)
        shares = [capacity * w // total for w in weights]
        shares[-1] += capacity - sum(shares)
        now, parts, segments = self._clock(), (table,), (seg,)
        groups: list[Stored] = []
        offset = 0
        for (res, batches), share in zip(items, shares, strict=True):
            rows = sum(b.num_rows for b in batches)
            group = StoredGroup(res.key, parts, (share,), None, writer, now, segments, (offset,), (), rows)
            groups.append(group)
            offset += rows
        return groups

    def release(self, groups: Iterable[Stored]) -> None:
        """Give dropped groups' segments back to the arena (outside the store's lock)."""
        for group in groups:
            for i, seg in enumerate(group.segments):
                if seg.slab:
                    self.arena.release_stream(seg, group.part_bytes[i])
                else:
                    self.arena.release(seg)

    @property
    def stranded_bytes(self) -> int:
        """Bytes of retired slabs no group counts any more; the store counts them as used capacity."""
        return self.arena.stranded_bytes

    def pending_groups(self) -> int:
        """Groups reserved by same-host writers and not yet published."""
        with self._lock:
            return sum(len(r.reservations) for r in self._reserved.values())

    def _from_arena(self, take: Callable[[], T], reservations: Sequence[Reservation]) -> T:
        """``take()`` from the arena; on failure the reservations are released and a full tmpfs is
        reported as a capacity refusal."""
        try:
            return take()
        except BaseException as exc:
            for res in reservations:
                res.release()
            if isinstance(exc, OSError):
                retry = self._limits.retry_after
                raise CapacityExceededError(
                    f"shared memory of this node is full ({exc.strerror}); retry after {retry:g}s or give "
                    "/dev/shm more room",
                    retry_after=retry,
                ) from exc
            raise

    # ------------------------------------------------------------------------------------- puts

    def reserve(
        self,
        keys: Sequence[Partition],
        rows: Sequence[int | None],
        nbytes: int,
        *,
        writer: str = "",
        ttl: float = 30.0,
    ) -> ShmReservation:
        """Reserve one segment of ``nbytes`` for a same-host writer to fill with the groups' one IPC stream.

        ``keys[i]`` has ``rows[i]`` rows, in stream order (None only for a lone group). Each group passes
        the checks of a Flight put before any byte is written (the first group refused is the one named)
        and counts its share of the segment (by rows) against capacity; the segment goes back to the arena
        with the last of them. It is visible to readers only once published (:meth:`publish`); one not
        published within ``ttl`` seconds is dropped by :meth:`sweep` and its segment unlinked (never
        reused: its writer may still be writing).

        Raises:
            StaleFenceError, AlreadyExistsError, LeaseExpiredError, CapacityExceededError (also when tmpfs
            is full), InvalidRequestError (a size or row count that is not positive, over
            ``max_group_bytes``); nothing stays reserved.
        """
        lone = len(keys) == 1 and rows[0] is None  # a lone group's stream tells its rows
        if (
            nbytes <= 0
            or not keys
            or len(rows) != len(keys)
            or (not lone and any(not n or n < 0 for n in rows))
        ):
            raise InvalidRequestError("shm put: nbytes and every group's num_rows must be > 0")
        if ttl <= 0:
            raise InvalidRequestError(f"shm put: ttl must be > 0, got {ttl}")
        self.sweep()
        capacity = size_class(nbytes)
        counts = [1 if n is None else n for n in rows]
        shares = [capacity * n // sum(counts) for n in counts]
        shares[-1] += capacity - sum(shares)
        reservations = self._puts.begin_puts(keys, shares)  # all admitted, or none
        seg = self._from_arena(lambda: self.arena.acquire(nbytes), reservations)
        seg.exposed = True  # a process outside the server maps it for writing until it publishes
        seg.refs = len(keys)
        put = ShmReservation(
            uuid.uuid4().hex, reservations, seg, self._clock() + ttl, writer, list(rows), shares
        )
        with self._lock:
            self._reserved[put.id] = put
        return put

    def publish(self, items: Sequence[tuple[str, int]]) -> list[Stored]:
        """Validate same-host writes and publish them, all at once or not at all.

        Each item is ``(reservation id, stream size)``: a whole reservation's id, or one of its
        :meth:`~ShmReservation.member_ids` (then every member must be in the call). The segment's first
        ``size`` bytes must be one Arrow IPC stream holding the reservation's groups in order; the server
        reads it in place (no copy) and runs the checks of a Flight put: the job's schema, the announced
        rows, ``validate_group(full=True)`` against each key, the epoch fence again at commit. The stored
        tables alias the segment. Any failure gives back every reservation of the call and publishes
        nothing; a reservation publishes once.

        Raises:
            NotFoundError (an unknown, expired or already published reservation), SchemaError,
            InvalidRequestError, StaleFenceError, LeaseExpiredError.
        """
        if not items:
            raise InvalidRequestError("shm_publish: name at least one reservation")
        taken = self._take(items)
        for put, _ in taken:
            put.segment.exposed = False  # its writer is done writing: the segment may be reused later
        try:
            groups: list[Stored] = []
            schema: pa.Schema | None = None
            for put, size in taken:
                table = self._open_stream(put.reservations[0].key, put.segment, size, 0)
                if schema is None:
                    schema = table.schema
                    self._schema.check(schema)
                elif not table.schema.equals(schema):
                    raise InvalidRequestError(
                        f"shm_publish: group {fmt_key(put.reservations[0].key)} has another schema than the "
                        "first group of the call; publish groups of different schemas separately"
                    )
                groups += self._groups_of(put, table)
        except BaseException:
            for put, _ in taken:
                self._drop(put)
            raise
        reservations = [res for put, _ in taken for res in put.reservations]
        return self._puts.commit_puts(reservations, groups, groups[0].parts[0].schema)

    def _take(self, items: Sequence[tuple[str, int]]) -> list[tuple[ShmReservation, int]]:
        """The reservations ``items`` name, each whole, with the size of its stream; taken out (a
        reservation publishes once)."""
        named: dict[str, list[int]] = {}  # reservation id -> members named (-1: the whole reservation)
        sizes: dict[str, int] = {}
        with self._lock:
            for rid, size in items:
                head, _, member = rid.rpartition("-")
                if rid in self._reserved:
                    base, index = rid, -1
                elif head in self._reserved and member.isdigit():
                    base, index = head, int(member)
                else:
                    raise NotFoundError(
                        f"shm reservation {echo(rid)} is unknown, expired or already published; put the "
                        "groups again",
                        reservation=rid,
                    )
                named.setdefault(base, []).append(index)
                sizes.setdefault(base, size)
            for base, members in named.items():
                count = len(self._reserved[base].reservations)
                if members != [-1] and sorted(members) != list(range(count)):
                    raise InvalidRequestError(
                        f"shm_publish: reservation {echo(base)} is named twice or in part: publish every "
                        "group of a batch together, each once"
                    )
            return [(self._reserved.pop(base), sizes[base]) for base in named]

    def _groups_of(self, put: ShmReservation, table: pa.Table) -> list[Stored]:
        """The groups of a reservation's stream ``table``, once the rows add up and they validate.

        A lone group is the whole stream; the groups of a shared segment each hold the whole stream as
        their first part and their first row as its offset, their own table sliced only when first asked
        for (:attr:`StoredGroup.table`).
        """
        keys = [res.key for res in put.reservations]
        now, seg = self._clock(), put.segment
        if len(keys) == 1:
            if put.rows[0] is not None and table.num_rows != put.rows[0]:
                raise InvalidRequestError(
                    f"shm put of group {fmt_key(keys[0])}: {table.num_rows} rows written, {put.rows[0]} "
                    "announced; put it again"
                )
            _validate_each(table, self._schema, keys[0])
            return [StoredGroup(keys[0], (table,), (put.shares[0],), table, put.writer, now, (seg,), (0,))]
        rows = [int(n or 0) for n in put.rows]
        if sum(rows) != table.num_rows:
            raise InvalidRequestError(
                f"shm batch: {table.num_rows} rows written, {sum(rows)} announced; put it again"
            )
        validate_groups(table, self._schema, keys, rows)
        parts, segments = (table,), (seg,)
        out: list[Stored] = []
        offset = 0
        for key, n, share in zip(keys, rows, put.shares, strict=True):
            out.append(StoredGroup(key, parts, (share,), None, put.writer, now, segments, (offset,), (), n))
            offset += n
        return out

    def put_inline(
        self, key: Partition, data: bytes | bytearray, *, writer: str = "", num_rows: int | None = None
    ) -> Stored:
        """Store one group whose IPC stream the server received whole (a small same-host put).

        The checks of :meth:`reserve`, one copy of ``data`` into the arena's current slab (small groups are
        packed one after another, :meth:`ShmArena.pack`; a stream larger than a slab gets a segment of
        its own), then :meth:`publish`'s validation. All or nothing. Capacity counts the stream's size
        rounded up to 64 bytes.

        Raises:
            Like :meth:`reserve` and :meth:`publish`.
        """
        if not data:
            raise InvalidRequestError(f"shm put of group {fmt_key(key)}: the payload is empty")
        arena = self.arena
        need = -(-len(data) // SLAB_ALIGN) * SLAB_ALIGN
        if need > arena.slab_bytes:  # larger than a slab: a segment of its own
            put = self.reserve([key], [num_rows], len(data), writer=writer)
            try:
                whole = put.segment.mm
                if whole is None:  # pragma: no cover - the segment was just acquired
                    raise NotFoundError(f"segment {put.segment.name} was released")
                whole[: len(data)] = data
            except BaseException:
                self.abort([put.id])
                raise
            (group,) = self.publish([(put.id, len(data))])
            return group
        self.sweep()
        res = self._puts.begin_put(key, None, need)
        slab, start = self._from_arena(lambda: arena.pack(len(data)), [res])
        try:
            slab.buffer(len(data), start)  # raises if the slab was released (the arena closed)
            mm = slab.mm
            if mm is None:  # pragma: no cover - checked just above
                raise NotFoundError(f"segment {slab.name} was released")
            mm[start : start + len(data)] = data
            table = self._open_stream(key, slab, len(data), start, num_rows)
            _validate_each(table, self._schema, key)
        except BaseException:
            res.release()
            arena.release_stream(slab, need)  # the region stays unused: stranded until the slab goes
            raise
        group = StoredGroup(key, (table,), (need,), table, writer, self._clock(), (slab,), (0,), (start,))
        (stored,) = self._puts.commit_puts([res], [group], table.schema)  # a refusal releases the slab
        return stored

    def _open_stream(
        self, key: Partition, seg: Segment, size: int, start: int, num_rows: int | None = None
    ) -> pa.Table:
        """The IPC stream of ``size`` bytes at ``start`` of ``seg`` as a table aliasing it (no copy), with
        at least one sample and, when given, ``num_rows`` of them."""
        if not 0 < size <= seg.capacity - start:
            raise InvalidRequestError(
                f"shm put of group {fmt_key(key)}: size {size} is outside the segment (1..{seg.capacity})"
            )
        try:
            reader = ipc.open_stream(pa.BufferReader(seg.buffer(size, start)))
            batches = [b for b in reader if b.num_rows]
        except (pa.ArrowInvalid, OSError) as exc:
            raise SchemaError(
                f"shm put of group {fmt_key(key)}: the segment does not hold one Arrow IPC stream ({exc}); "
                "write it with pyarrow.ipc.new_stream and publish the size written"
            ) from None
        rows = sum(b.num_rows for b in batches)
        if rows == 0:
            raise InvalidRequestError(f"shm put of group {fmt_key(key)}: the stream carried no samples")
        if num_rows is not None and rows != num_rows:
            raise InvalidRequestError(
                f"shm put of group {fmt_key(key)}: {rows} rows written, {num_rows} announced; put it again"
            )
        return pa.Table.from_batches(batches, reader.schema)

    def abort(self, ids: Sequence[str]) -> int:
        """Drop same-host puts the writer gave up on; returns how many groups. An id names a whole
        reservation or one of its members (which gives up the whole reservation); unknown ids are
        ignored."""
        with self._lock:
            found = {base for base in map(self._base, ids) if base is not None}
            puts = [self._reserved.pop(base) for base in found]
        for put in puts:
            self._drop(put)
        return sum(len(p.reservations) for p in puts)

    def _base(self, rid: str) -> str | None:
        """The reservation ``rid`` names (itself or as a member), or None. Caller holds the lock."""
        if rid in self._reserved:
            return rid
        head, _, member = rid.rpartition("-")
        return head if head in self._reserved and member.isdigit() else None

    def sweep(self, now: float | None = None) -> int:
        """Drop same-host puts past their deadline (a writer killed mid-write); returns how many groups.

        Their reservations are given back and their segments unlinked (never reused).
        """
        now = self._clock() if now is None else now
        with self._lock:
            expired = [p for p in self._reserved.values() if p.deadline <= now]
            for put in expired:
                del self._reserved[put.id]
        for put in expired:
            self._drop(put)
        return sum(len(p.reservations) for p in expired)

    def _drop(self, put: ShmReservation) -> None:
        for res in put.reservations:
            res.release()
            self.arena.release(put.segment)  # one reference per group

    def stats(self) -> dict[str, Any]:
        """The arena's counts for the server's ``stats`` action."""
        return self.arena.stats()


# ----------------------------------------------------------------------------------------- validation


def _validate_each(table: pa.Table, schema: TrajectorySchema, key: Partition) -> None:
    """``validate_group(full=True)`` of every batch of one group's stream against ``key``."""
    for batch in table.to_batches():
        if batch.num_rows:
            validate_group(batch, schema, expect=key, full=True)
