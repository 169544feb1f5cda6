"""The fence list: groups whose storage server must learn a new generation before an old holder is shut out.

Storage servers fence reads, appends and deletes by generation only: a server refuses a token older than
the highest generation it has seen for the group. When a lease ends *with* its holder (commit, release)
nothing is left to fence. When it ends *without* its holder (expiry, a newer epoch, a controller
restart), the ledger gives the lease's groups a fresh generation from its token counter and puts each on
this list; the host raises that generation on the group's server (``advance_generation``, which also
updates the shared-memory fence board), and from then on the old token is refused everywhere, even from
a zombie that never noticed its lease was gone.

Like the GC list: the host takes due work, runs it outside the ledger and reports each outcome; a failure
is retried with exponential back-off, a hand-out never reported is handed out again after a timeout,
and the list is carried in snapshots. One entry per group: a later fence of the same group raises its
generation and makes it due at once.

It does not guarantee when the servers learn the generation: between the lease's end and the fence, the
old holder's calls still reach the data. This module keeps no clock; every call gets ``now``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ._records import FenceWork, Partition

__all__ = ["RETRY_INITIAL", "RETRY_MAX", "TAKE_TIMEOUT", "FenceList", "run_fences"]

RETRY_INITIAL = 0.5
"""Back-off after the first failed fence (seconds); doubles per failure."""
RETRY_MAX = 30.0
"""Largest back-off between fence attempts (seconds)."""
TAKE_TIMEOUT = 30.0
"""Seconds after which a fence handed out and never reported is handed out again."""


class _Entry:
    __slots__ = ("attempts", "due", "generation", "key", "last_error", "location", "server_id")

    def __init__(self, key: Partition, server_id: str, location: str, generation: int, due: float) -> None:
        self.key = key
        self.server_id = server_id
        self.location = location
        self.generation = generation
        self.due = due
        self.attempts = 0
        self.last_error: str | None = None

    def work(self) -> FenceWork:
        return FenceWork(
            self.key, self.server_id, self.location, self.generation, self.attempts, self.last_error
        )


class FenceList:
    """Pending fences with back-off, ordered by when they are next due."""

    __slots__ = ("_entries", "_heap", "_seq")

    def __init__(self) -> None:
        self._entries: dict[Partition, _Entry] = {}
        self._heap: list[tuple[float, int, Partition]] = []
        self._seq = 0

    def _schedule(self, entry: _Entry, due: float) -> None:
        entry.due = due
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, entry.key))

    def add(self, key: Partition, server_id: str, location: str, generation: int, now: float) -> None:
        """Fence ``key`` at ``generation`` on its server, due at once (a pending entry is raised to it)."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(key, server_id, location, generation, now)
        else:
            entry.generation = max(entry.generation, generation)
            entry.server_id, entry.location = server_id, location
        self._schedule(entry, now)

    def take(self, now: float, limit: int) -> list[FenceWork]:
        """Hand out up to ``limit`` due fences; each is handed out again after :data:`TAKE_TIMEOUT` unless
        reported."""
        out: list[FenceWork] = []
        heap = self._heap
        while heap and len(out) < limit and heap[0][0] <= now:
            due, _, key = heapq.heappop(heap)
            entry = self._entries.get(key)
            if entry is None or entry.due != due:
                continue  # stale heap entry: confirmed, or rescheduled since
            entry.attempts += 1
            self._schedule(entry, now + TAKE_TIMEOUT)
            out.append(entry.work())
        return out

    def done(self, key: Partition, generation: int, ok: bool, now: float, error: str | None = None) -> bool:
        """Record the outcome of a fence at ``generation``; True when it confirmed the pending entry.

        A report for an older generation than the one now pending (the group was fenced again since) or
        for a key not on the list is ignored and returns False; a failure reschedules with back-off.
        """
        entry = self._entries.get(key)
        if entry is None or generation < entry.generation:
            return False
        if ok:
            del self._entries[key]
            return True
        entry.last_error = error or "fence failed"
        self._schedule(entry, now + min(RETRY_MAX, RETRY_INITIAL * 2 ** max(0, entry.attempts - 1)))
        return False

    def discard(self, key: Partition) -> None:
        """Forget ``key`` (its group is gone: nothing left to fence)."""
        self._entries.pop(key, None)

    def next_due(self) -> float | None:
        """When the earliest fence is next due, or None when the list is empty."""
        while self._heap:
            due, _, key = self._heap[0]
            entry = self._entries.get(key)
            if entry is not None and entry.due == due:
                return due
            heapq.heappop(self._heap)
        return None

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[FenceWork]:
        return iter([entry.work() for entry in self._entries.values()])

    def export(self) -> list[list[Any]]:
        """The list as JSON-able rows, for snapshots."""
        return [
            [[e.key.job_id, e.key.epoch, e.key.group_id], e.server_id, e.location, e.generation, e.attempts,
             e.last_error]
            for e in self._entries.values()
        ]  # fmt: skip

    def load(self, rows: Sequence[Sequence[Any]], now: float) -> None:
        """Put back the rows of :meth:`export` (every one due at ``now``: none is in flight after a restart).

        Raises:
            TypeError, ValueError, KeyError: a malformed row (the caller reports a corrupt snapshot).
        """
        parsed = []
        for key, server_id, location, generation, attempts, last_error in rows:
            entry = _Entry(Partition(str(key[0]), int(key[1]), int(key[2])), str(server_id), str(location),
                           int(generation), now)  # fmt: skip
            entry.attempts = int(attempts)
            entry.last_error = None if last_error is None else str(last_error)
            parsed.append(entry)
        for entry in parsed:
            self._entries[entry.key] = entry
            self._schedule(entry, now)


def run_fences(
    work: Sequence[FenceWork], fencer: Callable[[Sequence[FenceWork]], None] | None
) -> list[tuple[FenceWork, bool, str | None]]:
    """Run the fences with ``fencer``, one call per server location (no fencer: every fence succeeds).

    Never raises: a fencer signals failure by raising, and every fence of that call is reported failed
    (it is retried later). A server that no longer has the group must not raise.
    """
    by_location: dict[str, list[FenceWork]] = {}
    for item in work:
        by_location.setdefault(item.location, []).append(item)
    out: list[tuple[FenceWork, bool, str | None]] = []
    for items in by_location.values():
        error: str | None = None
        if fencer is not None:
            try:
                fencer(items)
            except Exception as exc:  # any failure keeps the fences on the list; they are retried later
                error = f"{type(exc).__name__}: {exc}"[:500]
        out.extend((item, error is None, error) for item in items)
    return out
