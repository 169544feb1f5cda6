"""run_parallel's kept threads: no thread per call, a thread per call in flight, errors in call order."""

from __future__ import annotations

import threading

import pytest

from trajflight.flight_server import run_parallel
from trajflight.flight_server._workers import Workers, shared_workers


def test_calls_in_turn_reuse_the_kept_threads():
    workers = Workers(name="t-reuse")
    for _ in range(20):
        futures = [workers.submit(lambda i=i: i * 2) for i in range(3)]
        assert [f.result(timeout=10) for f in futures] == [0, 2, 4]
    assert workers.started <= 6  # 3 at a time; a thread that just finished may not be idle again yet


def test_every_call_in_flight_gets_a_thread_of_its_own():
    """Calls that wait on each other all run at once: none queues behind another (no deadlock)."""
    workers = Workers(name="t-own")
    barrier = threading.Barrier(5, timeout=10)
    futures = [workers.submit(barrier.wait) for _ in range(5)]
    assert sorted(f.result(timeout=10) for f in futures) == [0, 1, 2, 3, 4]


def test_a_call_that_submits_calls_itself_does_not_deadlock():
    workers = Workers(name="t-nested")

    def outer() -> list[int]:
        return [workers.submit(lambda i=i: i).result(timeout=10) for i in range(3)]

    futures = [workers.submit(outer) for _ in range(4)]
    assert [f.result(timeout=10) for f in futures] == [[0, 1, 2]] * 4


def test_an_idle_thread_ends_after_its_idle_time_and_later_calls_still_run():
    workers = Workers(name="t-idle", idle_exit=0.05)
    assert workers.submit(lambda: 1).result(timeout=10) == 1
    thread = next(t for t in threading.enumerate() if t.name == "t-idle-1")
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert workers.submit(lambda: 2).result(timeout=10) == 2
    assert workers.started == 2


def test_run_parallel_runs_the_first_call_here_and_the_rest_on_kept_threads():
    here = threading.get_ident()
    before = shared_workers().started
    for _ in range(10):
        idents = run_parallel([threading.get_ident, threading.get_ident, threading.get_ident])
        assert idents[0] == here
        assert here not in idents[1:]
    assert shared_workers().started - before <= 4


def test_run_parallel_raises_the_first_error_in_call_order_after_every_call_ended():
    ended = threading.Event()

    def slow_ok() -> int:
        ended.wait(0.05)
        ended.set()
        return 1

    def fail(message: str) -> int:
        raise ValueError(message)

    with pytest.raises(ValueError, match="first"):
        run_parallel([lambda: fail("first"), slow_ok, lambda: fail("second")])
    assert ended.is_set()
    with pytest.raises(ValueError, match="second"):
        run_parallel([slow_ok, lambda: fail("second")])
