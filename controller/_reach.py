"""Storage servers that callers could not reach, in back-off, and the READY groups parked on them.

When a trainer reports that a storage server did not answer (dead or stopped), the server goes into
back-off: ``acquire`` leases none of its groups until the back-off ends, so that not every acquirer pays
a deadline for the same dead server. Its READY groups are *parked* lazily: an acquire that meets one at
the head of the READY index takes it out of the index and parks it here; when the back-off ends (or the
server is reached again: re-registration, a confirmed delete on it), the parked groups go back to the
front of the index, oldest first. Each report while the server is not in back-off doubles the next
back-off, up to a maximum; reaching the server resets it.

This module keeps no clock and knows no group states: the ledger passes ``now`` and checks, when it
unparks, that a parked entry still stands for a READY group (``seq`` is its READY-index sequence
number).
"""

from __future__ import annotations

import heapq
from typing import Any

from ._records import Partition

__all__ = ["Parked", "Reachability"]

Parked = list[tuple[Partition, int]]
"""Parked groups of one server: ``(partition, ready_seq)`` in the order they were parked."""


class _Backoff:
    __slots__ = ("failures", "parked", "until")

    def __init__(self) -> None:
        self.failures = 0
        self.until: float | None = None  # in back-off until then; None: reachable
        self.parked: Parked = []


class Reachability:
    """Per storage server: back-off after unanswered calls, and the groups parked meanwhile."""

    __slots__ = ("_heap", "_state", "parks")

    def __init__(self) -> None:
        self._state: dict[str, _Backoff] = {}
        self._heap: list[tuple[float, str]] = []
        self.parks = 0
        """Groups parked so far (hosts journal an empty acquire that parked some: it changed state)."""

    def __bool__(self) -> bool:
        """Whether some server is in back-off (the fast path of ``acquire`` skips all checks)."""
        return self.next_due() is not None

    def unreachable(self, server_id: str) -> bool:
        """Whether ``server_id`` is in back-off now."""
        state = self._state.get(server_id)
        return state is not None and state.until is not None

    def until(self, server_id: str) -> float | None:
        """When the back-off of ``server_id`` ends (``None``: it is not in back-off)."""
        state = self._state.get(server_id)
        return None if state is None else state.until

    def mark(self, server_id: str, now: float, initial: float, maximum: float) -> float:
        """A caller could not reach ``server_id`` at ``now``: start its back-off (a report during the
        back-off changes nothing). Returns when the back-off ends."""
        state = self._state.setdefault(server_id, _Backoff())
        if state.until is None:
            state.failures += 1
            state.until = now + min(maximum, initial * 2 ** min(state.failures - 1, 32))
            heapq.heappush(self._heap, (state.until, server_id))
        return state.until

    def park(self, server_id: str, key: Partition, seq: int) -> None:
        """Keep the READY group ``key`` (taken out of the index at ``seq``) until the back-off ends."""
        self._state[server_id].parked.append((key, seq))
        self.parks += 1

    def reached(self, server_id: str) -> Parked:
        """``server_id`` answered: end its back-off, forget its failures; returns its parked groups."""
        state = self._state.pop(server_id, None)
        if state is None:
            return []
        return state.parked  # its heap entry goes stale: skipped by next_due

    def next_due(self) -> float | None:
        """When the earliest back-off ends (``None``: no server is in back-off)."""
        heap = self._heap
        while heap:
            due, server_id = heap[0]
            state = self._state.get(server_id)
            if state is not None and state.until == due:
                return due
            heapq.heappop(heap)
        return None

    def expire_next(self) -> Parked:
        """End the earliest back-off (the caller checked :meth:`next_due`); returns its parked groups.

        The server's failures are kept, so that the next report backs off longer, until it is reached.
        """
        _, server_id = heapq.heappop(self._heap)
        state = self._state[server_id]
        state.until = None
        parked, state.parked = state.parked, []
        return parked

    def parked_keys(self) -> set[Partition]:
        """Every parked partition (for snapshots)."""
        return {key for state in self._state.values() for key, _ in state.parked}

    # ------------------------------------------------------------------ snapshots
    def export(self) -> list[list[Any]]:
        """The state as JSON-able rows ``[server_id, failures, until, [[partition, seq], ...]]``."""
        return [
            [server_id, s.failures, s.until, [[list(k), seq] for k, seq in s.parked]]
            for server_id, s in self._state.items()
        ]

    def load(self, rows: list[list[Any]]) -> None:
        """Replace the state with exported ``rows``."""
        self._state.clear()
        self._heap.clear()
        for server_id, failures, until, parked in rows:
            state = self._state[str(server_id)] = _Backoff()
            state.failures = int(failures)
            state.until = None if until is None else float(until)
            state.parked = [(Partition(*key), int(seq)) for key, seq in parked]
            if state.until is not None:
                self._heap.append((state.until, str(server_id)))
        heapq.heapify(self._heap)
