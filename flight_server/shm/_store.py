"""Same-node puts and reads of the group store: segments of a shared-memory arena filled by writers and
mapped by readers of this host (see :mod:`._shm` and ``docs/wire-format.md``).

:class:`ShmStoreMixin` is part of :class:`~._store.GroupStore` (kept apart to keep each module small); it
uses the store's lock, maps, reservations, fences and :meth:`~._store.GroupStore._commit_puts`, so every
rule of a Flight put holds here too: the epoch fence, no overwrite, capacity (the segment's size class),
``validate_group(full=True)`` before anything becomes visible, and lease generations for reads.

This module does no I/O beyond reading the segments it validates; it does not guarantee that a writer
stops writing after it published (writers are the deployment's own processes).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from trajflight.codec import validate_group
from trajflight.errors import CapacityExceededError, InvalidRequestError, NotFoundError, SchemaError
from trajflight.flight_server._store_records import Reservation, StoredGroup
from trajflight.flight_server._wire import GroupRead
from trajflight.flight_server._wire_bounds import echo
from trajflight.flight_server.shm._arena import SLAB_ALIGN, ShmArena
from trajflight.flight_server.shm._segment import Segment, size_class
from trajflight.keys import Partition

__all__ = ["ShmBatch", "ShmPut", "ShmStoreMixin", "fmt_key", "key_fields"]

T = TypeVar("T")


def fmt_key(key: Partition) -> str:
    """A group key for messages: ``('job', epoch 1, group 5)`` (a long job id cut, see ``echo``)."""
    return f"({echo(key.job_id)}, epoch {key.epoch}, group {key.group_id})"


def key_fields(key: Partition) -> dict[str, Any]:
    """A group key as error fields."""
    return {"job_id": key.job_id, "epoch": key.epoch, "group_id": key.group_id}


_fmt = fmt_key
_kd = key_fields

_KEY_NAMES = ("job_id", "epoch", "group_id")


def _holds_keys(column: pa.Array, name: str, keys: Sequence[Partition], rows: Sequence[int]) -> bool:
    """Whether key column ``name`` (no nulls) holds the keys of groups ``keys`` of ``rows`` rows each, one
    after another. Raises OverflowError for a key beyond int64 (the caller then checks group by group)."""
    if name == "job_id":
        want = pa.array(np.repeat(np.array([k.job_id for k in keys], dtype=object), rows), pa.string())
        return bool(column.cast(want.type).equals(want))
    values = np.array([k.epoch for k in keys] if name == "epoch" else [k.group_id for k in keys], np.int64)
    if column.type == pa.int64():  # the standard type: compared in place, no Arrow array built
        held = column.to_numpy()  # no nulls: a view of the column's buffer
        want = np.repeat(values, rows)
        return held.shape == want.shape and bool((held == want).all())
    return bool(column.cast(pa.int64()).equals(pa.array(np.repeat(values, rows))))


@dataclass(slots=True)
class ShmPut:
    """A same-node put in flight: a reserved arena segment the writer is filling.

    Attributes:
        id: Opaque reservation id the writer publishes (or aborts) with.
        res: The capacity reservation (the segment's size class, one group slot).
        segment: The segment the writer writes one IPC stream into, from offset 0.
        deadline: Monotonic time after which :meth:`GroupStore.sweep_shm` drops it (its writer died).
        writer: Writer id.
        num_rows: Rows announced, checked at publish when given (required in a shared segment).
        offset: First row of the group in the segment's stream (a batch of groups shares one segment,
            one group after another; 0 for a segment of its own).
        share: Bytes of the segment this group counts against capacity (the whole segment when alone).
    """

    id: str
    res: Reservation
    segment: Segment
    deadline: float
    writer: str
    num_rows: int | None
    offset: int = 0
    share: int = 0


@dataclass(slots=True)
class ShmBatch:
    """A same-node put of several groups into one shared segment, in flight, as one record (the compact
    ``shm_reserve`` form): one id, one deadline and one segment for the batch, where :class:`ShmPut` is
    one per group.

    Attributes:
        id: Opaque reservation id of the whole batch: the writer publishes (or aborts) it in one piece.
        reservations: One capacity reservation per group (its share of the segment, one group slot), in
            stream order; their keys are the groups'.
        segment: The segment the writer writes the batch's one IPC stream into, from offset 0.
        deadline: Monotonic time after which :meth:`GroupStore.sweep_shm` drops it (its writer died).
        writer: Writer id.
        rows: Rows announced per group, in stream order (checked at publish).
        shares: Bytes of the segment each group counts against capacity (by rows; they add up to it).
    """

    id: str
    reservations: list[Reservation]
    segment: Segment
    deadline: float
    writer: str
    rows: list[int]
    shares: list[int]


class ShmStoreMixin:
    """The same-node methods of :class:`~._store.GroupStore` (see the module docstring)."""

    # Provided by GroupStore.
    arena: ShmArena | None
    _shm_puts: dict[str, ShmPut]
    _shm_batches: dict[str, ShmBatch]
    _lock: Any
    _groups: dict[Partition, StoredGroup]
    _generation: dict[Partition, int]
    schema: Any
    limits: Any
    _clock: Any
    begin_put: Any
    begin_puts: Any
    _commit_puts: Callable[[Sequence[Reservation], list[StoredGroup], pa.Schema], list[StoredGroup]]
    _check_token: Any
    _fenced_reads_locked: Any
    board: Any

    def _acquire_segment(self, arena: ShmArena, nbytes: int, reservations: Sequence[Reservation]) -> Segment:
        """A segment of ``nbytes`` from the arena (see :meth:`_from_arena`)."""
        return self._from_arena(lambda: arena.acquire(nbytes), reservations)

    def _from_arena(self, take: Callable[[], T], reservations: Sequence[Reservation]) -> T:
        """``take()`` from the arena; on failure the reservations are released and a full tmpfs is
        reported as a capacity refusal."""
        try:
            return take()
        except BaseException as exc:
            for res in reservations:
                res.release()
            if isinstance(exc, OSError):
                raise CapacityExceededError(
                    f"shared memory of this node is full ({exc.strerror}); retry after "
                    f"{self.limits.retry_after:g}s or give /dev/shm more room",
                    retry_after=self.limits.retry_after,
                ) from exc
            raise

    def _need_arena(self) -> ShmArena:
        if self.arena is None:
            raise InvalidRequestError(
                "this server has no shared-memory arena (start it with --shm-dir); put and read over "
                "Flight (transport='flight')"
            )
        return self.arena

    def begin_shm_put(
        self, key: Partition, nbytes: int, *, writer: str = "", num_rows: int | None = None, ttl: float = 30.0
    ) -> ShmPut:
        """Reserve an arena segment for a same-node writer to fill with the group's IPC stream.

        The same checks as a Flight put, before any byte is written: epoch fence, the key neither stored
        nor being put, a group slot, and capacity for the segment's size class. The segment is not visible
        to readers until :meth:`publish_shm`; a put not published within ``ttl`` seconds is dropped by
        :meth:`sweep_shm` and its segment unlinked (never reused: its writer may still be writing).

        Raises:
            StaleFenceError, AlreadyExistsError, CapacityExceededError (also when tmpfs is full),
            InvalidRequestError (no arena, a size that is not positive or over ``max_group_bytes``).
        """
        arena = self._need_arena()
        if nbytes <= 0:
            raise InvalidRequestError(f"shm put of group {_fmt(key)}: nbytes must be > 0, got {nbytes}")
        if ttl <= 0:
            raise InvalidRequestError(f"shm put of group {_fmt(key)}: ttl must be > 0, got {ttl}")
        self.sweep_shm()
        res = self.begin_put(key, None, size_class(nbytes))
        seg = self._acquire_segment(arena, nbytes, [res])
        seg.exposed = True  # a process outside the server maps it for writing until it publishes
        put = ShmPut(uuid.uuid4().hex, res, seg, self._clock() + ttl, writer, num_rows, 0, seg.capacity)
        with self._lock:
            self._shm_puts[put.id] = put
        return put

    def begin_shm_batch(
        self, puts: Sequence[tuple[Partition, int]], nbytes: int, *, writer: str = "", ttl: float = 30.0
    ) -> list[ShmPut]:
        """Reserve one segment for several groups written as one IPC stream, one group after another.

        ``puts`` is ``(key, num_rows)`` per group, in stream order. Each group passes the checks of
        :meth:`begin_shm_put` and counts its share of the segment (by rows) against capacity; the segment
        goes back to the arena when the last of them is deleted. A reader of several such groups in order
        gets one contiguous slice: no copy to join them. One reservation per group (the ``groups`` form of
        ``shm_reserve``); :meth:`reserve_shm_batch` makes one for the whole batch.

        Raises:
            Like :meth:`begin_shm_put`; on any error nothing stays reserved.
        """
        rows = [r for _, r in puts]
        reservations, seg, shares, deadline = self._reserve_shared([k for k, _ in puts], rows, nbytes, ttl)
        out, offset = [], 0
        batch_id = uuid.uuid4().hex  # one random id for the batch (os.urandom per group cost ~2 us each)
        for i, (res, n, share) in enumerate(zip(reservations, rows, shares, strict=True)):
            out.append(ShmPut(f"{batch_id}-{i}", res, seg, deadline, writer, n, offset, share))
            offset += n
        with self._lock:
            for put in out:
                self._shm_puts[put.id] = put
        return out

    def reserve_shm_batch(
        self,
        keys: Sequence[Partition],
        rows: Sequence[int],
        nbytes: int,
        *,
        writer: str = "",
        ttl: float = 30.0,
    ) -> ShmBatch:
        """Reserve one segment for several groups written as one IPC stream, under one reservation id.

        The same checks, capacity and segment as :meth:`begin_shm_batch` (``keys[i]`` has ``rows[i]``
        rows, in stream order); the batch is published (:meth:`publish_shm_batch`), aborted or swept as
        one piece.

        Raises:
            Like :meth:`begin_shm_put`; on any error nothing stays reserved.
        """
        reservations, seg, shares, deadline = self._reserve_shared(keys, rows, nbytes, ttl)
        batch = ShmBatch(uuid.uuid4().hex, reservations, seg, deadline, writer, list(rows), shares)
        with self._lock:
            self._shm_batches[batch.id] = batch
        return batch

    def _reserve_shared(
        self, keys: Sequence[Partition], rows: Sequence[int], nbytes: int, ttl: float
    ) -> tuple[list[Reservation], Segment, list[int], float]:
        """Admit ``keys`` (each its share of a segment of ``nbytes``, by rows) and take the segment:
        ``(reservations, segment, shares, deadline)``."""
        arena = self._need_arena()
        if nbytes <= 0 or not keys or len(rows) != len(keys) or any(n <= 0 for n in rows):
            raise InvalidRequestError("shm batch: nbytes and every group's num_rows must be > 0")
        if ttl <= 0:
            raise InvalidRequestError(f"shm batch: ttl must be > 0, got {ttl}")
        self.sweep_shm()
        capacity = size_class(nbytes)
        total = sum(rows)
        shares = [capacity * n // total for n in rows]
        shares[-1] += capacity - sum(shares)
        reservations: list[Reservation] = self.begin_puts(keys, shares)  # all admitted, or none
        seg = self._acquire_segment(arena, nbytes, reservations)
        seg.exposed = True  # a process outside the server maps it for writing until it publishes
        seg.refs = len(keys)
        return reservations, seg, shares, self._clock() + ttl

    def shm_put_inline(
        self, key: Partition, data: bytes | bytearray, *, writer: str = "", num_rows: int | None = None
    ) -> StoredGroup:
        """Store one group whose IPC stream the server received whole (a small same-node put).

        The checks of :meth:`begin_shm_put`, one copy of ``data`` into the arena's current slab (small
        groups are packed one after another, :meth:`ShmArena.pack`; a stream larger than a slab gets a
        segment of its own), then :meth:`publish_shm`'s validation. All or nothing. Capacity counts the
        stream's size rounded up to 64 bytes.

        Raises:
            Like :meth:`begin_shm_put` and :meth:`publish_shm`.
        """
        arena = self._need_arena()
        if not data:
            raise InvalidRequestError(f"shm put of group {_fmt(key)}: the payload is empty")
        need = -(-len(data) // SLAB_ALIGN) * SLAB_ALIGN
        if need > arena.slab_bytes:  # larger than a slab: a segment of its own
            put = self.begin_shm_put(key, len(data), writer=writer, num_rows=num_rows)
            try:
                whole = put.segment.mm
                if whole is None:  # pragma: no cover - the segment was just acquired
                    raise NotFoundError(f"segment {put.segment.name} was released")
                whole[: len(data)] = data
            except BaseException:
                self.abort_shm([put.id])
                raise
            (group,) = self.publish_shm([(put.id, len(data))])
            return group
        self.sweep_shm()
        res = self.begin_put(key, None, need)
        slab, start = self._from_arena(lambda: arena.pack(len(data)), [res])
        try:
            slab.buffer(len(data), start)  # raises if the slab was released (the arena closed)
            mm = slab.mm
            if mm is None:  # pragma: no cover - checked just above
                raise NotFoundError(f"segment {slab.name} was released")
            mm[start : start + len(data)] = data
            table = self._open_stream(key, slab, len(data), start, num_rows)
            for batch in table.to_batches():
                if batch.num_rows:
                    validate_group(batch, self.schema, expect=key, full=True)
        except BaseException:
            res.release()
            arena.release_stream(slab, need)  # the region stays unused: stranded until the slab goes
            raise
        group = StoredGroup(key, (table,), (need,), table, writer, self._clock(), (slab,), (0,), (start,))
        (stored,) = self._commit_puts([res], [group], table.schema)  # on refusal it releases the slab
        return stored

    def _take_shm(self, ids: Sequence[str]) -> list[ShmPut]:
        with self._lock:
            missing = [i for i in ids if i not in self._shm_puts]
            if missing or len(set(ids)) != len(ids):
                raise NotFoundError(
                    f"shm reservation {echo(missing[0] if missing else ids[0])} is unknown, named twice, "
                    "expired or already published; put the group again",
                    reservation=missing[0] if missing else ids[0],
                )
            return [self._shm_puts.pop(i) for i in ids]

    def _drop_shm(self, puts: Iterable[ShmPut]) -> None:
        for put in puts:
            put.res.release()
            if self.arena is not None:
                self.arena.release(put.segment)

    def _drop_batch(self, batch: ShmBatch) -> None:
        for res in batch.reservations:
            res.release()
            if self.arena is not None:
                self.arena.release(batch.segment)  # one reference per group

    def publish_shm(self, items: Sequence[tuple[str, int]]) -> list[StoredGroup]:
        """Validate same-node writes and publish them, all at once or not at all.

        Each item is ``(reservation id, stream size)``. The segment's first ``size`` bytes must be one
        Arrow IPC stream holding the group (or, in a shared segment, every group of its batch in order);
        the server reads it in place (no copy) and runs the checks of a Flight put: the job's schema,
        ``validate_group(full=True)`` against the key, the announced rows, and the epoch fence again at
        commit. The stored table aliases the segment. Any failure releases every segment of the call and
        publishes nothing. The groups of a shared segment must be published in the same call.

        Raises:
            NotFoundError (unknown or expired reservation), SchemaError, InvalidRequestError,
            StaleFenceError.
        """
        if not items:
            raise InvalidRequestError("shm_publish: name at least one reservation")
        puts = self._take_shm([i for i, _ in items])
        for put in puts:
            put.segment.exposed = False  # its writer is done writing: the segment may be reused later
        try:
            groups = self._read_published(puts, [size for _, size in items])
        except BaseException:
            self._drop_shm(puts)
            raise
        return self._commit_puts([p.res for p in puts], groups, groups[0].parts[0].schema)

    def publish_shm_batch(self, reservation: str, size: int) -> list[StoredGroup]:
        """Validate and publish every group of a batch reserved by :meth:`reserve_shm_batch`, all or none.

        ``size`` is the size of the one IPC stream written into the segment. The checks of
        :meth:`publish_shm` for a shared segment: the job's schema, the rows announced, one
        ``validate_group(full=True)`` of the whole stream against every group's key, the epoch fence again
        at commit. Any failure gives the reservations and the segment back and publishes nothing; the
        reservation publishes once.

        Raises:
            NotFoundError (unknown, expired or already published reservation), SchemaError,
            InvalidRequestError, StaleFenceError.
        """
        with self._lock:
            batch = self._shm_batches.pop(reservation, None)
        if batch is None:
            raise NotFoundError(
                f"shm reservation {echo(reservation)} is unknown, expired or already published; put the "
                "groups again",
                reservation=reservation,
            )
        seg = batch.segment
        seg.exposed = False  # its writer is done writing: the segment may be reused later
        keys = [res.key for res in batch.reservations]
        try:
            table = self._open_stream(keys[0], seg, size, 0, None)
            self.schema.check(table.schema)
            groups = self._shared_groups(seg, table, keys, batch.rows, batch.shares, batch.writer)
        except BaseException:
            self._drop_batch(batch)
            raise
        return self._commit_puts(batch.reservations, groups, table.schema)

    def _read_published(self, puts: Sequence[ShmPut], sizes: Sequence[int]) -> list[StoredGroup]:
        opened: dict[int, pa.Table] = {}
        users: dict[int, int] = {}
        for put in puts:
            users[id(put.segment)] = users.get(id(put.segment), 0) + 1
        groups: list[StoredGroup] = []
        shared: dict[int, StoredGroup] = {}  # id(put) -> its group, for members of shared segments
        schema: pa.Schema | None = None
        for put, size in zip(puts, sizes, strict=True):
            seg = put.segment
            if users[id(seg)] != seg.refs:
                raise InvalidRequestError(
                    f"shm_publish: group {_fmt(put.res.key)} shares its segment with groups not published "
                    "in this call; publish every group of a batch together"
                )
            table = opened.get(id(seg))
            if table is None:
                table = opened[id(seg)] = self._open_written(put, size)
                if schema is None:
                    schema = table.schema
                    self.schema.check(schema)
                elif not table.schema.equals(schema):
                    raise InvalidRequestError(
                        f"shm_publish: group {_fmt(put.res.key)} has another schema than the first "
                        "group of the call; publish groups of different schemas separately"
                    )
                if seg.refs > 1:  # a shared stream: the rows add up, then one validation of all groups
                    members = sorted((p for p in puts if p.segment is seg), key=lambda p: p.offset)
                    made = self._shared_groups(
                        seg,
                        table,
                        [p.res.key for p in members],
                        [int(p.num_rows or 0) for p in members],
                        [p.share for p in members],
                        put.writer,
                    )
                    shared.update(zip(map(id, members), made, strict=True))
            if seg.refs > 1:
                groups.append(shared[id(put)])
                continue
            for batch in table.to_batches():
                if batch.num_rows:
                    validate_group(batch, self.schema, expect=put.res.key, full=True)
            groups.append(
                StoredGroup(
                    put.res.key, (table,), (put.share,), table, put.writer, self._clock(), (seg,),
                    (put.offset,),
                )
            )  # fmt: skip
        return groups

    def _shared_groups(
        self,
        seg: Segment,
        table: pa.Table,
        keys: Sequence[Partition],
        rows: Sequence[int],
        shares: Sequence[int],
        writer: str,
    ) -> list[StoredGroup]:
        """The groups of a shared segment's stream ``table``, one after another in stream order, once the
        rows add up and one validation of the whole stream passed.

        Each group holds the whole stream as its first part and its first row as its offset; its own
        table is sliced only when first asked for (:attr:`StoredGroup.table`), not here.
        """
        announced = sum(rows)
        if announced != table.num_rows:
            raise InvalidRequestError(
                f"shm batch: {table.num_rows} rows written, {announced} announced; put it again"
            )
        self._validate_batch(table, keys, rows)
        now, parts, segments = self._clock(), (table,), (seg,)
        out, offset = [], 0
        for key, n, share in zip(keys, rows, shares, strict=True):
            out.append(StoredGroup(key, parts, (share,), None, writer, now, segments, (offset,), (), n))
            offset += n
        return out

    def _validate_batch(self, table: pa.Table, keys: Sequence[Partition], rows: Sequence[int]) -> None:
        """``validate_group(full=True)`` of every group of a shared stream, in one pass.

        ``validate_group`` checks rows one by one (Arrow validity, schema, nulls, per-token lengths) plus
        one constant key per batch; so the whole stream is validated once with the key columns that vary
        between groups replaced by constants, and those are compared with the expected per-row keys in
        one vectorised pass (where every group has one job and epoch, as in the compact form, only
        ``group_id`` varies: ``validate_group`` checks the other two against the first key). Any failure
        re-runs the per-group check, so the error names the group and its own row.
        """
        try:
            first = keys[0]
            varying = (
                ("group_id",)
                if all(k.job_id == first.job_id and k.epoch == first.epoch for k in keys)
                else _KEY_NAMES
            )
            batches = table.to_batches()
            if len(batches) != 1:
                batches = table.combine_chunks().to_batches()
            if len(batches) != 1:
                raise SchemaError("several batches")  # take the per-group path
            whole = batches[0]
            for name in varying:
                index = whole.schema.get_field_index(name)
                column = whole.column(index) if index >= 0 else None
                if column is not None:
                    # Compared before validate_group sees it (it validates the constants put in its
                    # place): a key column with offsets out of range must never be read.
                    column.validate(full=True)
                if column is None or column.null_count or not _holds_keys(column, name, keys, rows):
                    raise SchemaError(f"column {name!r} does not match the groups' keys")
                constant = pa.repeat(pa.scalar(getattr(first, name), type=column.type), whole.num_rows)
                whole = whole.set_column(index, whole.schema.field(index), constant)
            validate_group(whole, self.schema, expect=first, full=True)
        except (
            SchemaError,
            OverflowError,
            pa.ArrowInvalid,
            pa.ArrowTypeError,
            pa.ArrowNotImplementedError,
        ):
            offset = 0
            for key, n in zip(keys, rows, strict=True):  # the precise error, group by group
                for part in table.slice(offset, n).to_batches():
                    if part.num_rows:
                        validate_group(part, self.schema, expect=key, full=True)
                offset += n

    def _open_written(self, put: ShmPut, size: int) -> pa.Table:
        announced = put.num_rows if put.segment.refs == 1 else None  # a shared stream adds up later
        return self._open_stream(put.res.key, put.segment, size, 0, announced)

    def _open_stream(
        self, key: Partition, seg: Segment, size: int, start: int, num_rows: int | None
    ) -> pa.Table:
        """The IPC stream of ``size`` bytes at ``start`` of ``seg`` as a table aliasing it (no copy), with
        at least one sample and, when given, ``num_rows`` of them."""
        if not 0 < size <= seg.capacity - start:
            raise InvalidRequestError(
                f"shm put of group {_fmt(key)}: size {size} is outside the segment (1..{seg.capacity})"
            )
        try:
            reader = ipc.open_stream(pa.BufferReader(seg.buffer(size, start)))
            batches = [b for b in reader if b.num_rows]
        except (pa.ArrowInvalid, OSError) as exc:
            raise SchemaError(
                f"shm put of group {_fmt(key)}: the segment does not hold one Arrow IPC stream ({exc}); "
                "write it with pyarrow.ipc.new_stream and publish the size written"
            ) from None
        rows = sum(b.num_rows for b in batches)
        if rows == 0:
            raise InvalidRequestError(f"shm put of group {_fmt(key)}: the stream carried no samples")
        if num_rows is not None and rows != num_rows:
            raise InvalidRequestError(
                f"shm put of group {_fmt(key)}: {rows} rows written, {num_rows} announced; put it again"
            )
        return pa.Table.from_batches(batches, reader.schema)

    def abort_shm(self, ids: Sequence[str]) -> int:
        """Drop same-node puts the writer gave up on (unknown ids are ignored); returns how many groups.

        An id is a group's (:meth:`begin_shm_put`, :meth:`begin_shm_batch`) or a whole batch's
        (:meth:`reserve_shm_batch`: all its groups are given up).
        """
        with self._lock:
            puts = [self._shm_puts.pop(i) for i in ids if i in self._shm_puts]
            batches = [self._shm_batches.pop(i) for i in ids if i in self._shm_batches]
        self._drop_shm(puts)
        for batch in batches:
            self._drop_batch(batch)
        return len(puts) + sum(len(b.rows) for b in batches)

    def sweep_shm(self, now: float | None = None) -> int:
        """Drop same-node puts past their deadline (a writer killed mid-write); returns how many groups.

        Their reservations are given back and their segments unlinked (never reused).
        """
        now = self._clock() if now is None else now
        with self._lock:
            expired = [p for p in self._shm_puts.values() if p.deadline <= now]
            for put in expired:
                del self._shm_puts[put.id]
            batches = [b for b in self._shm_batches.values() if b.deadline <= now]
            for batch in batches:
                del self._shm_batches[batch.id]
        self._drop_shm(expired)
        for batch in batches:
            self._drop_batch(batch)
        return len(expired) + sum(len(b.rows) for b in batches)

    def shm_open(
        self, reads: Sequence[GroupRead], columns: Sequence[str] | None = None
    ) -> list[tuple[StoredGroup, tuple[Segment, ...], tuple[int, int] | None]]:
        """Hand the segments of groups to a same-node reader, under the same checks as :meth:`read`.

        A read carrying a token is fenced and raises the group's highest generation. The segments are
        marked as handed to readers: once the group is deleted they are reused only when no reader maps
        them any more (each mapping holds a shared lock on its file, see :func:`~._shm.map_segment`), so
        a reader's mappings keep their bytes for as long as it keeps them.

        Returns:
            ``(group, segments, fence)`` per read, in order; each segment holds one part (an IPC stream);
            ``fence`` is the group's ``(slot, tag)`` on the fence board (taken under the same lock, so it
            matches these parts), or None.

        Raises:
            NotFoundError, StaleFenceError, SchemaError (a projected column is not stored),
            InvalidRequestError (no arena here).
        """
        self._need_arena()
        with self._lock:
            # Every check passes before any generation is raised: the projection first, then the fence.
            for r in reads if columns is not None else ():
                group = self._groups.get(r.key)
                stored = [] if group is None else group.schema.names
                missing = [c for c in columns or () if c not in stored]
                if group is not None and missing:
                    raise SchemaError(
                        f"group {_fmt(r.key)} has no column {echo(missing[0])}; stored columns: "
                        f"{echo(', '.join(stored))}",
                        column=missing[0],
                    )
            found = self._fenced_reads_locked(reads)
            for group in found:
                for seg in group.segments:
                    seg.readers = True
            board = self.board
            return [(g, g.segments, None if board is None else board.entry(g.key)) for g in found]
