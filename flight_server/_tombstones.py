"""Tombstones: the partitions a storage server has deleted, so that a late put of one is refused.

The controller deletes a partition it gave up (a put grant that expired, a group dropped or committed).
A put of that key arriving afterwards (a writer that was slow, or whose ack was lost) must not be kept:
the controller no longer counts it, nobody would ever lease or delete it, and its bytes would stay
forever. So every key a ``delete`` names (stored, being put, or never seen) is remembered here, and
every later put of it, or one still in flight, is refused.

Group ids are handed out in increasing order within a job's epoch and never reused, so the deleted ids
of one ``(job_id, epoch)`` are kept as sorted, disjoint, half-open ranges ``[start, end)``: deleting
groups roughly in order keeps a handful of ranges however many groups went (the memory is that of the
gaps: groups still stored or deleted out of order). The tombstones of a job's epochs below its fenced
``min_epoch`` are dropped (:meth:`Tombstones.forget_below`): puts of those epochs are refused by the
fence anyway.

This module does no I/O and is not thread-safe: the group store calls it under its lock.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from trajflight.keys import Partition

__all__ = ["Tombstones"]


@dataclass(slots=True)
class _Ranges:
    """Sorted, disjoint, non-adjacent half-open ranges of group ids."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)

    def __contains__(self, group_id: int) -> bool:
        i = bisect.bisect_right(self.starts, group_id) - 1
        return i >= 0 and group_id < self.ends[i]

    def add(self, group_id: int) -> None:
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(starts, group_id) - 1  # the range starting at or before group_id
        if i >= 0 and group_id < ends[i]:
            return
        joins_left = i >= 0 and ends[i] == group_id
        joins_right = i + 1 < len(starts) and starts[i + 1] == group_id + 1
        if joins_left and joins_right:  # fills the gap between two ranges: they become one
            ends[i] = ends[i + 1]
            del starts[i + 1], ends[i + 1]
        elif joins_left:
            ends[i] = group_id + 1
        elif joins_right:
            starts[i + 1] = group_id
        else:
            starts.insert(i + 1, group_id)
            ends.insert(i + 1, group_id + 1)


class Tombstones:
    """The deleted partitions of a store, per ``(job_id, epoch)`` as ranges of group ids."""

    __slots__ = ("_by_epoch",)

    def __init__(self) -> None:
        self._by_epoch: dict[tuple[str, int], _Ranges] = {}

    def __contains__(self, key: Partition) -> bool:
        ranges = self._by_epoch.get((key.job_id, key.epoch))
        return ranges is not None and key.group_id in ranges

    def add(self, key: Partition) -> None:
        """Remember that ``key`` was deleted (idempotent)."""
        ranges = self._by_epoch.get((key.job_id, key.epoch))
        if ranges is None:
            ranges = self._by_epoch[(key.job_id, key.epoch)] = _Ranges()
        ranges.add(key.group_id)

    def forget_below(self, job_id: str, min_epoch: int) -> None:
        """Drop the tombstones of ``job_id``'s epochs below ``min_epoch`` (fenced: puts are refused)."""
        for job_epoch in [k for k in self._by_epoch if k[0] == job_id and k[1] < min_epoch]:
            del self._by_epoch[job_epoch]

    def stats(self) -> dict[str, int]:
        """``{"epochs", "ranges"}``: how many ``(job, epoch)`` entries and ranges are kept."""
        return {
            "epochs": len(self._by_epoch),
            "ranges": sum(len(r.starts) for r in self._by_epoch.values()),
        }
