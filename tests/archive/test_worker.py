"""The archive on its own thread: the sweeper queues deletes and collects finished outcomes later,
never waiting for a file; the archive's guarantees are its own (tests/archive/test_no_loss.py)."""

from __future__ import annotations

import threading
import time

from trajflight._archive import Archive
from trajflight._archive_worker import ArchiveWorker

from .test_batches import Clock, FakeServers, _files, _work


def _collect(worker: ArchiveWorker, want: int, timeout: float = 30.0) -> list:
    """Call the worker as the sweeper does, pass after pass, until ``want`` outcomes came back."""
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < want:
        assert time.monotonic() < deadline, f"only {len(out)} of {want} outcomes within {timeout}s"
        out.extend(worker([]))
        time.sleep(0.01)
    return out


def test_outcomes_come_back_on_later_passes_and_pending_covers_every_stage(tmp_path):
    servers = FakeServers()
    gate = threading.Event()
    read = servers.read

    def slow_read(location, keys):
        gate.wait(30.0)
        return read(location, keys)

    archive = Archive(
        tmp_path, read=slow_read, delete_groups=servers.delete_groups, max_groups=4, clock=Clock()
    )
    worker = ArchiveWorker(archive)
    try:
        assert worker([_work(g) for g in range(4)]) == []  # queued: the sweeper does not wait
        assert worker.pending == 4  # queued or inside the archive's call: the sweeper keeps calling
        gate.set()
        out = _collect(worker, 4)
        assert sorted(w.partition.group_id for w, ok, _ in out if ok) == [0, 1, 2, 3]
        assert worker.pending == 0
        assert len(_files(tmp_path)) == 1
        assert worker.status()["groups"] == 4
    finally:
        worker.close()


def test_close_leaves_queued_deletes_unreported(tmp_path):
    """Closing drops the queue: those groups stay on the GC list (handed out again after its timeout)."""
    servers = FakeServers()
    archive = Archive(
        tmp_path, read=servers.read, delete_groups=servers.delete_groups, flush_after=3600.0, clock=Clock()
    )
    worker = ArchiveWorker(archive)
    worker([_work(0), _work(1)])
    worker.close()
    assert (servers.deleted, _files(tmp_path)) == ([], [])
