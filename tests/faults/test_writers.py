"""Scenarios: writers killed and stopped at every step of a put (grant, store, shared-memory reserve,
publish), a put_many cut in the middle, raw Flight writers dying mid-stream, and backpressure."""

from __future__ import annotations

import time

import pytest
from fault_audit import Scenario
from faultkit import Hang, held_by, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("step", "transport"),
    [("allocated", "auto"), ("stored", "flight"), ("stored", "auto"), ("published", "auto")],
    ids=["allocated", "stored-flight", "stored-shm", "published"],
)
def test_writer_killed_at_each_step_of_a_put(shared_plane, job, step, transport):
    """SIGKILL of a writer in its second put, after the grant, after the server stored the group (over
    Flight or shared memory) or after the controller published it: an unpublished grant expires and its
    data is deleted; a published group is trained once (whether or not its writer lived to see it)."""
    sc = Scenario(shared_plane, job)
    sc.open()
    victim = sc.writer("victim", groups=3, die_at=f"{step}@2", transport=transport)
    sc.trainer("t0")
    victim.wait_event("at", step=step)
    victim.wait(10)
    sc.settle()
    sc.verify()


def test_writer_killed_in_put_many_after_storing_publishes_nothing(shared_plane, job):
    """A put_many of 4 groups killed after its first storage call: none is published (all or none), and
    the stored groups go when their grants expire."""
    sc = Scenario(shared_plane, job)
    sc.open()
    victim = sc.writer("victim", groups=4, many=4, die_at="stored")
    sc.trainer("t0")
    victim.wait_event("at", step="stored")
    victim.wait(10)
    sc.local_writer("w1").put(2)
    sc.settle()
    sc.verify()
    assert not [e for e in victim.events() if e["ev"] == "acked"]


def test_writer_stopped_past_its_grant_ttl_leaves_no_orphan(shared_plane, job):
    """Issue 14 item 8: a writer stopped after its grant, past grant_ttl, then continued: its put must be
    refused (or its group deleted), never kept by the server with no ledger entry (capacity says 0)."""
    sc = Scenario(shared_plane, job)
    sc.open()
    victim = sc.writer("victim", groups=1, pause_at="allocated", transport="flight")
    sc.trainer("t0")
    victim.wait_event("paused", step="allocated")
    victim.stopped = True
    (part,) = [tuple(p) for e in victim.events() if e["ev"] == "granted" for p in e["parts"]]
    wait_for("the grant expired and was collected", lambda: sc.states([part])[part] is None, 20)
    victim.cont()
    sc.settle()
    sc.verify()


def test_killed_writer_s_shared_memory_reservation_comes_back_at_the_server_ttl(make_plane, job):
    """Issue 14 item 10: a same-host writer killed between shm_reserve and shm_publish (its put deadline
    120 s) must not hold the reservation past the server's own --shm-ttl (1 s here)."""
    plane = make_plane(shm_ttl="1s")
    sc = Scenario(plane, job)
    sc.open()
    # 16 samples of ~8000 tokens: over the 256 KiB that travel inline, so reserve and publish are two calls
    victim = sc.writer("victim", groups=1, samples=16, median=8000, put_timeout=120, die_at="reserved")
    victim.wait_event("at", step="reserved")
    victim.wait(10)
    for i, server in enumerate(plane.servers):
        try:
            wait_for(
                f"{server.server_id}'s reservation swept",
                lambda i=i: not held_by(plane.storage(i).stats()),
                15,
            )
        except Hang as exc:
            sc.violation("orphan", f"a dead writer's reservation outlived --shm-ttl=1s: {exc}")
    sc.settle()
    sc.verify()


ANNOUNCE = pytest.mark.parametrize("announce", [True, False], ids=["rows-announced", "rows-not-announced"])


def _raw_put(sc: Scenario, plane, group_id: int, announce: bool, fault: list[str]):
    """A bare Flight DoPut of 8 one-row batches to server 0; returns the process and the event it
    reached first: its fault point, or the end of its stream (a server may refuse an unannounced put
    before any row, which publishes nothing too)."""
    sc.expected_rows[(sc.job, 1, group_id)] = 8
    args = ["--location", plane.servers[0].location, "--job", sc.job, "--group-id", str(group_id)]
    args += [*fault, *(["--announce"] if announce else [])]
    raw = plane.spawn(f"{sc.job}.raw", "proc_raw_put.py", *args)

    def reached():
        return next((e for e in raw.events() if e["ev"] in ("at", "paused", "done")), None)

    first = wait_for("the raw put reached its fault or ended", reached, 30)
    if first["ev"] == "done" and first["ok"]:
        sc.violation("partial", "a raw put killed after 4 of 8 rows completed")
    return raw, first


@ANNOUNCE
def test_raw_writer_killed_mid_stream_publishes_nothing(shared_plane, job, announce):
    """Issue 14 item 1: a bare Flight DoPut killed after 4 of its 8 one-row batches publishes nothing,
    whether or not its descriptor announced num_rows (the wire format says so; a server may refuse a
    put without num_rows at once)."""
    sc = Scenario(shared_plane, job)
    sc.open()
    raw, _ = _raw_put(sc, shared_plane, 999, announce, ["--die-at", "wrote@4"])
    raw.wait(10)
    _watch(sc, 3.0)
    sc.settle()
    sc.verify()


@ANNOUNCE
def test_raw_writer_stopped_mid_stream_then_killed_publishes_nothing(shared_plane, job, announce):
    """Issue 14 item 1: a bare Flight DoPut stopped after 4 of 8 rows shows nothing while it hangs, and
    nothing after it is killed."""
    sc = Scenario(shared_plane, job)
    sc.open()
    raw, first = _raw_put(sc, shared_plane, 998, announce, ["--pause-at", "wrote@4"])
    if first["ev"] == "paused":
        raw.stopped = True
        _watch(sc, 1.5)
    raw.kill()
    _watch(sc, 3.0)
    sc.settle()
    sc.verify()


def _watch(sc: Scenario, seconds: float) -> None:
    """Look at what a bare Flight client sees, several times over ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sc.scan_visible()
        time.sleep(0.3)


def test_backpressure_full_servers_make_writers_wait_then_finish(make_plane, job):
    """Servers that hold 3 groups each: writers wait for capacity (backpressure, no unbounded queue)
    while a slow trainer drains, and every acknowledged group is trained once."""
    plane = make_plane(max_groups=3)
    sc = Scenario(plane, job)
    sc.open()
    sc.writer("w0", groups=8, put_timeout=40)
    sc.writer("w1", groups=8, put_timeout=40)
    sc.trainer("t0", max_groups=2, step_sleep=0.2)
    sc.settle(timeout=60)
    sc.verify()


def test_backpressure_with_a_stopped_trainer_holding_the_capacity(shared_plane, job):
    """A trainer stopped while its lease holds the job's whole capacity (4 groups): a writer waits for
    capacity, the lease expires, another trainer drains, the writer finishes; the woken trainer is
    refused."""
    sc = Scenario(shared_plane, job, {"capacity_groups": 4})
    sc.open()
    sc.local_writer("w0").put(4)
    victim = sc.trainer("victim", max_groups=4, pause_at="fetched")
    t1 = sc.trainer("t1", max_groups=2, held=True)
    token, parts, gens = sc.paused_lease(victim, "fetched")
    writer = sc.writer("w1", groups=6, put_timeout=40)  # waits: the stopped trainer holds the capacity
    sc.release(t1)
    sc.expect("hang", "the stopped trainer's lease expired", lambda: sc.lease_gone(parts, gens), 20)
    sc.expect("hang", "the waiting writer finished", lambda: not writer.alive(), 40)
    victim.cont()
    sc.expect_event("zombie", victim, "refused", 20, token=token)
    sc.settle()
    sc.verify()
