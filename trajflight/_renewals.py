"""One background thread per client that runs every held lease's heartbeat when it falls due.

:class:`Renewals` knows nothing of leases: each registration is a callable and an interval. The thread
sleeps until the earliest registration is due (or a new one arrives), calls it outside its lock, and
schedules the next call unless the callable answered ``False`` (the lease is gone for good) or the
registration was removed meanwhile.

It does not guarantee punctuality: a heartbeat that blocks (a slow controller) delays the ones due after
it, which is why a lease renews at a third of its time-to-live.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable

__all__ = ["Renewals"]


class Renewals:
    """Heartbeats of one client's held leases, run by one daemon thread started on first use."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []  # (when due, registration)
        self._live: dict[int, tuple[float, Callable[[], bool]]] = {}  # registration -> (interval, beat)
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, beat: Callable[[], bool], interval: float) -> int:
        """Call ``beat`` every ``interval`` seconds until it returns ``False`` or :meth:`remove`.

        Returns:
            The registration, for :meth:`remove`.
        """
        with self._cond:
            key = next(self._ids)
            self._live[key] = (interval, beat)
            heapq.heappush(self._heap, (time.monotonic() + interval, key))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trajflight-renewals", daemon=True)
                self._thread.start()
            self._cond.notify()
        return key

    def remove(self, key: int) -> None:
        """Stop calling the registration ``key`` (idempotent; a call under way finishes)."""
        with self._cond:
            self._live.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    timeout = None if not self._heap else self._heap[0][0] - time.monotonic()
                    self._cond.wait(timeout)
                _, key = heapq.heappop(self._heap)
                found = self._live.get(key)
                if found is None:
                    continue
            interval, beat = found
            keep = beat()
            with self._cond:
                if keep and key in self._live:
                    heapq.heappush(self._heap, (time.monotonic() + interval, key))
                else:
                    self._live.pop(key, None)
