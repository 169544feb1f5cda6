"""Ledger.publish_ahead and Ledger.abandon: a publication that grants the writer's next partitions, and
the safety of the grants held ahead (expiry, capacity, fencing), with a fake clock (issue 16)."""

from __future__ import annotations

import dataclasses

import pytest

from trajflight.controller import GroupState, Publication, PutGrant
from trajflight.errors import (
    InvalidRequestError,
    InvalidStateError,
    LeaseExpiredError,
    NotFoundError,
    StaleFenceError,
)

from .conftest import CONFIG, World, make_world


def _item(grant: PutGrant, nbytes: int = 600) -> Publication:
    return Publication(grant.partition, grant.token, 8, nbytes, 77, 0, ("a",))


def _ahead(world: World, items: list[Publication], ahead: list[int], writer: str = "w0"):
    return world.ledger.publish_ahead(
        items, job_id=world.job, epoch=world.epoch, writer_id=writer, ahead=ahead, now=world.now
    )


def _unchanged(world: World):
    L = world.ledger
    return L.usage("j"), L.counts("j"), L.snapshot(), L.ready_version


def test_publish_ahead_is_publish_many_then_allocate_many_at_the_same_now(world):
    twin = make_world()
    grants = [world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now) for _ in range(2)]
    twin_grants = [twin.ledger.allocate("j", 1, "w0", nbytes=1000, now=twin.now) for _ in range(2)]
    world.clock.advance(1.0)
    twin.clock.advance(1.0)
    got = _ahead(world, [_item(g) for g in grants], [900, 800])
    want_groups = twin.ledger.publish_many([_item(g) for g in twin_grants], now=twin.now)
    want_grants = twin.ledger.allocate_many("j", 1, "w0", nbytes=[900, 800], now=twin.now)
    assert got.groups == tuple(want_groups)
    assert got.grants == tuple(want_grants)
    assert got.granted_at == world.now
    assert [g.expires_at - got.granted_at for g in got.grants] == [CONFIG.grant_ttl] * 2
    assert world.ledger.snapshot() == twin.ledger.snapshot()


def test_a_grant_held_ahead_is_charged_until_published_then_gives_back_the_rest(world):
    (grant,) = world.ledger.allocate_many("j", 1, "w0", nbytes=[1000], now=world.now)
    got = _ahead(world, [_item(grant)], [5000])
    assert world.ledger.usage("j") == (600 + 5000, 2)
    (held,) = got.grants
    assert world.state(held) == "ALLOCATED"
    _ahead(world, [_item(held, nbytes=700)], [])
    assert world.ledger.usage("j") == (600 + 700, 2)
    assert world.ledger.counts("j")["READY"] == 2


def test_an_empty_ahead_grants_nothing_and_publishes(world):
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    got = _ahead(world, [_item(grant)], [])
    assert got.grants == ()
    assert got.groups[0].state is GroupState.READY


def test_a_grant_held_ahead_expires_like_any_grant_and_its_partition_is_collected(world):
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    (held,) = _ahead(world, [_item(grant)], [1000]).grants
    world.clock.advance(CONFIG.grant_ttl + 0.1)
    world.ledger.tick(world.now)
    assert world.state(held) == "DROPPED"
    assert [w.partition for w in world.ledger.take_deletes(now=world.now)] == [held.partition]
    world.ledger.delete_done(held.partition, ok=True, now=world.now)
    assert world.ledger.usage("j") == (600, 1)
    with pytest.raises(NotFoundError):
        _ahead(world, [_item(held)], [])


def test_publishing_with_an_expired_grant_held_ahead_is_refused(world):
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    (held,) = _ahead(world, [_item(grant)], [1000]).grants
    world.clock.advance(CONFIG.grant_ttl + 0.1)
    before = world.ledger.usage("j")
    with pytest.raises(LeaseExpiredError):
        _ahead(world, [_item(held)], [1000])
    assert world.ledger.usage("j") == before  # and nothing was granted ahead either


def test_no_grant_ahead_when_capacity_is_full_and_the_publication_still_succeeds(world_factory):
    world = world_factory(capacity_bytes=2000)
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1500, now=world.now)
    got = _ahead(world, [_item(grant)], [1500])
    assert got.grants == ()
    assert got.groups[0].state is GroupState.READY
    assert world.ledger.usage("j") == (600, 1)
    got = _ahead(world, [_item(grant)], [1000, 1000])  # a repeat: the prefix that fits
    assert [g.nbytes for g in got.grants] == [1000]
    assert world.ledger.usage("j") == (1600, 2)


def test_no_grant_ahead_over_max_group_bytes(world):
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    assert _ahead(world, [_item(grant)], [CONFIG.max_group_bytes + 1]).grants == ()
    assert world.ledger.usage("j") == (600, 1)


def test_no_grant_ahead_for_a_strict_on_policy_job_even_to_a_writer_that_acknowledged(world_factory):
    """A held grant would let a put skip allocate's check that the writer acknowledged the policy."""
    world = world_factory(dataclasses.replace(CONFIG, strict_on_policy=True))
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    assert _ahead(world, [_item(grant)], [1000]).grants == ()  # w0 is up to date
    second = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    world.ledger.announce_policy("j", 1, now=world.now)  # w0 has not acknowledged it
    with pytest.raises(InvalidStateError):
        world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    got = _ahead(world, [_item(second)], [1000])  # its put already granted still publishes
    assert got.grants == ()
    assert got.groups[0].state is GroupState.READY
    assert world.ledger.usage("j") == (1200, 2)


@pytest.mark.parametrize("ahead", [[0], [-5], [1.5], [True], ["100"], [100, 2**70], "100", 5, None])
def test_a_bad_ahead_is_refused_before_anything_is_published(world, ahead):
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    before = _unchanged(world)
    with pytest.raises(InvalidRequestError):
        _ahead(world, [_item(grant)], ahead)
    assert _unchanged(world) == before


def test_an_unregistered_writer_or_a_bad_item_publishes_and_grants_nothing(world):
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    before = _unchanged(world)
    with pytest.raises(NotFoundError):
        _ahead(world, [_item(grant)], [1000], writer="nobody")
    with pytest.raises(StaleFenceError):
        _ahead(world, [dataclasses.replace(_item(grant), token=grant.token + 99)], [1000])
    with pytest.raises(InvalidRequestError):
        _ahead(world, [_item(grant, nbytes=1001)], [1000])
    assert _unchanged(world) == before


def test_a_new_epoch_drops_the_grants_held_ahead_and_refuses_their_use(world):
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    (held,) = _ahead(world, [_item(grant)], [1000]).grants
    world.ledger.open_job("j", 2, CONFIG, now=world.now)
    assert world.state(held) == "DROPPED"
    with pytest.raises(StaleFenceError):
        _ahead(world, [_item(held)], [1000])
    with pytest.raises(StaleFenceError):
        world.ledger.publish_ahead(
            [_item(held)], job_id="j", epoch=1, writer_id="w0", ahead=[], now=world.now
        )


def test_abandon_drops_a_held_grant_at_once_and_its_bytes_come_back_with_the_delete(world):
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    (held,) = _ahead(world, [_item(grant)], [4000]).grants
    assert world.ledger.usage("j") == (4600, 2)
    assert world.ledger.abandon(held.partition, token=held.token, now=world.now) is True
    assert world.state(held) == "DROPPED"
    assert world.confirm_deletes() == 1
    assert world.ledger.usage("j") == (600, 1)
    with pytest.raises(NotFoundError):  # deleted: gone from the ledger
        world.ledger.abandon(held.partition, token=held.token, now=world.now)


def test_abandon_is_harmless_for_a_published_or_dropped_group_and_checks_the_token(world):
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    (held,) = _ahead(world, [_item(grant)], [1000]).grants
    with pytest.raises(StaleFenceError):
        world.ledger.abandon(held.partition, token=held.token + 1, now=world.now)
    assert world.state(held) == "ALLOCATED"
    assert world.ledger.abandon(grant.partition, token=grant.token, now=world.now) is False  # published
    assert world.ledger.abandon(held.partition, token=held.token, now=world.now) is True
    assert world.ledger.abandon(held.partition, token=held.token, now=world.now) is False  # repeat
    assert world.ledger.counts("j")["READY"] == 1


def test_publish_ahead_and_abandon_are_journaled_client_calls():
    """Mutating (so the journal records and replays them) and served as plain calls to writers."""
    from trajflight.auth import Role
    from trajflight.controller import CALLS, COMMANDS, ROLES
    from trajflight.controller._commands import MUTATING

    for name in ("publish_ahead", "abandon"):
        assert name in MUTATING
        assert name in CALLS
        assert ROLES[name] == (Role.WRITER,)
    assert COMMANDS["publish_ahead"].argument_names == ("items", "job_id", "epoch", "writer_id", "ahead")
