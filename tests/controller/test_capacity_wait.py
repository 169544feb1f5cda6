"""Writers waiting for capacity on the in-process host: parked, woken when capacity is released, never
holding a grant for a caller that left.

A refused ``allocate``/``allocate_many`` with a ``wait`` used to be answered at once, and the writer slept
its ``retry_after`` before asking again: nothing woke it when a confirmed delete freed room.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from trajflight.controller import ControllerClient, JobConfig, LocalController
from trajflight.controller._commands import Allocate
from trajflight.errors import CapacityExceededError, UnavailableError

from .conftest import FakeClock, make_world

CONFIG = JobConfig(grant_ttl=5.0, capacity_retry_after=600.0)
"""A retry hint no test waits out: only a wake can grant a parked call in time."""


def _full_plane(capacity_groups: int = 1) -> tuple[LocalController, ControllerClient]:
    """A host with no sweeper thread (each test sweeps) and a job whose capacity is full of READY groups."""
    host = LocalController(clock=FakeClock(), start=False)
    client = ControllerClient(host, timeout=60.0)
    client.register_server("s0", node="n0", location="grpc://x:1", capacity_bytes=10**6, capacity_groups=100)
    client.open_job("j", 1, dataclasses.replace(CONFIG, capacity_groups=capacity_groups))
    client.register_writer("j", 1, "w0", node="n0")
    for _ in range(capacity_groups):
        grant = client.allocate("j", 1, "w0", nbytes=100)
        client.publish(
            grant.partition, token=grant.token, rows=1, nbytes=100, tokens=1, policy_version=0, columns=()
        )
    return host, client


def _commit_all(client: ControllerClient) -> None:
    lease = client.acquire("j", "t", max_groups=100)
    assert lease is not None
    for step in (client.prepare, client.start_training, client.finish_training, client.commit):
        step(lease.token, "b")


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = call()
        except Exception as exc:  # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10.0
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.mark.parametrize("many", [False, True], ids=["allocate", "allocate_many"])
def test_a_refused_allocate_with_wait_is_granted_when_a_confirmed_delete_frees_room(many):
    host, client = _full_plane()
    with host:
        _commit_all(client)  # committed, but its bytes stay charged until the delete is confirmed
        with pytest.raises(CapacityExceededError):
            client.allocate("j", 1, "w0", nbytes=100)  # no wait: refused at once, as before
        if many:
            thread, out = _in_thread(lambda: client.allocate_many("j", 1, "w0", nbytes=[100], wait=600))
        else:
            thread, out = _in_thread(lambda: client.allocate("j", 1, "w0", nbytes=100, wait=600))
        _wait_until(lambda: host.waiting_for_capacity == 1, "the writer to park")
        assert host.sweep() == 1  # the delete is confirmed: capacity released, the parked call woken
        thread.join(10.0)  # far below the wait (and MAX_WAIT): only the wake can have granted it
        assert not thread.is_alive()
        assert "error" not in out, out
        grant = out["result"][0] if many else out["result"]
        assert grant.partition.group_id == 1
        assert client.usage("j") == (100, 1)
        assert host.waiting_for_capacity == 0


def test_a_refused_allocate_times_out_with_the_refusal_when_nothing_frees():
    host, client = _full_plane()
    with host:
        with pytest.raises(CapacityExceededError, match="capacity") as info:
            client.allocate("j", 1, "w0", nbytes=100, wait=0.3)
        assert info.value.retry_after == 600.0  # the job's hint travels as before
        assert client.usage("j") == (100, 1)  # nothing granted
        assert host.waiting_for_capacity == 0


def test_a_waiting_allocate_is_woken_by_a_new_server_and_by_a_new_epoch():
    host, client = _full_plane()
    with host:
        client.open_job("k", 1, {"capacity_groups": 10})
        client.register_writer("k", 1, "w0", node="n0")
        client.register_server("s0", node="n0", location="grpc://x:1", capacity_bytes=100, capacity_groups=1)
        thread, out = _in_thread(lambda: client.allocate("k", 1, "w0", nbytes=100, wait=600))
        _wait_until(lambda: host.waiting_for_capacity == 1, "the writer to park")
        client.register_server("s1", node="n0", location="grpc://x:2", capacity_bytes=100, capacity_groups=1)
        thread.join(10.0)
        assert out["result"].server_id == "s1"
        thread, out = _in_thread(lambda: client.allocate("j", 1, "w0", nbytes=100, wait=600))
        _wait_until(lambda: host.waiting_for_capacity == 1, "the writer to park")
        client.open_job("j", 2, CONFIG)  # the writer's epoch is fenced: it learns so at once
        thread.join(10.0)
        assert type(out["error"]).__name__ == "StaleFenceError"


def test_a_caller_that_left_while_parked_is_granted_nothing():
    host, client = _full_plane()
    gone = threading.Event()
    with host:
        _commit_all(client)
        command = Allocate(job_id="j", epoch=1, writer_id="w0", nbytes=100)
        thread, out = _in_thread(lambda: host.run(command, timeout=60, wait=600, abandoned=gone.is_set))
        _wait_until(lambda: host.waiting_for_capacity == 1, "the writer to park")
        gone.set()
        thread.join(10.0)
        assert isinstance(out.get("error"), UnavailableError)
        host.sweep()  # the capacity comes back, and nobody holds it
        assert client.usage("j") == (0, 0)
        assert client.counts("j")["ALLOCATED"] == 0


def test_a_grant_made_as_its_caller_left_is_abandoned_at_once():
    host, client = _full_plane()
    with host:
        client.open_job("k", 1, {"capacity_groups": 10})
        client.register_writer("k", 1, "w0", node="n0")
        command = Allocate(job_id="k", epoch=1, writer_id="w0", nbytes=100)
        with pytest.raises(UnavailableError):
            host.run(command, timeout=60, wait=600, abandoned=lambda: True)
        counts = client.counts("k")
        assert counts["ALLOCATED"] == 0
        assert counts["DROPPED"] == 1  # given back, on its way to deletion
        host.sweep()
        assert client.usage("k") == (0, 0)


def test_close_answers_a_parked_allocate_with_unavailable():
    host, client = _full_plane()
    thread, out = _in_thread(lambda: client.allocate("j", 1, "w0", nbytes=100, wait=600))
    _wait_until(lambda: host.waiting_for_capacity == 1, "the writer to park")
    host.close()
    thread.join(10.0)
    assert isinstance(out.get("error"), UnavailableError)


def test_the_capacity_version_moves_wherever_capacity_comes_back():
    world = make_world()
    ledger, now = world.ledger, 1000.0
    seen = ledger.capacity_version
    grant = ledger.allocate("j", 1, "w0", nbytes=100, now=now)
    assert ledger.capacity_version == seen  # taking capacity wakes nobody
    ledger.publish(grant.partition, token=grant.token, rows=1, nbytes=60, tokens=1, policy_version=0,
                   columns=(), now=now)  # fmt: skip
    assert ledger.capacity_version > seen  # the unused 40 bytes came back
    seen = ledger.capacity_version
    ledger.abandon(ledger.allocate("j", 1, "w0", nbytes=100, now=now).partition, token=ledger.last_token,
                   now=now)  # fmt: skip
    assert ledger.capacity_version == seen  # still charged until its delete is confirmed
    (work,) = ledger.take_deletes(now=now)
    ledger.delete_done(work.partition, ok=True, now=now)
    assert ledger.capacity_version > seen
    seen = ledger.capacity_version
    ledger.register_server(
        "s9", node="n0", location="grpc://y:1", capacity_bytes=10, capacity_groups=1, now=now
    )
    assert ledger.capacity_version > seen
