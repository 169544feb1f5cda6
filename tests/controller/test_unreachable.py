"""Groups a trainer cannot open (issue 14, item 7): missing ones are lost, those of a server that does not
answer wait for it under a back-off that ``acquire`` honours, and the lease is never stranded."""

from __future__ import annotations

import dataclasses

import pytest

from trajflight.controller import GroupState, Ledger
from trajflight.controller._durable import HostCore
from trajflight.errors import InvalidStateError, NotFoundError

from .conftest import CONFIG, World, make_world

RETRY = dataclasses.replace(CONFIG, server_retry_initial=2.0, server_retry_max=5.0)


def _two_servers(config=RETRY) -> World:
    world = make_world(config)
    world.ledger.register_server(
        "s1", node="n0", location="grpc://127.0.0.1:9001", capacity_bytes=10**9, capacity_groups=10**6,
        now=world.now,
    )  # fmt: skip
    return world


def _on(world: World, server: str) -> list:
    return [g.partition for g in world.grants if world.ledger.group(g.partition).server_id == server]


def test_missing_groups_leave_the_lease_lost_and_their_capacity_comes_back():
    """Regression (issue 14, item 7): a group its server no longer has stayed in the lease (and READY
    forever after it expired), stranding the healthy groups leased with it."""
    world = _two_servers()
    world.put(4)
    lease = world.lease(4)
    gone = _on(world, "s1")
    assert len(gone) == 2
    left = world.ledger.report_unusable(lease.token, missing=gone, now=world.now)
    assert left == tuple(p for p in lease.partitions if p in gone)
    lost = world.ledger.lost("j")
    assert [x.partition for x in lost] == gone
    assert {x.reason for x in lost} == {"missing on server s1"}
    counts = world.ledger.counts("j")
    assert (counts["LEASED"], counts["DROPPED"], counts["lost"]) == (2, 2, 2)
    assert world.ledger.prepare(lease.token, "b", now=world.now) == tuple(_on(world, "s0"))
    assert world.confirm_deletes() == 2  # a delete of what the server no longer has is done
    assert world.ledger.usage("j") == (2000, 2)
    # A repeat changes nothing more; a group not in the lease is refused.
    assert world.ledger.report_unusable(lease.token, missing=gone, now=world.now) == ()
    with pytest.raises(NotFoundError):
        world.ledger.report_unusable(lease.token, missing=[("j", 1, 99)], now=world.now)


def test_groups_of_an_unreachable_server_wait_out_its_back_off():
    world = _two_servers()
    world.put(4)
    lease = world.lease(4)
    away = _on(world, "s1")
    left = world.ledger.report_unusable(lease.token, unreachable=["s1"], now=world.now)
    assert set(left) == set(away)
    assert world.ledger.counts("j")["READY"] == 2
    assert world.ledger.acquire("j", "t", max_groups=4, now=world.now) is None  # not offered to anyone
    assert world.ledger.next_deadline() <= world.now + 2.0  # hosts wake long-polls when it ends
    world.clock.advance(1.9)
    assert world.ledger.acquire("j", "t", max_groups=4, now=world.now) is None
    world.clock.advance(0.1)
    again = world.ledger.acquire("j", "t", max_groups=4, now=world.now)
    assert again is not None
    assert set(again.partitions) == set(away)
    assert all(g.generation == again.token for g in again.groups)


def _s1_offered(world: World) -> bool:
    """Whether an acquire now offers the group on s1 (whatever it leases is given back)."""
    lease = world.ledger.acquire("j", "t", max_groups=2, now=world.now)
    if lease is None:
        return False
    world.ledger.release(lease.token, now=world.now)
    return any(g.server_id == "s1" for g in lease.groups)


def test_the_back_off_doubles_while_the_server_stays_away_and_ends_when_it_is_reached():
    world = _two_servers()
    world.put(2)
    for wait in (2.0, 4.0, 5.0, 5.0):  # server_retry_initial 2 s, doubling, at most 5 s
        lease = world.lease(2)
        world.ledger.report_unusable(lease.token, unreachable=["s1"], now=world.now)
        world.ledger.release(lease.token, now=world.now)
        world.clock.advance(wait - 0.01)
        assert not _s1_offered(world)
        world.clock.advance(0.01)
    lease = world.lease(2)
    world.ledger.report_unusable(lease.token, unreachable=["s1"], now=world.now)
    world.ledger.release(lease.token, now=world.now)
    assert not _s1_offered(world)
    world.ledger.register_server(  # it registers again: reached, at once
        "s1", node="n0", location="grpc://127.0.0.1:9001", capacity_bytes=10**9, capacity_groups=10**6,
        now=world.now,
    )  # fmt: skip
    assert _s1_offered(world)
    lease = world.lease(2)
    world.ledger.report_unusable(lease.token, unreachable=["s1"], now=world.now)
    world.ledger.release(lease.token, now=world.now)
    world.clock.advance(2.0)  # its failures were forgotten: the first back-off again
    assert _s1_offered(world)


def test_a_confirmed_delete_on_the_server_ends_its_back_off():
    world = _two_servers()
    world.put(4)
    first = world.lease(2)
    world.train(first)  # one group on each server, on the GC list
    lease = world.lease(2)
    world.ledger.report_unusable(lease.token, unreachable=["s1"], now=world.now)
    assert world.ledger.acquire("j", "t", max_groups=2, now=world.now) is None
    assert world.confirm_deletes() == 2  # s1 answered a delete
    again = world.ledger.acquire("j", "t", max_groups=2, now=world.now)
    assert again is not None


def test_a_lease_with_nothing_left_ends_and_is_never_stranded():
    world = _two_servers()
    world.put(2)
    lease = world.lease(2)
    on_s0, on_s1 = _on(world, "s0"), _on(world, "s1")
    world.ledger.report_unusable(lease.token, missing=on_s0, unreachable=["s1"], now=world.now)
    assert world.ledger.live_leases("j") == ()
    with pytest.raises(InvalidStateError, match="finished"):
        world.ledger.renew(lease.token, now=world.now)
    assert world.ledger.group(on_s0[0]).state is GroupState.DROPPED
    assert world.ledger.group(on_s1[0]).state is GroupState.READY
    assert world.ledger.report_unusable(lease.token, missing=on_s0, now=world.now) == ()  # a repeat


def test_unknown_servers_and_groups_in_training_are_refused_and_change_nothing():
    world = _two_servers()
    world.put(2)
    lease = world.lease(2)
    with pytest.raises(NotFoundError, match="no storage server"):
        world.ledger.report_unusable(lease.token, missing=_on(world, "s0"), unreachable=["s9"], now=world.now)
    world.ledger.prepare(lease.token, "b", now=world.now)
    world.ledger.start_training(lease.token, "b", now=world.now)
    with pytest.raises(InvalidStateError):
        world.ledger.report_unusable(lease.token, missing=_on(world, "s0"), now=world.now)
    assert world.ledger.counts("j")["TRAINING"] == 2
    assert world.ledger.lost("j") == ()


def test_parked_groups_and_back_offs_survive_a_snapshot():
    world = _two_servers()
    world.put(4)
    lease = world.lease(4)
    world.ledger.report_unusable(lease.token, unreachable=["s1"], now=world.now)
    assert world.ledger.acquire("j", "t", max_groups=4, now=world.now) is None  # parks them
    copy = Ledger.from_snapshot(world.ledger.snapshot())
    assert copy.acquire("j", "t", max_groups=4, now=world.now) is None
    assert copy.next_deadline() == world.ledger.next_deadline()
    world.clock.advance(2.0)
    a = world.ledger.acquire("j", "t", max_groups=4, now=world.now)
    b = copy.acquire("j", "t", max_groups=4, now=world.now)
    assert a is not None
    assert b is not None
    assert a.partitions == b.partitions


def test_an_empty_acquire_that_parked_groups_is_journaled_and_replays(tmp_path):
    """Parking changes state: a host journals such an acquire although it leased nothing (and only such
    an empty acquire), so that a replay after a crash parks the same groups and the ledgers agree."""

    class Clock:
        now = 100.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    core = HostCore(clock=clock, state_dir=tmp_path)
    for server in ("s0", "s1"):
        core.apply("register_server", {"server_id": server, "node": "n", "location": f"grpc://{server}",
                                       "capacity_bytes": 10**6, "capacity_groups": 100})  # fmt: skip
    core.apply("open_job", {"job_id": "j", "epoch": 1, "config": RETRY})
    core.apply("register_writer", {"job_id": "j", "epoch": 1, "writer_id": "w", "node": "n"})
    for _ in range(4):
        g = core.apply("allocate", {"job_id": "j", "epoch": 1, "writer_id": "w", "nbytes": 10})
        publish = {"partition": g.partition, "token": g.token, "rows": 1, "nbytes": 10, "tokens": 1}
        core.apply("publish", {**publish, "policy_version": 0, "columns": ()})
    lease = core.apply("acquire", {"job_id": "j", "owner": "t", "max_groups": 4})
    core.apply("report_unusable", {"token": lease.token, "unreachable": ["s1"]})
    (journal,) = tmp_path.glob("journal-*.log")
    size = journal.stat().st_size
    assert core.apply("acquire", {"job_id": "j", "owner": "t", "max_groups": 4}) is None  # parks 2
    assert journal.stat().st_size > size
    size = journal.stat().st_size
    assert core.apply("acquire", {"job_id": "j", "owner": "t", "max_groups": 4}) is None  # parks none
    assert journal.stat().st_size == size
    parked = core.ledger._upkeep.reach.export()
    assert len(parked[0][3]) == 2
    core.close()
    again = HostCore(clock=clock, state_dir=tmp_path)  # replays the journal, then ends the live lease
    assert again.ledger._upkeep.reach.export() == parked
    assert set(again.ledger.acquire("j", "t", max_groups=4, now=clock.now).partitions) == {
        p for p in lease.partitions if core.ledger.group(p).server_id == "s0"
    }
    again.close()
