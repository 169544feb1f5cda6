"""Scenarios: the controller killed (SIGKILL) and started again on its journal at the steps of lease,
training, put, commit and delete, and stopped (SIGSTOP/SIGCONT) as if cut off by a partition (slow: it
waits out the partition and the leases it expired)."""

from __future__ import annotations

import time

import pytest
from fault_audit import Scenario

pytestmark = pytest.mark.timeout(150)


def test_controller_killed_with_live_leases_recovers_from_its_journal(plane, job):
    """The controller killed while one trainer holds a LEASED batch and another one in TRAINING, and
    restarted on its journal: both leases end (LEASED groups back to READY, TRAINING ones UNKNOWN for the
    operator), both woken trainers are refused, and a new trainer trains every group once."""
    sc = Scenario(plane, job, {"default_lease_ttl": "10s"})
    sc.open()
    sc.local_writer("w0").put(8)
    a = sc.trainer("a", max_groups=3, pause_at="leased")
    b = sc.trainer("b", max_groups=3, pause_at="training")
    c = sc.trainer("c", held=True)
    tokens = {}
    for proc, step in ((a, "leased"), (b, "training")):
        tokens[proc.name] = proc.wait_event("paused", step=step)["token"]
        proc.stopped = True
    plane.kill_controller()
    plane.restart_controller()
    for proc in (a, b):
        proc.cont()
    for proc in (a, b):
        sc.expect_event("zombie", proc, "refused", 20, token=tokens[proc.name])
    sc.release(c)
    sc.settle()
    sc.verify()


def test_controller_killed_between_store_and_publish(plane, job):
    """The controller killed while a writer holds a grant whose group is stored but not published, and
    restarted on its journal: the writer's publish either succeeds (the grant survived) or is refused and
    the stored group is collected; nothing is lost or left."""
    sc = Scenario(plane, job, {"grant_ttl": "20s"})
    sc.open()
    w = sc.writer("w0", groups=3, pause_at="stored@2")
    t0 = sc.trainer("t0", held=True)
    w.wait_event("paused", step="stored")
    w.stopped = True
    plane.kill_controller()
    plane.restart_controller()
    w.cont()
    sc.release(t0)
    sc.settle()
    sc.verify()


@pytest.mark.slow
def test_controller_stopped_as_if_partitioned(plane, job):
    """The controller stopped for 4 s (twice the lease TTL) under writers and a trainer: their calls time
    out with typed errors; when it answers again expired leases are reclaimed (TRAINING ones UNKNOWN,
    requeued by the operator) and the run completes."""
    sc = Scenario(plane, job)
    sc.open()
    w = sc.writer("w0", groups=10, put_timeout=3, timeout=3, sleep=0.1)
    sc.trainer("t0", timeout=3)
    w.wait_event("acked")
    plane.controller.stop()
    time.sleep(4.0)  # the partition's duration, not an assertion
    plane.controller.cont()
    sc.settle(timeout=40)
    sc.verify()


def test_controller_killed_during_a_commit(plane, job):
    """A trainer's commit in flight to a hung controller, which is then killed and restarted on its
    journal: the commit never ran, the trainer gets a typed error, its groups come back UNKNOWN and are
    trained once by another trainer."""
    sc = Scenario(plane, job, {"default_lease_ttl": "10s"})
    sc.open()
    sc.local_writer("w0").put(3)
    victim = sc.trainer("victim", max_groups=3, pause_at="trained")
    survivor = sc.trainer("survivor", held=True)
    token = victim.wait_event("paused", step="trained")["token"]
    victim.stopped = True
    plane.controller.stop()
    victim.cont()
    victim.wait_event("committing", token=token)
    time.sleep(0.5)  # the call is on the wire
    plane.kill_controller()
    sc.expect_event("hang", victim, "refused", 20, token=token)
    plane.restart_controller()
    sc.release(survivor)
    sc.settle()
    sc.verify()


def test_controller_killed_while_deletes_are_pending(plane, job):
    """Commits whose deletes wait on a hung storage server, then the controller killed and restarted on
    its journal: the GC list survives, the deletes run once the server answers, capacity comes back."""
    sc = Scenario(plane, job, {"default_lease_ttl": "20s"})
    sc.open()
    sc.local_writer("w0").put(6)
    victim = sc.trainer("t0", max_groups=6, pause_at="trained")
    token = victim.wait_event("paused", step="trained")["token"]
    victim.stopped = True
    server = plane.servers[1].proc
    server.stop()
    victim.cont()
    sc.expect_event("hang", victim, "committed", 20, token=token)
    sc.expect("hang", "deletes pending", lambda: sc.client.controller.gc_list(job), 10)
    plane.kill_controller()
    plane.restart_controller()
    server.cont()
    sc.settle()
    sc.verify()
