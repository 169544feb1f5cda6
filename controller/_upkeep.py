"""Work the host does on storage servers for the ledger: deletes, fences, and back-off after silence.

* **Deletes**: each job's GC list (:mod:`._gc`) holds what must be deleted before its capacity comes back;
  the host takes due deletes (``take_deletes``), runs them and reports each (``delete_done``).
* **Fences**: groups whose lease ended without its holder get a fresh generation that their server must
  learn (:mod:`._fences`; ``take_fences`` / ``fence_done``).
* **Back-off**: servers a trainer could not reach, and the READY groups parked meanwhile (:mod:`._reach`);
  a confirmed delete counts as reaching the server again.

It believes what the host reports and does not retry anything by itself: due work is handed out again
after its back-off or timeout. It reads no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ._entries import _Group, check_int, check_partition
from ._fences import FenceList
from ._gc import GcEntry
from ._groups import Groups
from ._jobs import Jobs
from ._reach import Reachability
from ._records import DeleteWork, FenceWork, GroupState, Partition
from ._servers import Servers

__all__ = ["Upkeep"]


def _with_reason(work: DeleteWork, g: _Group) -> DeleteWork:
    """``work`` saying why ``g`` is deleted, with the facts of its commit (what an archive keeps)."""
    if g.state is not GroupState.COMMITTED:
        return work
    at, owner, version = g.trained if g.trained is not None else (None, None, None)
    return dataclasses.replace(
        work, reason="committed", committed_at=at, trained_by=owner, trained_version=version
    )


class Upkeep:
    """The fence list and the servers' back-off, and the hand-out of deletes and fences.

    Args:
        jobs, servers, groups: The ledger's collaborators the work is about.
    """

    __slots__ = ("_groups", "_jobs", "_servers", "fences", "reach")

    def __init__(self, jobs: Jobs, servers: Servers, groups: Groups) -> None:
        self._jobs = jobs
        self._servers = servers
        self._groups = groups
        self.fences = FenceList()
        """Groups whose server must learn a fresh generation."""
        self.reach = Reachability()
        """Storage servers in back-off, and the READY groups parked on them."""

    def next_due(self) -> list[float]:
        """When deletes and fences next fall due (one entry per list that has work)."""
        times = []
        for due in (*(job.gc.next_due() for job in self._jobs), self.fences.next_due()):
            if due is not None:
                times.append(due)
        return times

    # ------------------------------------------------------------------ deletes
    def take_deletes(self, now: float, limit: int) -> list[DeleteWork]:
        """See :meth:`~._ledger.Ledger.take_deletes`."""
        out: list[DeleteWork] = []
        for job in self._jobs:
            out.extend(self._delete_work(entry) for entry in job.gc.take(now, limit - len(out)))
            if len(out) >= limit:
                break
        return out

    def delete_done(
        self, partition: Partition | Sequence[Any], ok: bool, now: float, error: str | None
    ) -> bool:
        """See :meth:`~._ledger.Ledger.delete_done`."""
        key = check_partition(partition)
        job = self._jobs.get(key.job_id)
        if job is None or key not in job.gc:
            return False
        if not job.gc.done(key, bool(ok), now, error):
            return False
        g = self._groups.forget(job, key)
        self._groups.unpark(self.reach.reached(g.server_id))  # the server answered
        return True

    def _delete_work(self, entry: GcEntry[Partition]) -> DeleteWork:
        """The delete an entry of a job's GC list asks for, addressed to its group's server."""
        g = self._groups.table[entry.key]
        location = self._servers.by_id[g.server_id].location
        work = DeleteWork(g.key, g.server_id, location, g.generation, entry.attempts, entry.last_error)
        return _with_reason(work, g)

    def gc_list(self, job_id: str | None) -> tuple[DeleteWork, ...]:
        """See :meth:`~._ledger.Ledger.gc_list`."""
        out: list[DeleteWork] = []
        for job in self._jobs:
            if job_id is not None and job.job_id != job_id:
                continue
            out.extend(self._delete_work(entry) for entry in job.gc)
        return tuple(out)

    # ------------------------------------------------------------------ fences
    def fence(self, g: _Group, generation: int, now: float) -> None:
        """Tell ``g``'s server, as soon as possible, that its generation is now ``generation``."""
        self.fences.add(g.key, g.server_id, self._servers.by_id[g.server_id].location, generation, now)

    def take_fences(self, now: float, limit: int) -> list[FenceWork]:
        """See :meth:`~._ledger.Ledger.take_fences`."""
        out = []
        for work in self.fences.take(now, limit):
            if work.partition in self._groups.table:
                out.append(work)
            else:
                self.fences.discard(work.partition)
        return out

    def fence_done(
        self, partition: Partition | Any, generation: int, ok: bool, now: float, error: str | None
    ) -> bool:
        """See :meth:`~._ledger.Ledger.fence_done`."""
        key = check_partition(partition)
        check_int(generation, "generation")
        return self.fences.done(key, generation, bool(ok), now, error)
