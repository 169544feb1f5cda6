"""The group table: every group the ledger knows, its state, and the bookkeeping each state change needs.

A group's job record counts it per state, indexes it while READY (:mod:`._index`) and lists it for
deletion once it is done (:mod:`._gc`); its server and its job are charged its bytes from the grant until
its delete is confirmed. :class:`Groups` keeps those in step: every change of a group's state goes
through it. It also answers for an operator's ``resolve`` of UNKNOWN groups.

``ready_version`` grows whenever a group becomes READY (or a hold on acquirers may have lifted): hosts
wake long-polling acquirers on a change. ``capacity_version`` grows whenever capacity comes back (a delete
confirmed, a reservation given back, or capacity added): hosts wake writers waiting for capacity.

It does not decide *when* a group changes state; the ledger's other collaborators do, and pass ``now``
where a change schedules work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trajflight.errors import InvalidRequestError, InvalidStateError, NotFoundError, brief

from ._entries import DROPPED, READY, UNKNOWN, _Group, _Job, check_partition, check_partitions, check_state
from ._index import ReadyIndex
from ._jobs import Jobs
from ._reach import Parked
from ._records import GroupInfo, GroupState, JobConfig, Partition, ResolveAction
from ._servers import Servers

__all__ = ["Groups"]


class Groups:
    """The groups of every job, by partition.

    Args:
        jobs: The jobs the groups belong to (their counts, READY indexes and GC lists are kept here).
        servers: The servers they are placed on (charged and refunded here).
    """

    __slots__ = ("_columns", "_jobs", "_servers", "capacity_version", "ready_version", "table")

    def __init__(self, jobs: Jobs, servers: Servers) -> None:
        self.table: dict[Partition, _Group] = {}
        """Every group by partition: read it freely; change a group only through the methods below."""
        self._jobs = jobs
        self._servers = servers
        self._columns: dict[frozenset[str], tuple[str, ...]] = {}
        self.ready_version = 0
        """Incremented whenever a group becomes READY: hosts wake long-polling acquirers on a change."""
        self.capacity_version = 0
        """Incremented whenever capacity may have come back: hosts wake writers waiting for capacity."""

    def new_job(self, job_id: str, epoch: int, cfg: JobConfig) -> _Job:
        """A job record whose READY index knows which of its entries still stand for READY groups."""
        table = self.table

        def is_ready(key: Partition, seq: int) -> bool:
            g = table.get(key)
            return g is not None and g.state is READY and g.ready_seq == seq

        return _Job(job_id, epoch, cfg, ReadyIndex(is_ready))

    def changed(self) -> None:
        """Tell hosts that acquirers should look again (a hold may have lifted)."""
        self.ready_version += 1

    def capacity_changed(self) -> None:
        """Tell hosts that writers refused for capacity should ask again (capacity was added or freed)."""
        self.capacity_version += 1

    # ------------------------------------------------------------------ the table
    def add(self, job: _Job, g: _Group) -> None:
        """Put ``g`` (of ``job``) in the table: counted in its state, its bytes charged to its server and
        its job."""
        self.table[g.key] = g
        job.groups[g.key] = None
        job.counts[g.state] += 1
        server = self._servers.by_id[g.server_id]
        server.used_bytes += g.nbytes
        server.used_groups += 1
        job.used_bytes += g.nbytes
        job.used_groups += 1

    def forget(self, job: _Job, key: Partition) -> _Group:
        """Remove a group whose delete was confirmed: uncounted, its bytes refunded; returns it."""
        g = self.table.pop(key)
        del job.groups[key]
        job.counts[g.state] -= 1
        job.deleted += 1
        server = self._servers.by_id[g.server_id]
        server.used_bytes -= g.nbytes
        server.used_groups -= 1
        job.used_bytes -= g.nbytes
        job.used_groups -= 1
        self.capacity_version += 1
        return g

    def give_back(self, job: _Job, g: _Group, nbytes: int) -> None:
        """Refund ``nbytes`` of ``g``'s reservation (a publication smaller than its grant)."""
        self._servers.by_id[g.server_id].used_bytes -= nbytes
        job.used_bytes -= nbytes
        if nbytes:
            self.capacity_version += 1

    # ------------------------------------------------------------------ state changes
    def set_state(self, g: _Group, state: GroupState) -> None:
        """Move ``g`` to ``state``, keeping its job's counts."""
        counts = self._jobs[g.key.job_id].counts
        counts[g.state] -= 1
        counts[state] += 1
        g.state = state

    def make_ready(self, g: _Group, *, front: bool) -> None:
        """Make ``g`` READY (out of any lease and batch) and index it: at the front when it comes back
        (expiry, release, requeue), at the back when it is new."""
        self.set_state(g, READY)
        g.lease = None
        g.batch_id = None
        g.ready_seq = self._jobs[g.key.job_id].ready.push(g.key, g.policy_version, g.colset, front=front)
        self.ready_version += 1

    def index_ready(self, job: _Job, g: _Group) -> None:
        """Index the READY group ``g`` at the back of its job's READY index (an install or restore)."""
        g.ready_seq = job.ready.push(g.key, g.policy_version, g.colset)

    def unpark(self, parked: Parked) -> None:
        """Put groups parked on a server that is reachable again back at the front of the READY index,
        in the order they were parked (entries of groups that left READY meanwhile are skipped)."""
        moved = False
        for key, seq in reversed(parked):
            g = self.table.get(key)
            if g is not None and g.state is READY and g.ready_seq == seq:
                g.ready_seq = self._jobs[key.job_id].ready.push(key, g.policy_version, g.colset, front=True)
                moved = True
        if moved:
            self.ready_version += 1

    def to_gc(self, g: _Group, state: GroupState, now: float) -> None:
        """Move ``g`` to ``state`` (DROPPED, or COMMITTED) out of its lease, and list it for deletion."""
        self.set_state(g, state)
        g.lease = None
        self._jobs[g.key.job_id].gc.add(g.key, now)

    def columns(self, colset: frozenset[str]) -> tuple[str, ...]:
        """``colset`` sorted, one tuple per distinct set (groups of a job share theirs)."""
        cols = self._columns.get(colset)
        if cols is None:
            cols = self._columns[colset] = tuple(sorted(colset))
        return cols

    def resolve(
        self, job_id: str, partitions: Sequence[Partition], action: ResolveAction | str, now: float
    ) -> tuple[Partition, ...]:
        """See :meth:`~._ledger.Ledger.resolve`."""
        self._jobs.job(job_id)
        try:
            act = ResolveAction(action)
        except (ValueError, TypeError):
            raise InvalidRequestError(f"action must be 'requeue' or 'drop', got {brief(action)}") from None
        keys = check_partitions(partitions)
        todo = []
        for key in keys:
            g = self.table.get(key)
            if g is None or key.job_id != job_id:
                raise NotFoundError(f"group {tuple(key)} is not a live group of job {job_id!r}")
            if g.state is UNKNOWN:
                todo.append(g)
            elif not (act is ResolveAction.DROP and g.state is DROPPED):
                raise InvalidStateError(
                    f"group {tuple(key)} is {g.state.value}; only UNKNOWN groups are resolved"
                )
        for g in todo:
            if act is ResolveAction.REQUEUE:
                self.make_ready(g, front=True)
            else:
                self.to_gc(g, DROPPED, now)
        return keys

    # ------------------------------------------------------------------ queries
    def info(self, g: _Group) -> GroupInfo:
        """A frozen copy of ``g`` for callers."""
        return GroupInfo(
            g.key,
            g.state,
            g.server_id,
            self._servers.by_id[g.server_id].location,
            g.generation,
            g.rows,
            g.nbytes,
            g.tokens,
            g.policy_version,
            g.columns,
            g.batch_id,
        )

    def group(self, partition: Partition | Sequence[Any]) -> GroupInfo:
        """See :meth:`~._ledger.Ledger.group`."""
        g = self.table.get(check_partition(partition))
        if g is None:
            raise NotFoundError(f"no group {tuple(partition)} (never allocated, or already deleted)")
        return self.info(g)

    def groups_in(self, job_id: str, state: GroupState | str) -> tuple[GroupInfo, ...]:
        """See :meth:`~._ledger.Ledger.groups_in`."""
        job = self._jobs.job(job_id)
        st = check_state(state)
        return tuple(self.info(g) for k in job.groups if (g := self.table[k]).state is st)
