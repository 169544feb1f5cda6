"""The GC list's hand-outs say why a group is deleted and carry its commit facts (for the archive)."""

from __future__ import annotations

from trajflight.controller import Ledger
from trajflight.controller._values import dumps, loads


def test_committed_delete_carries_owner_time_and_policy_version(world):
    """Issue 17: a delete of a committed group must say so and carry the lease facts an archive keeps
    (commit time, trained-by, the job's policy version then); before, DeleteWork carried neither."""
    world.ledger.announce_policy("j", 3, now=world.now)
    world.put(1, policy_version=3)
    world.ledger.announce_policy("j", 5, now=world.now)
    lease = world.lease(1)
    world.clock.advance(7.0)
    world.train(lease)
    (work,) = world.ledger.take_deletes(now=world.now)
    assert work.reason == "committed"
    assert work.committed_at == world.now
    assert work.trained_by == "trainer"
    assert work.trained_version == 5
    assert loads(dumps(work)) == work  # the control plane and journal carry the new fields


def test_dropped_delete_says_dropped_without_facts(world):
    """A dropped group (an abandoned grant) is deleted as ``dropped``, with no commit facts."""
    world.ledger.allocate("j", 1, "w0", nbytes=10, now=world.now)
    world.clock.advance(60.0)  # the grant expires unpublished: abandoned
    (work,) = world.ledger.take_deletes(now=world.now)
    assert work.reason == "dropped"
    assert (work.committed_at, work.trained_by, work.trained_version) == (None, None, None)


def test_commit_facts_survive_a_snapshot(world):
    """A controller restart (snapshot + journal) must hand out the same commit facts again."""
    world.put(1)
    lease = world.lease(1)
    world.train(lease)
    before = world.ledger.gc_list("j")
    after = Ledger.from_snapshot(world.ledger.snapshot()).gc_list("j")
    assert [w.reason for w in after] == ["committed"]
    assert [(w.committed_at, w.trained_by, w.trained_version) for w in after] == [
        (w.committed_at, w.trained_by, w.trained_version) for w in before
    ]
