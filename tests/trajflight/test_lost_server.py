"""Losing one storage server must not starve the healthy groups (issue 14, item 7), on a real LocalCluster:
a killed server's groups wait out a back-off and are reported lost once a server answers that it lacks
them; a stopped server's groups are trained after it resumes; nothing is trained twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import pytest

import trajflight

from .conftest import put_groups

CONFIG = {"server_retry_initial": "200ms", "server_retry_max": "1s", "default_lease_ttl": "30s"}


@pytest.fixture
def cluster() -> Iterator[trajflight.LocalCluster]:
    """A cluster of its own: these tests kill and stop its servers."""
    with trajflight.LocalCluster(servers=2, capacity="64MiB", timeout=20.0) as c:
        yield c


def _train(batch: trajflight.LeasedBatch) -> list[str]:
    with batch:
        return batch.fetch_table(["sample_id"]).column("sample_id").to_pylist()


def _start_server_at(cluster: trajflight.LocalCluster, index: int) -> subprocess.Popen[str]:
    """A fresh, empty storage server at the location (and arena) of server ``index``: what a supervisor
    restarting a crashed server gives (its groups lived in the memory of the dead process)."""
    location = cluster.server_locations[index]
    cmd = [sys.executable, "-m", "trajflight", "server", "--host", "127.0.0.1",
           "--port", location.rsplit(":", 1)[1], "--capacity", str(cluster.capacity), "--exit-with-parent",
           "--shm-dir", str(cluster.server_shm_dir(index))]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == location
    return proc


def test_a_killed_server_does_not_starve_the_healthy_groups_and_its_groups_are_reported_lost(cluster):
    """Regression: ``try_lease`` raised from its fence step (NotFoundError, or UnavailableError for a dead
    server) without releasing the lease, so the healthy groups leased with the lost ones waited for the
    TTL (0 of 4 healthy groups trained in 10 s) and the lost ones stayed READY forever."""
    client = cluster.client()
    job = "killed"
    client.open_job(job, 1, CONFIG)
    metas = put_groups(client.writer(job, 1), 8)
    dead = cluster.server_locations[1]
    on_dead = {m.partition for m in metas if m.location == dead}
    assert 0 < len(on_dead) < 8  # least-loaded placement uses both servers
    cluster.kill_server(1)
    trainer = client.trainer(job, fence_timeout=2.0)
    batch = trainer.try_lease(8, wait=5)
    assert batch is not None
    assert {g.partition for g in batch.handle.groups} == {m.partition for m in metas} - on_dead
    trained = _train(batch)
    # The dead server's groups are READY, waiting for it: not offered (each attempt backs it off more).
    assert trainer.try_lease(8, wait=1.0) is None
    assert client.controller.counts(job)["READY"] == len(on_dead)
    assert client.lost(job) == ()

    replacement = _start_server_at(cluster, 1)  # up again, empty
    try:
        assert trainer.try_lease(8, wait=5.0) is None  # every group found missing: none to train
        lost = client.lost(job)
        assert {x.partition for x in lost} == on_dead
        server_id = next(m.server_id for m in metas if m.location == dead)
        assert {x.reason for x in lost} == {f"missing on server {server_id}"}
        counts = client.controller.counts(job)
        assert (counts["lost"], counts["READY"]) == (len(on_dead), 0)
        assert counts["committed_total"] == 8 - len(on_dead)
        assert cluster.wait_idle(job, timeout=20.0) == (0, 0)  # the lost groups' capacity came back
    finally:
        replacement.kill()
        replacement.wait()
        if replacement.stdout is not None:
            replacement.stdout.close()
    assert len(trained) == len(set(trained)) == 4 * (8 - len(on_dead))


def test_a_stopped_server_does_not_starve_the_healthy_groups_and_is_used_again_when_it_resumes(cluster):
    """SIGSTOP one of two servers: the healthy groups are trained at once, the stopped server's groups go
    back to READY (the fence step gives up after ``fence_timeout``, not the client's 30 s) and are trained
    after SIGCONT; every sample is trained once."""
    client = cluster.client()
    job = "stopped"
    client.open_job(job, 1, CONFIG)
    metas = put_groups(client.writer(job, 1), 8)
    stopped = cluster.server_locations[1]
    on_stopped = {m.partition for m in metas if m.location == stopped}
    pid = cluster._procs[1].pid
    trainer = client.trainer(job, fence_timeout=1.0)
    os.kill(pid, signal.SIGSTOP)
    try:
        batch = trainer.try_lease(8, wait=5)
        assert batch is not None
        assert {g.partition for g in batch.handle.groups} == {m.partition for m in metas} - on_stopped
        trained = _train(batch)
        assert trainer.try_lease(8, wait=0.5) is None  # its groups wait for it
        assert client.controller.counts(job)["READY"] == len(on_stopped) > 0
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while len(trained) < 32 and time.monotonic() < deadline:
        batch = trainer.try_lease(8, wait=5)
        if batch is not None:
            trained += _train(batch)
    assert len(trained) == 32
    assert Counter(trained).most_common(1)[0][1] == 1  # nothing trained twice
    assert client.lost(job) == ()
    assert cluster.wait_idle(job, timeout=20.0) == (0, 0)
