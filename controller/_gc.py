"""The GC list: groups whose data must be deleted from their storage server before capacity comes back.

The ledger adds a group when it is committed, dropped or abandoned; the host takes due work items, runs
them against the storage servers and reports each outcome. A failed delete stays on the list and is
handed out again after an exponential back-off; a delete handed out and never reported is handed out
again after a timeout. An entry leaves the list only on a confirmed delete. Nothing on the list is ever
offered for training again.

This module keeps no clock; every call gets ``now``.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

__all__ = ["GcEntry", "GcList"]

K = TypeVar("K", bound=Hashable)


class GcEntry(Generic[K]):
    """One pending delete (mutable, owned by the :class:`GcList`)."""

    __slots__ = ("attempts", "due", "in_flight", "key", "last_error")

    def __init__(self, key: K, due: float) -> None:
        self.key = key
        self.attempts = 0
        self.due = due
        self.in_flight = False
        self.last_error: str | None = None


class GcList(Generic[K]):
    """Pending deletes with back-off, ordered by when they are next due.

    Args:
        retry_initial: Back-off after the first failure (seconds); doubles per failure.
        retry_max: Largest back-off.
        timeout: Seconds after which an unreported hand-out is handed out again.
    """

    __slots__ = ("_entries", "_heap", "_seq", "retry_initial", "retry_max", "timeout")

    def __init__(self, retry_initial: float = 0.5, retry_max: float = 30.0, timeout: float = 30.0) -> None:
        self._entries: dict[K, GcEntry[K]] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._seq = 0
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.timeout = timeout

    def _schedule(self, entry: GcEntry[K], due: float) -> None:
        entry.due = due
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, entry.key))

    def add(self, key: K, now: float) -> None:
        """Put ``key`` on the list, due at once (no-op when it is already there)."""
        if key in self._entries:
            return
        entry = GcEntry(key, now)
        self._entries[key] = entry
        self._schedule(entry, now)

    def restore(self, key: K, attempts: int, last_error: str | None, due: float) -> None:
        """Put back an entry read from a checkpoint or snapshot (never in flight after a restart)."""
        entry = GcEntry(key, due)
        entry.attempts = attempts
        entry.last_error = last_error
        self._entries[key] = entry
        self._schedule(entry, due)

    def take(self, now: float, limit: int) -> list[GcEntry[K]]:
        """Hand out up to ``limit`` due entries, marking them in flight until ``now + timeout``."""
        out: list[GcEntry[K]] = []
        heap = self._heap
        while heap and len(out) < limit and heap[0][0] <= now:
            due, _, key = heapq.heappop(heap)
            entry = self._entries.get(key)
            if entry is None or entry.due != due:
                continue  # stale heap entry: confirmed, or rescheduled since
            entry.attempts += 1
            entry.in_flight = True
            self._schedule(entry, now + self.timeout)
            out.append(entry)
        return out

    def done(self, key: K, ok: bool, now: float, error: str | None = None) -> bool:
        """Record the outcome of a delete; return True when ``key`` was confirmed deleted just now.

        A failure reschedules the entry with back-off; a report for a key not on the list is ignored
        (a late duplicate) and returns False.
        """
        entry = self._entries.get(key)
        if entry is None:
            return False
        if ok:
            del self._entries[key]
            return True
        entry.in_flight = False
        entry.last_error = error or "delete failed"
        backoff = min(self.retry_max, self.retry_initial * 2 ** max(0, entry.attempts - 1))
        self._schedule(entry, now + backoff)
        return False

    def next_due(self) -> float | None:
        """When the earliest entry is next due, or None when the list is empty."""
        while self._heap:
            due, _, key = self._heap[0]
            entry = self._entries.get(key)
            if entry is not None and entry.due == due:
                return due
            heapq.heappop(self._heap)
        return None

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[GcEntry[K]]:
        return iter(list(self._entries.values()))
