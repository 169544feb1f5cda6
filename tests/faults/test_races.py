"""Scenarios: races of several writers and trainers over many groups, without faults and with trainers
killed and stopped at arbitrary times (marked slow: each runs for tens of seconds here)."""

from __future__ import annotations

import random
import time

import pytest
from fault_audit import Scenario

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_race_of_three_trainers_and_two_writers_over_200_groups(plane, job):
    """2 writers put 200 groups (one by one and in put_many batches), 3 trainers (shared memory and
    Flight) lease them concurrently: every group trained once, none partial, nothing left."""
    sc = Scenario(plane, job)
    sc.open()
    sc.writer("w0", groups=100)
    sc.writer("w1", groups=100, many=4)
    sc.trainer("t0", max_groups=8)
    sc.trainer("t1", max_groups=8)
    sc.trainer("t2", max_groups=8, transport="flight")
    sc.settle(timeout=150)
    sc.verify()


def test_race_with_trainers_killed_and_stopped_at_arbitrary_times(plane, job):
    """The race again (120 groups), while trainers are SIGKILLed or stopped for 3 s (past their TTL) at
    seeded arbitrary moments and replaced: the ledger, not the timing, keeps every group trained once
    (a commit whose answer died with its trainer counts when the ledger has it committed)."""
    rng = random.Random(14)
    sc = Scenario(plane, job)
    sc.open()
    sc.writer("w0", groups=60, sleep=0.02)
    sc.writer("w1", groups=60, many=3, sleep=0.05)
    live = [sc.trainer(f"t{i}", max_groups=4) for i in range(3)]
    for n in range(4):
        time.sleep(rng.uniform(0.5, 2.0))  # when the fault strikes, not an assertion
        victim = live.pop(rng.randrange(len(live)))
        if n % 2 == 0:
            victim.kill()
        else:
            victim.stop()
            time.sleep(3.0)
            victim.cont()
        live.append(sc.trainer(f"r{n}", max_groups=4))
    sc.settle(timeout=150)
    sc.verify()
