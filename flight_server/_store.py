"""The in-memory group store: the groups by key and their atomic transitions (publish, column append,
read, delete, fence) under one lock.

Layout: each stored group is a tuple of *parts*, each a table over Arrow buffers. The first part holds the
columns the writer put; each column append adds one part with only the new columns, so existing columns
are never rewritten. Without an arena a part keeps the very buffers Flight received (no copy: the fastest
put and the least memory). With a shared-memory arena every part lives in an arena segment, placed by the
store's collaborator :class:`~.shm._store.ShmStore` (:attr:`GroupStore.shm`), which also admits and
publishes the puts of same-host writers; same-host readers map them (:meth:`GroupStore.shm_open`). The
table served to readers is a zero-copy view over the parts.

What the store refuses is decided by its :class:`~._fencing.Fences` (epochs, lease generations,
tombstones, column types) and :class:`~._capacity.Capacity` (bytes and group slots). Reads, appends and
deletes are fenced by generation only, not by epoch: a job restored from a checkpoint under a new epoch
re-offers READY groups of the old epoch under new, higher generations, and their new holders must reach
them.

The records (:class:`StoredGroup`, :class:`StoreLimits`, :class:`Reservation`) live in
:mod:`._store_records` and are re-exported here. This module does not verify signatures (the server does)
and does no I/O. It is thread-safe: one lock guards the maps and their collaborators' counts;
serialisation and validation run outside it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa

from trajflight.codec import STANDARD_SCHEMA, TrajectorySchema
from trajflight.errors import AlreadyExistsError, InvalidRequestError, NotFoundError, SchemaError
from trajflight.flight_server._capacity import Capacity
from trajflight.flight_server._fencing import Fences
from trajflight.flight_server._segments import concat_groups
from trajflight.flight_server._store_records import Reservation, StoredGroup, StoreLimits, fmt_key, key_fields
from trajflight.flight_server._wire import GroupRead, LeaseToken, ListCriteria
from trajflight.flight_server._wire_bounds import echo
from trajflight.flight_server.shm._arena import ShmArena
from trajflight.flight_server.shm._segment import Segment
from trajflight.flight_server.shm._store import ShmStore
from trajflight.keys import Partition
from trajflight.logs import context as log_context

__all__ = ["GroupStore", "Reservation", "StoreLimits", "Stored", "StoredGroup"]

log = logging.getLogger("trajflight.flight_server")

Stored = StoredGroup[Segment]
"""A group as this store keeps it: its parts placed in arena segments (none without an arena)."""


class GroupStore:
    """Groups by partition key, with fencing and bounded capacity.

    Args:
        limits: Capacity and size bounds.
        schema: The trajectory schema groups are checked against (types of user columns are fixed per job
            by the first group that carries them).
        arena: A shared-memory arena (:class:`~.shm._arena.ShmArena`): every part is placed in one of
            its segments by :attr:`shm` (Flight puts and appends copy once into it; same-host writers write
            into it directly), deletes give the segments back, capacity counts segment sizes.
        clock: Monotonic clock, injectable for tests.
    """

    def __init__(
        self,
        limits: StoreLimits | None = None,
        *,
        schema: TrajectorySchema = STANDARD_SCHEMA,
        arena: ShmArena | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits or StoreLimits()
        self.schema = schema
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[Partition, Stored] = {}
        self._pending: dict[Partition, Reservation] = {}  # in-flight puts, by key
        self._appends: set[int] = set()  # ids of in-flight append reservations
        self.shm = (
            None if arena is None else ShmStore(arena, self, schema=schema, limits=self.limits, clock=clock)
        )
        """The arena's side of the store (None without an arena): placement and same-host puts."""
        self.board = None if self.shm is None else self.shm.board  # generations for same-host readers
        self._fences = Fences(self.board)  # epochs, generations, tombstones, column types: under the lock
        self._capacity = Capacity(self.limits)  # bytes held and reserved: under the lock
        self._groups_read = 0  # groups handed to readers (do_get or shared-memory handles), for stats
        self._bytes_read = 0  # their stored bytes (before projection)
        self._groups_put = 0  # groups published (every route), for stats and metrics
        self._bytes_put = 0  # their stored bytes
        self._groups_deleted = 0  # groups deleted or purged

    # ------------------------------------------------------------------------------------- accounting

    def reserve_bytes(self, res: Reservation, nbytes: int) -> None:
        """Count ``nbytes`` more for ``res`` against capacity (a :class:`Reservation` calls it).

        Raises:
            InvalidRequestError: over ``max_group_bytes``. CapacityExceededError: the store is full.
        """
        with self._lock:
            self._capacity.reserve(res, nbytes, self._stranded())

    def _stranded(self) -> int:
        """Slab bytes no group counts any more (a slab kept alive by a few of its groups): they still
        occupy the arena, so capacity bounds them too."""
        return self.shm.stranded_bytes if self.shm is not None else 0

    def release_reservation(self, res: Reservation) -> None:
        """Give back what ``res`` holds: its bytes and its group slot (a :class:`Reservation` calls it)."""
        with self._lock:
            self._release_locked(res)

    def _release_locked(self, res: Reservation) -> None:
        self._capacity.release(res)
        if res.counts_group and self._pending.get(res.key) is res:
            del self._pending[res.key]
        self._appends.discard(id(res))

    # -------------------------------------------------------------------------------------------- put

    def begin_put(
        self, key: Partition, schema: pa.Schema | None, announced_bytes: int | None = None
    ) -> Reservation:
        """Admit a put of ``key`` before its payload arrives; returns its reservation.

        Checks, in order: the epoch is not fenced, the schema fits the job, the key is neither stored nor
        being put, a group slot is free, and the announced bytes fit.

        A ``schema`` of None (a same-node put: the schema is in the segment) is checked at publish.

        Raises:
            StaleFenceError, SchemaError, AlreadyExistsError, CapacityExceededError, InvalidRequestError.
        """
        if schema is not None:
            self.schema.check(schema)
        res = Reservation(self, key, counts_group=True)
        with self._lock:
            self._admit_locked(res, schema)
        try:
            if announced_bytes:
                res.reserve(announced_bytes)
        except BaseException:
            res.release()
            raise
        return res

    def _admit_locked(self, res: Reservation, schema: pa.Schema | None) -> None:
        """:meth:`begin_put`'s checks of ``res.key`` but the bytes (caller holds the lock), then ``res``
        holds the key and a group slot."""
        key, fences = res.key, self._fences
        fences.check_epoch(key, "put")
        fences.check_not_deleted(key)
        if schema is not None:
            fences.check_schema(key, schema)
        if key in self._groups or key in self._pending:
            state = "stored" if key in self._groups else "being written by another put"
            raise AlreadyExistsError(
                f"group {_fmt(key)} is already {state}; trajflight never overwrites a group: "
                "use a new group_id",
                job_id=key.job_id,
                epoch=key.epoch,
                group_id=key.group_id,
            )
        self._capacity.check_slot(len(self._groups) + len(self._pending))
        self._pending[key] = res

    def begin_puts(
        self, keys: Sequence[Partition], announced: Sequence[int], schema: pa.Schema | None = None
    ) -> list[Reservation]:
        """:meth:`begin_put` of each key with its announced bytes, all or none; ``schema`` is the stream's
        (every group's), None where it is checked at publish (a same-node put: it is in the segment).

        The checks, their order and their errors are :meth:`begin_put`'s, group by group in the order
        given (the first group refused is the one named). They run under one hold of the lock, so a batch
        is admitted whole or not at all; and when every group passes (checked for the batch at once: its
        epochs, its schema once per job, its keys, its slots and its bytes in total), nothing runs per
        group but making its reservation.

        Raises:
            StaleFenceError, SchemaError (with ``schema``), AlreadyExistsError, CapacityExceededError,
            InvalidRequestError; nothing stays reserved.
        """
        if len(keys) != len(announced):
            raise InvalidRequestError(f"begin_puts: {len(announced)} sizes for {len(keys)} groups")
        if not keys:
            return []
        if schema is not None:
            self.schema.check(schema)  # as begin_put does, before the lock; the same for every group
        with self._lock:
            stranded = self._stranded()
            if self._admits_all_locked(keys, announced, stranded, schema):
                out = [
                    Reservation(self, key, True, nbytes) for key, nbytes in zip(keys, announced, strict=True)
                ]
                pending = self._pending
                for res in out:
                    pending[res.key] = res
                self._capacity.reserved_bytes += sum(announced)
                return out
            # Some group is refused: admit them one by one as begin_put would, so the error is its own.
            out = []
            try:
                for key, nbytes in zip(keys, announced, strict=True):
                    res = Reservation(self, key, counts_group=True)
                    self._admit_locked(res, schema)
                    out.append(res)
                    if nbytes:
                        self._capacity.reserve(res, nbytes, stranded)
            except BaseException:
                for res in out:
                    self._release_locked(res)
                    res.done = True
                raise
            return out  # pragma: no cover - the check for the batch refuses only what one of these does

    def _admits_all_locked(
        self,
        keys: Sequence[Partition],
        announced: Sequence[int],
        stranded: int,
        schema: pa.Schema | None,
    ) -> bool:
        """True when :meth:`begin_puts` admits every group: no epoch fenced, the schema fits each job (where
        given), no key stored, being put or named twice, enough group slots, and the bytes fit (each, and
        in total). Caller holds the lock."""
        stored, pending = self._groups, self._pending
        if not self._capacity.fits(len(stored) + len(pending), announced, stranded):
            return False
        if not (
            len(set(keys)) == len(keys)
            and not any(key in stored or key in pending for key in keys)
            and self._fences.admits(keys)
        ):
            return False
        if schema is not None:
            try:
                for first in {key.job_id: key for key in keys}.values():  # it depends on the job only
                    self._fences.check_schema(first, schema)
            except SchemaError:
                return False  # admitted one by one, so that the error is the first refused group's
        return True

    def publish(
        self, res: Reservation, batches: Sequence[pa.RecordBatch], schema: pa.Schema, writer: str
    ) -> Stored:
        """Make a fully received, validated group visible, atomically; consumes the reservation.

        The batches' buffers are kept (or copied once into a placed segment, see :meth:`_part`).

        Raises:
            CapacityExceededError: a placed segment does not fit (framing overhead at the edge).
            StaleFenceError: the job was fenced while the stream arrived.
        """
        return self.publish_many([(res, batches)], schema, writer)[0]

    def publish_many(
        self,
        items: Sequence[tuple[Reservation, Sequence[pa.RecordBatch]]],
        schema: pa.Schema,
        writer: str,
    ) -> list[Stored]:
        """Publish several received, validated groups all at once or not at all; consumes reservations.

        With an arena, several groups are placed together (:meth:`ShmStore.place_together`): one
        segment, one copy. Each group counts what it holds against capacity; where that is more than its
        reservation, the rest is reserved under one hold of the lock for all of them.

        Raises:
            Like :meth:`publish`; on any error no group of ``items`` becomes visible (the reservations are
            the caller's to give back, unless the commit refused: it gives them back).
        """
        groups: list[Stored] = []
        try:
            if self.shm is not None and len(items) > 1:
                groups = self.shm.place_together(items, schema, writer)
            else:
                for res, batches in items:
                    table, nbytes, seg = self._part(batches, schema)
                    segs = () if seg is None else (seg,)
                    now = self._clock()
                    groups.append(StoredGroup(res.key, (table,), (nbytes,), table, writer, now, segs))
            short = [(res, g.nbytes - res.reserved) for (res, _), g in zip(items, groups, strict=True)]
            short = [(res, n) for res, n in short if n > 0]
            if short:
                with self._lock:
                    stranded = self._stranded()
                    for res, n in short:
                        self._capacity.reserve(res, n, stranded)
        except BaseException:
            self._release_parts(groups)
            raise
        return self.commit_puts([res for res, _ in items], groups, schema)

    def commit_puts(
        self, reservations: Sequence[Reservation], groups: list[Stored], schema: pa.Schema
    ) -> list[Stored]:
        """Re-check fences and schema under the lock, then make ``groups`` visible all at once.

        On a refusal no group becomes visible, reservations are given back and segments released.
        """
        fences = self._fences
        try:
            with self._lock:
                try:
                    checked: set[str] = set()  # one schema for the call: checked once per job
                    epochs: set[tuple[str, int]] = set()  # the fence depends on the job and epoch only
                    for res in reservations:
                        key = res.key
                        if key[:2] not in epochs:
                            fences.check_epoch(key, "put")
                            epochs.add(key[:2])
                        fences.check_not_deleted(key)  # deleted while its stream arrived
                        if key.job_id not in checked:
                            fences.check_schema(key, schema)
                            checked.add(key.job_id)
                except BaseException:
                    for res in reservations:
                        self._release_locked(res)
                        res.done = True
                    raise
                for job_id in checked:
                    fences.learn_columns(job_id, schema)
                stored = self._groups
                for res, group in zip(reservations, groups, strict=True):
                    stored[res.key] = group
                    fences.installed(res.key)
                    self._capacity.held_bytes += group.nbytes
                    self._release_locked(res)
                    res.done = True
                self._groups_put += len(groups)
                self._bytes_put += sum(g.nbytes for g in groups)
        except BaseException:
            self._release_parts(groups)
            raise
        return groups

    def _part(
        self, batches: Sequence[pa.RecordBatch], schema: pa.Schema
    ) -> tuple[pa.Table, int, Segment | None]:
        """A received part as stored: its table, the bytes it counts and its segment (with an arena, one
        copy into a segment of its own; without, the received buffers as they are)."""
        if self.shm is not None:
            return self.shm.place(batches, schema)
        table = pa.Table.from_batches(batches, schema)
        return table, sum(b.get_total_buffer_size() for b in batches), None

    def _release_parts(self, groups: Iterable[Stored]) -> None:
        """Give dropped groups' segments back to the arena (outside the lock)."""
        if self.shm is not None:
            self.shm.release(groups)

    # ----------------------------------------------------------------------------------------- append

    def begin_append(
        self, key: Partition, token: LeaseToken, schema: pa.Schema, announced: int | None
    ) -> Reservation:
        """Admit a column append to ``key`` under ``token`` before its payload arrives.

        Raises:
            NotFoundError, StaleFenceError, AlreadyExistsError (a column exists), SchemaError,
            CapacityExceededError.
        """
        with self._lock:
            self._check_append_locked(key, token, schema)
            res = Reservation(self, key, counts_group=False)
            self._appends.add(id(res))
        try:
            if announced:
                res.reserve(announced)
        except BaseException:
            res.release()
            raise
        return res

    def _check_append_locked(self, key: Partition, token: LeaseToken, schema: pa.Schema) -> Stored:
        self._fences.check_token(key, token, "column append", required=True)
        group = self._groups.get(key)
        if group is None:
            raise NotFoundError(f"group {_fmt(key)} is not stored here; nothing to append to", **_kd(key))
        existing = set(group.schema.names)
        for f in schema:
            if f.name in existing:
                raise AlreadyExistsError(
                    f"group {_fmt(key)} already has column {echo(f.name)}; appends add new columns only",
                    column=f.name,
                )
            if f.name in self.schema and not self.schema.accepts(f.name, f.type):
                raise SchemaError(
                    f"column {echo(f.name)} has type {f.type}, the schema declares "
                    f"{self.schema.field(f.name).type}",
                    column=f.name,
                )
        self._fences.check_schema(key, schema)
        return group

    def publish_append(
        self, res: Reservation, token: LeaseToken, batches: Sequence[pa.RecordBatch], schema: pa.Schema
    ) -> Stored:
        """Add the new columns to the stored group atomically, re-checking the fence at commit.

        Existing parts are kept as they are; readers see either the old or the new group.

        Raises:
            SchemaError: the row count differs from the group's. Plus those of :meth:`begin_append`.
        """
        rows = sum(b.num_rows for b in batches)
        added, nbytes, seg = self._part(batches, schema)
        segs = () if seg is None else (seg,)
        try:
            if nbytes > res.reserved:
                self.reserve_bytes(res, nbytes - res.reserved)
            with self._lock:
                try:
                    group = self._check_append_locked(res.key, token, schema)
                    if rows != group.num_rows:
                        raise SchemaError(
                            f"appended columns have {rows} rows, group {_fmt(res.key)} has "
                            f"{group.num_rows}; send one value per sample, in the stored order",
                        )
                except BaseException:
                    self._release_locked(res)
                    res.done = True
                    raise
                new = self._append_locked(res, token, group, added, nbytes, segs, schema)
        except BaseException:
            if seg is not None and self.shm is not None:
                self.shm.arena.release(seg)
            raise
        return new

    def _append_locked(
        self,
        res: Reservation,
        token: LeaseToken,
        group: Stored,
        added: pa.Table,
        nbytes: int,
        segs: tuple[Segment, ...],
        schema: pa.Schema,
    ) -> Stored:
        """Install the appended part (caller holds the lock and checked the append)."""
        table = group.table
        for name, column in zip(added.column_names, added.columns, strict=True):
            table = table.append_column(added.schema.field(name), column)
        kept = range(len(group.parts))  # the old parts keep where they sit in their segments
        new = StoredGroup(
            res.key,
            (*group.parts, added),
            (*group.part_bytes, nbytes),
            table,
            group.writer,
            group.created,
            (*group.segments, *segs),
            (*(group.row_offset(i) for i in kept), 0),
            (*(group.start(i) for i in kept), 0),
        )
        self._groups[res.key] = new
        self._capacity.held_bytes += nbytes
        self._fences.raise_to(res.key, token.generation)
        self._fences.installed(res.key)  # a new tag: readers holding the old parts ask the server again
        self._fences.learn_columns(res.key.job_id, schema)
        self._release_locked(res)
        res.done = True
        return new

    # ------------------------------------------------------------------------------------ read/delete

    def read(self, reads: Sequence[GroupRead], columns: Sequence[str] | None = None) -> pa.Table:
        """Return the groups as one table (in ticket order), projected to ``columns``.

        A read carrying a token is fenced (and raises the group's highest generation); a tokenless read is
        an analyst's and is allowed. The result aliases stored buffers (zero-copy).

        Raises:
            NotFoundError, StaleFenceError, SchemaError (a projected column is not stored).
        """
        # Every check passes before any generation rises: the projection (and the join, which can
        # refuse groups of two jobs whose columns differ in type) runs on groups checked under the lock,
        # and the tokens are checked again, then raised, only once the table exists.
        with self._lock:
            groups = self._checked_reads_locked(reads)
        table = concat_groups([_projected(run, columns) for run in _runs(groups)])
        with self._lock:
            self._fenced_reads_locked(reads)
        return table

    def _checked_reads_locked(self, reads: Sequence[GroupRead]) -> list[Stored]:
        """The groups of ``reads`` (in order) after the read checks (stored; tokens not stale); changes
        nothing. Call with the lock held."""
        groups = []
        for r in reads:
            group = self._groups.get(r.key)
            if group is None:
                raise NotFoundError(
                    f"group {_fmt(r.key)} is not stored here (never put, deleted, or on another server)",
                    **_kd(r.key),
                )
            if r.token is not None:
                self._fences.check_token(r.key, r.token, "read", required=False)
            groups.append(group)
        return groups

    def _fenced_reads_locked(self, reads: Sequence[GroupRead]) -> list[Stored]:
        """The groups of ``reads`` (in order) after the read checks; raises each read's generation.

        Tokened reads are fenced by generation; every check passes before any generation is raised.
        Call with the lock held.
        """
        groups = self._checked_reads_locked(reads)
        for r in reads:
            if r.token is not None:
                self._fences.raise_to(r.key, r.token.generation)
        self._groups_read += len(groups)
        self._bytes_read += sum(g.nbytes for g in groups)
        return groups

    def shm_open(
        self, reads: Sequence[GroupRead], columns: Sequence[str] | None = None
    ) -> list[tuple[Stored, tuple[int, int] | None]]:
        """Hand the segments of groups to a same-host reader, under the same checks as :meth:`read`.

        A read carrying a token is fenced and raises the group's highest generation. The segments are
        marked as handed to readers: once the group is deleted they are reused only when no reader maps
        them any more (each mapping holds a shared lock on its file, see
        :func:`~.shm._segment.map_segment`), so a reader's mappings keep their bytes for as long as it
        keeps them.

        Returns:
            ``(group, fence)`` per read, in order; each of the group's segments holds one of its parts (an
            IPC stream); ``fence`` is the group's ``(slot, tag)`` on the fence board (taken under the same
            lock, so it matches these parts), or None.

        Raises:
            NotFoundError, StaleFenceError, SchemaError (a projected column is not stored),
            InvalidRequestError (no arena here).
        """
        if self.board is None:
            raise InvalidRequestError(
                "this server has no shared-memory arena (start it with --shm-dir); put and read over "
                "Flight (transport='flight')"
            )
        board = self.board
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
            return [(g, board.entry(g.key)) for g in found]

    def get(self, key: Partition) -> Stored:
        """The stored group ``key`` (no fencing: metadata only). Raises :class:`NotFoundError`."""
        with self._lock:
            group = self._groups.get(key)
        if group is None:
            raise NotFoundError(f"group {_fmt(key)} is not stored here", **_kd(key))
        return group

    def delete(self, reads: Sequence[GroupRead]) -> dict[str, Any]:
        """Delete groups under their holders' tokens; idempotent (absent groups are reported, not errors).

        All tokens are checked before anything is deleted. Bytes go back to capacity at once; memory is
        freed when the last reader's stream over them ends. Every key named, stored or not, is
        tombstoned: a later put of it, or one still in flight, is refused (:mod:`._tombstones`).

        Raises:
            StaleFenceError: a token is missing or older than the highest generation seen.
        """
        with self._lock:
            for r in reads:
                self._fences.check_token(r.key, r.token, "delete", required=True)
            deleted, missing, freed = 0, [], 0
            dropped = []
            for r in reads:
                generation = -1 if r.token is None else r.token.generation  # never None: checked above
                self._fences.deleted(r.key, generation)  # stored, being put or never seen: tombstoned
                group = self._groups.pop(r.key, None)
                if group is None:
                    missing.append(_kd(r.key))
                    continue
                dropped.append(group)
                deleted += 1
                freed += group.nbytes
            self._capacity.held_bytes -= freed
            self._groups_deleted += deleted
        self._release_parts(dropped)
        if log.isEnabledFor(logging.DEBUG):
            for r in reads:
                token = None if r.token is None else r.token.generation
                log.debug("group deleted", extra=log_context(partition=r.key, token=token))
        return {"deleted": deleted, "bytes_freed": freed, "missing": missing}

    def fence(self, job_id: str, min_epoch: int, *, purge: bool = False) -> dict[str, Any]:
        """Refuse epochs of ``job_id`` below ``min_epoch`` (monotonic: a lower fence changes nothing).

        With ``purge``, stored groups of fenced epochs are deleted and their bytes given back.
        """
        with self._lock:
            fenced = self._fences.fence(job_id, min_epoch, self._groups)
            purged, freed = 0, 0
            dropped = []
            if purge:
                for key in [k for k in self._groups if k.job_id == job_id and k.epoch < fenced]:
                    dropped.append(self._groups.pop(key))
                    freed += dropped[-1].nbytes
                    self._fences.purged(key)
                    purged += 1
                self._capacity.held_bytes -= freed
                self._groups_deleted += purged
            result = {
                "job_id": job_id,
                "min_epoch": fenced,
                "purged_groups": purged,
                "bytes_freed": freed,
            }
        self._release_parts(dropped)
        log.info(
            "job fenced below epoch %d (%d groups purged)", fenced, purged, extra=log_context(job=job_id)
        )
        return result

    def advance_generation(self, reads: Iterable[GroupRead]) -> tuple[int, list[dict[str, Any]]]:
        """Raise the highest generation of groups (the controller re-granted them).

        Returns:
            How many rose, and the groups this server neither stores nor is receiving (a trainer's
            lease of them can never be read here: a server restarted empty lost them).
        """
        reads = list(reads)
        untokened = next((r for r in reads if r.token is None), None)
        if untokened is not None:  # checked for every group before any rises
            raise InvalidRequestError(f"advance_generation of group {_fmt(untokened.key)} needs a generation")
        raised = 0
        with self._lock:
            absent = [_kd(r.key) for r in reads if r.key not in self._groups and r.key not in self._pending]
            for r in reads:
                if r.token is not None and self._fences.raise_to(r.key, r.token.generation):
                    raised += 1
        return raised, absent

    # ------------------------------------------------------------------------------------ inspection

    def list_groups(self, criteria: ListCriteria | None = None) -> list[Stored]:
        """Stored groups matching ``criteria`` (None: all), sorted by key."""
        criteria = criteria or ListCriteria()
        with self._lock:
            groups = [
                g
                for k, g in self._groups.items()
                if (criteria.job_id is None or k.job_id == criteria.job_id)
                and (criteria.epoch is None or k.epoch == criteria.epoch)
            ]
        return sorted(groups, key=lambda g: (g.key.job_id, g.key.epoch, g.key.group_id))

    def stats(self) -> dict[str, Any]:
        """Counts for the ``stats`` action: groups, bytes, reservations, capacity, and per job/epoch."""
        with self._lock:
            jobs: dict[str, Any] = {}
            for key, group in self._groups.items():
                job = jobs.setdefault(key.job_id, {"groups": 0, "bytes": 0, "epochs": {}})
                epoch = job["epochs"].setdefault(str(key.epoch), {"groups": 0, "bytes": 0})
                for entry in (job, epoch):
                    entry["groups"] += 1
                    entry["bytes"] += group.nbytes
            self._fences.job_figures(jobs)
            return {
                "groups": len(self._groups),
                **self._capacity.figures(),
                "pending_puts": len(self._pending),
                "pending_appends": len(self._appends),
                "pending_shm_puts": 0 if self.shm is None else self.shm.pending_groups(),
                "tombstones": self._fences.tombstone_figures(),
                "groups_read": self._groups_read,
                "bytes_read": self._bytes_read,
                "groups_put": self._groups_put,
                "bytes_put": self._bytes_put,
                "groups_deleted": self._groups_deleted,
                "jobs": jobs,
                **({"shm": self.shm.stats()} if self.shm is not None else {}),
            }


def _runs(groups: Sequence[Stored]) -> list[tuple[Stored, pa.Table]]:
    """The groups' tables in order, consecutive rows of one stored batch read as one slice of it.

    Groups put together (one ``put_many`` or same-host batch) share one stored stream as their only part;
    where a read names them in their stored order, their rows are one slice of it, so a reader gets one
    record batch per stored batch instead of one per group (a remote reader's decode then joins nothing).
    Each run is paired with its first group, which names it in errors."""
    runs: list[tuple[Stored, int, int]] = []  # (first group, first row, rows) over first.parts[0]
    for group in groups:
        rows = _rows(group)
        if runs and len(group.parts) == 1 and group.offsets:
            first, start, n = runs[-1]
            if start >= 0 and group.parts[0] is first.parts[0] and group.offsets[0] == start + n:
                runs[-1] = (first, start, n + rows)
                continue
        runs.append((group, group.offsets[0] if len(group.parts) == 1 and group.offsets else -1, rows))
    return [
        (first, first.table if start < 0 or n == _rows(first) else first.parts[0].slice(start, n))
        for first, start, n in runs
    ]


def _rows(group: Stored) -> int:
    """The group's samples, without slicing a batch member's view only to count them."""
    return group.rows if group.view is None else group.view.num_rows


def _projected(run: tuple[Stored, pa.Table], columns: Sequence[str] | None) -> pa.Table:
    group, table = run
    if columns is None:
        return table
    names = table.schema.names
    missing = [c for c in columns if c not in names]
    if missing:
        raise SchemaError(
            f"group {_fmt(group.key)} has no column {echo(missing[0])}; stored columns: "
            f"{echo(', '.join(names))}",
            column=missing[0],
        )
    return table.select(list(columns))


_fmt = fmt_key
_kd = key_fields
