"""A bounded history of every job's group counts, sampled by the host's sweeper: what a report draws as
"groups per state over time" and "throughput over time".

Each sample is plain JSON: ``{"t": <wall-clock seconds>, "jobs": {<job>: <counts>}}``, where counts are
:meth:`~._ledger.Ledger.counts` (groups per state, ``committed_total``, ``deleted``, ...) with the zero
ones left out (the host samples them so: a missing count is 0). Samples are
taken at most every ``interval`` seconds; when ``capacity`` are kept, every other one is dropped and the
interval doubles, so the history always spans the whole run in bounded memory.

What it does not guarantee: evenly spaced samples (a sweeper busy with deletes samples late), or any
history across a controller restart (it is kept in memory only; an archive writes it out, see
``trajflight._archive``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Timeline"]

Sample = dict[str, Any]


class Timeline:
    """Samples of every job's counts over time, thread-safe.

    Args:
        interval: Least seconds between two samples (it doubles each time the history is thinned).
        capacity: Most samples kept (at least 2).

    Raises:
        ValueError: an interval that is not > 0, or a capacity below 2.
    """

    def __init__(self, interval: float = 0.25, capacity: int = 512) -> None:
        if not interval > 0 or capacity < 2:
            raise ValueError(f"a timeline needs interval > 0 and capacity >= 2, got {interval}, {capacity}")
        self.interval = interval
        self.capacity = capacity
        self._samples: list[Sample] = []
        self._lock = threading.Lock()

    def due(self, now: float) -> bool:
        """Whether a sample taken at ``now`` would be kept (the last one is ``interval`` old, or none)."""
        with self._lock:
            return not self._samples or now - self._samples[-1]["t"] >= self.interval

    def sample(self, now: float, counts: Callable[[], dict[str, dict[str, int]]]) -> bool:
        """Record ``counts()`` (every job's counts) at ``now`` when a sample is due; return whether it was.

        ``counts`` is called only when a sample is due, so a caller may pass an expensive one.
        """
        if not self.due(now):
            return False
        jobs = counts()
        with self._lock:
            self._samples.append({"t": now, "jobs": jobs})
            if len(self._samples) >= self.capacity:
                self._samples = self._samples[::2]  # the first and the whole span stay
                self.interval *= 2
        return True

    def samples(self) -> list[Sample]:
        """The samples, oldest first (copies: a caller may keep or change them)."""
        with self._lock:
            return [{"t": s["t"], "jobs": {j: dict(c) for j, c in s["jobs"].items()}} for s in self._samples]
