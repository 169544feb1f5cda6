"""The fence list: when a lease ends without its holder, its groups' new generation goes to their servers.

Issue 14 item 9: a zombie trainer (stopped past its TTL) could still read and append to its groups,
because storage servers fence by generation only and nobody told them that the lease had expired. The
ledger now gives such groups a fresh generation and hands the host "fence work" to raise it on the
servers, with back-off, carried in snapshots and rebuilt by journal replay. Fake clocks throughout.
"""

from __future__ import annotations

import threading

from trajflight.controller import (
    ControllerClient,
    FenceWork,
    GroupState,
    JobConfig,
    Ledger,
    LocalController,
)
from trajflight.controller._fences import RETRY_INITIAL, TAKE_TIMEOUT

TTL = 10.0  # the world's default lease TTL (tests/controller/conftest.py CONFIG)


def _training(world, n: int = 1):
    world.put(n)
    lease = world.lease(n)
    world.ledger.prepare(lease.token, "b", now=world.now)
    world.ledger.start_training(lease.token, "b", now=world.now)
    return lease


def test_an_expired_lease_fences_its_groups_under_a_fresh_generation(world):
    """Item 9: an expired TRAINING lease leaves its UNKNOWN groups fenced above its token."""
    lease = _training(world, 2)
    assert world.ledger.fence_list() == ()  # a live lease: nothing to fence
    world.clock.advance(TTL)
    world.ledger.tick(world.now)
    infos = [world.ledger.group(p) for p in lease.partitions]
    assert {i.state for i in infos} == {GroupState.UNKNOWN}
    fresh = infos[0].generation
    assert fresh > lease.token
    assert fresh == world.ledger.last_token  # taken from the one token counter
    assert {i.generation for i in infos} == {fresh}
    work = world.ledger.take_fences(now=world.now)
    assert sorted(work, key=lambda w: w.partition) == [
        FenceWork(p, "s0", "grpc://127.0.0.1:9000", fresh, 1) for p in lease.partitions
    ]
    for item in work:
        assert world.ledger.fence_done(item.partition, generation=item.generation, ok=True, now=world.now)
    assert world.ledger.fence_list() == ()


def test_an_expired_leased_group_is_fenced_and_the_next_lease_is_above_the_fence(world):
    (grant,) = world.put(1)
    first = world.lease(1)
    world.clock.advance(TTL)
    second = world.lease(1)  # the expiry happens lazily, inside this call
    (fence,) = world.ledger.fence_list()
    assert fence.partition == grant.partition
    assert first.token < fence.generation < second.token
    assert world.ledger.group(grant.partition).generation == second.token


def test_leases_that_end_with_their_holder_leave_nothing_to_fence(world):
    world.put(2)
    world.train(world.lease(1))
    world.ledger.release(world.lease(1).token, now=world.now)
    assert world.ledger.fence_list() == ()


def test_a_newer_epoch_and_a_restart_fence_the_live_leases(world):
    lease = _training(world)
    world.ledger.open_job("j", 2, now=world.now)
    (fence,) = world.ledger.fence_list()
    assert fence.partition == lease.partitions[0]
    assert fence.generation > lease.token

    other = Ledger()
    other.register_server("s0", node="n", location="grpc://x", capacity_bytes=10**6, capacity_groups=9, now=0)
    other.open_job("k", 1, now=0)
    other.register_writer("k", 1, "w", node="n", now=0)
    grant = other.allocate("k", 1, "w", nbytes=10, now=0)
    other.publish(
        grant.partition, token=grant.token, rows=1, nbytes=10, tokens=1, policy_version=0, columns=(), now=0
    )
    leased = other.acquire("k", "t", max_groups=1, now=0)
    other.recover(other.incarnation + 1, now=1)
    (fence,) = other.fence_list()
    assert fence.generation > leased.token
    assert fence.generation >> 32 == other.incarnation  # a token of the new incarnation


def test_a_failed_fence_is_retried_with_back_off_and_a_lost_hand_out_after_a_timeout(world):
    _training(world)
    world.clock.advance(TTL)
    (work,) = world.ledger.take_fences(now=world.now)
    assert world.ledger.take_fences(now=world.now) == []  # in flight
    assert not world.ledger.fence_done(
        work.partition, generation=work.generation, ok=False, now=world.now, error="down"
    )
    assert world.ledger.next_deadline() == world.now + RETRY_INITIAL
    assert world.ledger.take_fences(now=world.now) == []  # backing off
    (again,) = world.ledger.take_fences(now=world.now + RETRY_INITIAL)
    assert (again.attempt, again.last_error) == (2, "down")
    (lost,) = world.ledger.take_fences(now=world.now + RETRY_INITIAL + TAKE_TIMEOUT)  # never reported
    assert lost.attempt == 3


def test_a_report_of_an_older_generation_does_not_confirm_a_newer_fence(world):
    (grant,) = world.put(1)
    world.lease(1)
    world.clock.advance(TTL)
    world.ledger.tick(world.now)
    (old,) = world.ledger.take_fences(now=world.now)
    world.lease(1)  # leased again, and expires again: the pending fence rises
    world.clock.advance(TTL)
    world.ledger.tick(world.now)
    assert not world.ledger.fence_done(grant.partition, generation=old.generation, ok=True, now=world.now)
    (pending,) = world.ledger.fence_list()
    assert pending.generation > old.generation
    assert world.ledger.fence_done(grant.partition, generation=pending.generation, ok=True, now=world.now)


def test_an_unknown_group_dropped_by_the_operator_is_deleted_under_its_fenced_generation(world):
    """Resolve needs nothing from the servers; the delete then carries the fence's generation, which the
    server accepts (a delete under the expired lease's token would be refused as stale)."""
    lease = _training(world)
    world.clock.advance(TTL)
    world.ledger.tick(world.now)
    (fence,) = world.ledger.fence_list()
    world.ledger.resolve("j", lease.partitions, "drop", now=world.now)
    (delete,) = world.ledger.take_deletes(now=world.now)
    assert delete.token == fence.generation
    world.ledger.delete_done(delete.partition, ok=True, now=world.now)
    assert world.ledger.take_fences(now=world.now) == []  # the group is gone: nothing left to fence
    assert world.ledger.fence_list() == ()


def test_the_fence_list_survives_a_snapshot(world):
    _training(world, 3)
    world.clock.advance(TTL)
    world.ledger.tick(world.now)
    (first, *_) = world.ledger.take_fences(now=world.now, limit=1)
    world.ledger.fence_done(first.partition, generation=first.generation, ok=False, now=world.now, error="x")
    restored = Ledger.from_snapshot(world.ledger.snapshot())
    assert {(w.partition, w.generation) for w in restored.fence_list()} == {
        (w.partition, w.generation) for w in world.ledger.fence_list()
    }
    assert len(restored.take_fences(now=world.now)) == 3  # none in flight after a restart


def test_the_host_sweeper_runs_fences_per_location_and_retries_failures(tmp_path):
    """The in-process host: one fencer call per server location, outside the lock; a failure is retried,
    and pending fences survive a crash of the host (journal replay and the restart's own fences)."""

    class Clock:
        now = 1000.0

        def __call__(self) -> float:
            return self.now

    clock, calls, fail = Clock(), [], {"on": True}
    lock_free = []

    def fencer(work):
        lock_free.append(host._cond.acquire(blocking=False))  # the sweeper does not hold the lock
        if lock_free[-1]:
            host._cond.release()
        calls.append(sorted(w.partition.group_id for w in work))
        if fail["on"]:
            raise ConnectionError("storage server down")

    host = LocalController(fencer=fencer, clock=clock, state_dir=tmp_path, start=False)
    client = ControllerClient(host, timeout=5.0)
    config = JobConfig(default_lease_ttl=5.0)
    for i in range(2):
        client.register_server(
            f"s{i}", node="n", location=f"grpc://127.0.0.1:{i + 1}", capacity_bytes=1000, capacity_groups=1
        )
    client.open_job("j", 1, config)
    client.register_writer("j", 1, "w", node="n")
    for _ in range(2):
        grant = client.allocate("j", 1, "w", nbytes=10)
        client.publish(
            grant.partition, token=grant.token, rows=1, nbytes=10, tokens=1, policy_version=0, columns=()
        )
    lease = client.acquire("j", "t", max_groups=2)
    assert lease is not None
    assert len({g.server_id for g in lease.groups}) == 2
    clock.now += 5.0
    assert host.sweep() == 2
    assert sorted(calls) == [[0], [1]]
    assert all(lock_free)
    assert {w.last_error for w in client.fence_list()} == {"ConnectionError: storage server down"}
    host._core.close()  # the host dies with two fences pending

    again = LocalController(fencer=fencer, clock=clock, state_dir=tmp_path, start=False)
    assert len(ControllerClient(again).fence_list()) == 2  # replayed from the journal
    fail["on"] = False
    calls.clear()
    clock.now += 1.0  # past the back-off
    assert again.sweep() == 2
    assert ControllerClient(again).fence_list() == ()
    again.close()


def test_a_sweeper_thread_fences_expired_leases_without_any_call():
    fenced = threading.Event()
    with LocalController(fencer=lambda work: fenced.set(), sweep_interval=0.02) as host:
        client = ControllerClient(host)
        client.register_server("s", node="n", location="grpc://x", capacity_bytes=100, capacity_groups=9)
        client.open_job("j", 1)
        client.register_writer("j", 1, "w", node="n")
        grant = client.allocate("j", 1, "w", nbytes=10)
        client.publish(
            grant.partition, token=grant.token, rows=1, nbytes=10, tokens=1, policy_version=0, columns=()
        )
        client.acquire("j", "t", max_groups=1, ttl=0.2)
        assert fenced.wait(10.0)
