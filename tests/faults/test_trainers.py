"""Scenarios: trainers killed (SIGKILL) and stopped (SIGSTOP/SIGCONT) at every step of lease, fetch,
prepare, training and commit, zombies, abandoned long polls, and a misbehaving reader.

These fault only clients, so they share one plane per module (each scenario a job of its own; a scenario
that leaves the plane dirty gets the next one a fresh plane).
"""

from __future__ import annotations

import json
import time

import pyarrow.flight as flight
import pytest
from fault_audit import Scenario
from faultkit import Hang, wait_for

pytestmark = pytest.mark.timeout(120)

STEPS = ["leased", "fetched", "prepared", "training", "trained", "committed"]


def test_baseline_two_writers_two_trainers_no_fault(shared_plane, job):
    """No fault: the audit holds on a clean run, over shared memory and over Flight."""
    sc = Scenario(shared_plane, job)
    sc.open()
    sc.writer("w0", groups=6)
    sc.writer("w1", groups=6, many=3)
    sc.trainer("t0")
    sc.trainer("t1", transport="flight")
    sc.settle()
    sc.verify()


@pytest.mark.parametrize("step", STEPS)
def test_trainer_killed_at_each_step(shared_plane, job, step):
    """SIGKILL of a trainer at each step of its lease: what it had not committed comes back (after the
    TTL: LEASED/PREPARED to READY, TRAINING/TRAINED to UNKNOWN, which the operator requeues) and the
    survivor trains every group exactly once; what it committed stays trained."""
    sc = Scenario(shared_plane, job)
    sc.open()
    sc.local_writer("w0").put(6)
    victim = sc.trainer("victim", max_groups=3, die_at=step)
    survivor = sc.trainer("survivor", held=True)
    victim.wait_event("at", step=step)
    victim.wait(10)
    sc.release(survivor)
    sc.settle()
    sc.verify()


@pytest.mark.parametrize("step", ["leased", "fetched", "trained"])
def test_trainer_stopped_past_its_ttl_is_refused_when_it_wakes(shared_plane, job, step):
    """A trainer stopped (a partition, as the controller sees it) past its lease's TTL: its groups are
    taken over, and when it wakes every step it tries on the old lease is refused; nothing is trained
    twice."""
    sc = Scenario(shared_plane, job)
    sc.open()
    sc.local_writer("w0").put(6)
    victim = sc.trainer("victim", max_groups=3, pause_at=step)
    survivor = sc.trainer("survivor", held=True)
    token, parts, gens = sc.paused_lease(victim, step)
    sc.release(survivor)

    wait_for("the stopped trainer's lease expired", lambda: sc.lease_gone(parts, gens), 20)
    victim.cont()
    sc.expect_event("zombie", victim, "refused", 20, token=token)
    sc.settle()
    sc.verify()


def test_zombie_cannot_read_or_append_to_its_unknown_groups(shared_plane, job):
    """Issue 14 item 9: a trainer stopped in training past its TTL leaves its groups UNKNOWN, for an
    operator to resolve; when it wakes, reading them and appending a column to one must be refused, and
    the stored data must not change."""
    sc = Scenario(shared_plane, job)
    sc.open()
    sc.local_writer("w0").put(2)
    victim = sc.trainer("victim", max_groups=2, pause_at="training", probe_after_pause=True)
    token, parts, _ = sc.paused_lease(victim, "training")

    wait_for("its groups UNKNOWN", lambda: set(sc.states(parts).values()) == {"UNKNOWN"}, 20)
    victim.cont()
    for what in ("fetch", "append"):
        probe = victim.wait_event("probe", what=what)
        if probe["ok"]:
            sc.violation("zombie", f"a zombie's {what} on its UNKNOWN groups was allowed: {probe}")
    for i in range(len(shared_plane.servers)):
        for info in shared_plane.storage(i).list_groups(job):
            if "zombie_col" in info.schema.names:
                sc.violation("zombie", f"the zombie's append changed stored group {info.key}")
    sc.expect_event("zombie", victim, "refused", 20, token=token)
    sc.settle()
    sc.verify()


def test_abandoned_long_poll_takes_no_group(shared_plane, job):
    """Issue 14 item 6: a trainer killed while parked in a long poll must not lease the next group (its
    poll is dead): a live trainer gets it, without waiting out a 30 s lease."""
    sc = Scenario(shared_plane, job, {"default_lease_ttl": "30s"})
    sc.open()
    victim = sc.trainer("victim", wait=20)
    survivor = sc.trainer("survivor", held=True)
    victim.wait_event("polling")
    time.sleep(1.5)  # the acquire reaches the controller and parks there (not a timing assertion)
    victim.kill()
    sc.local_writer("w0").put(1)
    sc.release(survivor)
    sc.settle(timeout=15)
    sc.verify()


def test_stopped_long_poll_loses_its_lease_to_the_ttl(shared_plane, job):
    """A trainer stopped while parked in a long poll may be granted the next groups, which it never
    receives; its lease expires (TTL), a live trainer trains them, and the woken poller is refused."""
    sc = Scenario(shared_plane, job)
    sc.open()
    victim = sc.trainer("victim", wait=20)
    survivor = sc.trainer("survivor", held=True)
    victim.wait_event("polling")
    time.sleep(1.5)
    victim.stop()
    sc.local_writer("w0").put(2)
    sc.release(survivor)

    try:
        wait_for("both groups committed", lambda: sc.counts()["committed_total"] == 2, 20)
    except Hang as exc:
        sc.violation("hang", str(exc))
    victim.cont()
    sc.settle()
    sc.verify()


def test_generation_beyond_int64_does_not_poison_a_group(shared_plane, job):
    """Issue 14 item 4: a raw client's do_get and advance_generation with generation 2**70 must be
    refused without raising the server's highest generation: the lease holder then reads and commits
    its groups as if nothing happened."""
    sc = Scenario(shared_plane, job, {"default_lease_ttl": "10s"})
    sc.open()
    sc.local_writer("w0").put(2)
    holder = sc.trainer("holder", max_groups=2, pause_at="leased")
    token, parts, _ = sc.paused_lease(holder, "leased")
    for part in parts:
        location = sc.client.controller.group(part).location
        key = {"job_id": part[0], "epoch": part[1], "group_id": part[2], "generation": 2**70}
        raw = flight.FlightClient(location)
        try:
            try:
                raw.do_get(flight.Ticket(json.dumps({"v": 1, "groups": [key]}).encode())).read_all()
                sc.violation("input", f"do_get with generation 2**70 was served for {part}")
            except flight.FlightError:
                pass
            try:
                body = json.dumps({"v": 1, "groups": [key]}).encode()
                list(raw.do_action(flight.Action("advance_generation", body)))
                sc.violation("input", f"advance_generation to 2**70 was accepted for {part}")
            except flight.FlightError:
                pass
        finally:
            raw.close()
    holder.cont()
    try:
        holder.wait_event("committed", token=token, timeout=20)
    except Hang as exc:
        sc.violation("hang", f"the lease holder could not commit after the bad reads: {exc}")
    sc.settle()
    sc.verify()
