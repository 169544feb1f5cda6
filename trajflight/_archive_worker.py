"""The archive on its own thread: the controller's sweeper hands deletes over and goes back to expiring
leases and raising fences while files are read, written and deleted.

:class:`ArchiveWorker` is the host's batch deleter (``LocalController(batch_deleter=...)``) in front of
an :class:`~trajflight._archive.Archive`: each sweeper pass queues that pass's deletes and collects the
outcomes the worker finished since the last pass. Every guarantee is the archive's own (a group is
deleted only once its file is durable; never archived twice): the worker only changes which thread
calls it, one call at a time.

What it does not guarantee: that outcomes are reported in the pass that finished them (the next pass
collects them; the sweeper calls the worker every pass while anything is queued, held or finished), or
that :meth:`ArchiveWorker.close` interrupts a file being written (it waits ``timeout`` for it, then
leaves the daemon thread to finish; the groups stay on the GC list either way).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from trajflight._archive import Archive
from trajflight.controller import DeleteOutcome, DeleteWork

__all__ = ["ArchiveWorker"]

log = logging.getLogger("trajflight.archive")

POLL = 0.05
"""How often the worker looks at its archive's flush timer while groups are held (seconds)."""


class ArchiveWorker:
    """Runs ``archive`` on a daemon thread of its own, as the controller host's batch deleter.

    Args:
        archive: The archive it runs (the worker owns its calls from now on; read :meth:`status`
            through the worker or the archive alike).
    """

    def __init__(self, archive: Archive) -> None:
        self.archive = archive
        self._queue: list[DeleteWork] = []
        self._queued_at: float | None = None  # the archive's clock when the oldest queued delete came
        self._outcomes: list[DeleteOutcome] = []
        self._working = 0  # groups inside the archive's current call (held ones included)
        self._cond = threading.Condition(threading.Lock())
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="trajflight-archive-worker", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Deletes queued, held or being archived, and outcomes not collected yet (the host calls again
        while this is above zero)."""
        with self._cond:
            return len(self._queue) + len(self._outcomes) + max(self._working, self.archive.pending)

    def __call__(self, work: list[DeleteWork]) -> list[DeleteOutcome]:
        """Queue ``work`` for the worker; return the outcomes it finished since the last call (never
        raises, never waits for a file)."""
        with self._cond:
            if work:
                if not self._queue:
                    self._queued_at = self.archive.clock()
                self._queue.extend(work)
                self._cond.notify()
            out, self._outcomes = self._outcomes, []
        return out

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._queue and not self.archive.pending:
                    self._cond.wait()
                if self._stop:
                    return
                if not self._queue:  # groups held for their file: wait for more, or for the timer
                    self._cond.wait(POLL)
                work, self._queue = self._queue, []
                since, self._queued_at = self._queued_at, None
                self._working = self.archive.pending + len(work)
            try:
                out = self.archive(work, since=since)
            except Exception:  # it never raises; if it does, its work is handed out again after the timeout
                log.exception("the archive failed a pass; its deletes are handed out again after the timeout")
                out = []
            with self._cond:
                self._outcomes.extend(out)
                self._working = 0

    def status(self) -> dict[str, Any]:
        """The archive's :meth:`~trajflight._archive.Archive.status`, with ``pending`` counting the
        worker's queue too."""
        out = self.archive.status()
        out["pending"] = self.pending
        return out

    def close(self, timeout: float = 10.0) -> None:
        """Stop the worker (waiting up to ``timeout`` for a file being written), then close the archive;
        what was queued or held stays on the GC list and is handed out again."""
        with self._cond:
            self._stop = True
            self._queue, self._queued_at = [], None
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the archive worker did not stop in %.3gs; its groups stay on the GC list", timeout)
        self.archive.close()
