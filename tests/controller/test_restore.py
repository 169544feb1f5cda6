"""Restore semantics (issue 14, items 2 and 3): commits kept until a durable checkpoint covers them, what a
restore offers again, purges and reports lost, deterministically."""

from __future__ import annotations

import dataclasses

import pytest

from trajflight.controller import (
    ControllerClient,
    GroupState,
    HeldGroup,
    JobConfig,
    Ledger,
    LocalController,
    LostGroup,
    checkpoint_seq,
)
from trajflight.controller._checkpoint import KIND_JOB, decode, encode
from trajflight.errors import (
    CapacityExceededError,
    CheckpointError,
    InvalidRequestError,
    NotFoundError,
    StaleFenceError,
)

from .conftest import CONFIG


def _config(world):
    return world.ledger._jobs["j"].config


def _held(world, grants):
    """What the storage server holds for ``grants`` (as ``Client.restore`` lists it)."""
    return [HeldGroup(g.partition, "s0", g.nbytes) for g in grants]


def _deleted(world) -> list:
    work = world.ledger.take_deletes(now=world.now)
    for item in work:
        world.ledger.delete_done(item.partition, ok=True, now=world.now)
    return [w.partition for w in work]


# ---------------------------------------------------------------------- commits kept for a restore
def test_a_job_that_never_checkpoints_deletes_on_commit(world):
    grants = world.put(2)
    world.train(world.lease(2))
    assert _deleted(world) == [g.partition for g in grants]
    assert world.ledger.counts("j")["kept"] == 0


def test_after_a_checkpoint_commits_are_kept_until_a_later_checkpoint_is_confirmed(world):
    """Regression (issue 14, item 2): commit deleted a group's data at once, so a restore from the
    checkpoint before the commit raced the delete. Commits are now kept (stored, holding capacity) until a
    checkpoint taken after them is confirmed durable."""
    grants = world.put(3)
    first = world.ledger.checkpoint("j", now=world.now)
    world.ledger.confirm_checkpoint("j", checkpoint_seq(first), now=world.now)
    world.train(world.lease(2))
    counts = world.ledger.counts("j")
    assert (counts["COMMITTED"], counts["kept"], counts["committed_total"]) == (2, 2, 1 * 2)
    assert _deleted(world) == []  # nothing on the GC list
    assert world.ledger.usage("j") == (3000, 3)  # kept commits hold capacity
    assert world.ledger.confirm_checkpoint("j", checkpoint_seq(first), now=world.now) == 0  # covers none
    second = world.ledger.checkpoint("j", now=world.now)
    assert checkpoint_seq(second) == checkpoint_seq(first) + 1
    assert _deleted(world) == []  # taken, not yet durable
    assert world.ledger.confirm_checkpoint("j", checkpoint_seq(second), now=world.now) == 2
    assert world.ledger.confirm_checkpoint("j", checkpoint_seq(second), now=world.now) == 0  # idempotent
    assert sorted(_deleted(world)) == sorted(g.partition for g in grants[:2])
    assert world.ledger.usage("j") == (1000, 1)
    assert world.ledger.counts("j")["kept"] == 0


def test_commits_after_a_checkpoint_stay_kept_when_it_is_confirmed(world):
    """A checkpoint covers only the commits made before it was taken."""
    world.put(2)
    data = world.ledger.checkpoint("j", now=world.now)
    world.train(world.lease(1))
    assert world.ledger.confirm_checkpoint("j", checkpoint_seq(data), now=world.now) == 0
    assert world.ledger.counts("j")["kept"] == 1
    assert _deleted(world) == []


def test_kept_commits_are_real_backpressure(world_factory):
    world = world_factory(dataclasses.replace(CONFIG, capacity_groups=2))
    world.put(2)
    data = world.ledger.checkpoint("j", now=world.now)
    world.train(world.lease(2))
    with pytest.raises(CapacityExceededError):
        world.ledger.allocate("j", 1, "w0", nbytes=10, now=world.now)
    world.ledger.confirm_checkpoint("j", checkpoint_seq(data), now=world.now)  # covers neither commit
    later = world.ledger.checkpoint("j", now=world.now)
    world.ledger.confirm_checkpoint("j", checkpoint_seq(later), now=world.now)
    assert len(_deleted(world)) == 2
    world.ledger.allocate("j", 1, "w0", nbytes=10, now=world.now)  # capacity came back


def test_confirming_a_checkpoint_that_was_never_taken_is_refused(world):
    world.put(1)
    with pytest.raises(InvalidRequestError, match="no checkpoint 1"):
        world.ledger.confirm_checkpoint("j", 1, now=world.now)
    data = world.ledger.checkpoint("j", now=world.now)
    with pytest.raises(InvalidRequestError, match="no checkpoint 2"):
        world.ledger.confirm_checkpoint("j", checkpoint_seq(data) + 1, now=world.now)
    with pytest.raises(CheckpointError, match="sequence number"):
        checkpoint_seq(world.ledger.snapshot())
    with pytest.raises(CheckpointError, match="magic"):
        checkpoint_seq(b"garbage")


def _host_world(state_dir=None, groups: int = 2) -> tuple[LocalController, ControllerClient]:
    host = LocalController(state_dir=state_dir, start=False)
    client = ControllerClient(host)
    client.register_server("s0", node="n0", location="grpc://x", capacity_bytes=10**6, capacity_groups=100)
    client.open_job("j", 1, CONFIG)
    client.register_writer("j", 1, "w0", node="n0")
    for _ in range(groups):
        g = client.allocate("j", 1, "w0", nbytes=10)
        client.publish(g.partition, token=g.token, rows=1, nbytes=10, tokens=1, policy_version=0, columns=())
    return host, client


def _commit_one(client: ControllerClient) -> None:
    lease = client.acquire("j", "t", max_groups=1)
    for step in ("prepare", "start_training", "finish_training", "commit"):
        getattr(client, step)(lease.token, "b")


def test_a_checkpoint_whose_file_write_fails_is_not_durable(tmp_path):
    """The ledger produced the bytes, the write failed: nothing is confirmed, the commits stay kept; the
    next checkpoint that is written releases them."""
    host, client = _host_world()
    client.checkpoint("j", tmp_path / "first.ckpt")
    _commit_one(client)
    with pytest.raises(CheckpointError, match="could not write"):
        client.checkpoint("j", tmp_path / "no" / "such" / "dir.ckpt")
    assert client.counts("j")["kept"] == 1
    assert host._core.ledger.gc_list("j") == ()
    client.checkpoint("j", tmp_path / "second.ckpt")
    assert client.counts("j")["kept"] == 0
    assert host.sweep() == 1  # the commit's delete
    host.close()


def test_a_checkpoint_taken_as_bytes_is_durable_only_when_confirmed():
    host, client = _host_world()
    client.checkpoint("j")
    _commit_one(client)
    data = client.checkpoint("j")  # the caller keeps the bytes; the host cannot know they are safe
    assert client.counts("j")["kept"] == 1
    assert client.confirm_checkpoint("j", data) == 1
    assert client.counts("j")["kept"] == 0
    host.close()


def test_checkpoint_confirmation_survives_a_host_crash(tmp_path):
    """Checkpoints and confirmations are journaled: a recovered host keeps the same kept commits."""
    host, client = _host_world(tmp_path, groups=3)
    data = client.checkpoint("j")
    _commit_one(client)
    _commit_one(client)
    host._core.close()  # the process dies
    again = LocalController(state_dir=tmp_path, start=False)
    client = ControllerClient(again)
    assert client.counts("j")["kept"] == 2
    with pytest.raises(InvalidRequestError):
        client.confirm_checkpoint("j", checkpoint_seq(data) + 1)
    assert client.confirm_checkpoint("j", checkpoint_seq(client.checkpoint("j"))) == 2
    again.close()


# ---------------------------------------------------------------------- what a restore offers again
def test_restore_from_the_latest_checkpoint_reoffers_groups_committed_after_it(world):
    """Regression (issue 14, item 2): a restore re-offers the groups READY at the checkpoint whether or
    not the rolled-back incarnation committed them afterwards: their data is kept, so it is always there."""
    grants = world.put(4)
    data = world.ledger.checkpoint("j", now=world.now)
    committed = world.lease(2)
    world.train(committed)
    assert _deleted(world) == []
    fresh = Ledger()
    counts = fresh.restore(
        data, job_id="j", epoch=2, config=_config(world), now=world.now, available=_held(world, grants)
    )
    assert (counts["READY"], counts["lost"], counts["purged"], counts["DROPPED"]) == (4, 0, 0, 0)
    lease = fresh.acquire("j", "t", max_groups=10, now=world.now)
    assert lease is not None
    assert set(lease.partitions) == {g.partition for g in grants}
    assert set(committed.partitions) <= set(lease.partitions)
    assert lease.token > world.ledger.last_token


def test_a_group_offered_again_carries_the_columns_its_server_stores(world):
    """Regression: a column appended after the checkpoint (a reward stage's ``advantage``) is on the
    server but not in the checkpoint; the restored ledger offered the group to ``lack=["advantage"]``
    again, whose append then failed with AlreadyExistsError, and never to ``require=["advantage"]``."""
    grants = world.put(2)
    data = world.ledger.checkpoint("j", now=world.now)
    stored = ("advantage", "response_ids")
    held = [HeldGroup(grants[0].partition, "s0", 1000, stored), *_held(world, grants[1:])]
    fresh = Ledger()
    fresh.restore(data, job_id="j", epoch=2, config=_config(world), now=world.now, available=held)
    assert fresh.group(grants[0].partition).columns == stored
    trainer = fresh.acquire("j", "t", max_groups=10, require=("advantage",), now=world.now)
    assert trainer is not None
    assert trainer.partitions == (grants[0].partition,)
    stage = fresh.acquire("j", "s", max_groups=10, lack=("advantage",), now=world.now)
    assert stage is not None
    assert stage.partitions == (grants[1].partition,)
    with pytest.raises(InvalidRequestError):
        Ledger().restore(
            data, job_id="j", epoch=2, config=_config(world), now=world.now,
            available=[HeldGroup(grants[0].partition, "s0", 1000, "advantage")],  # type: ignore[arg-type]
        )  # fmt: skip


def test_restore_issues_tokens_above_min_token(world):
    """Tokens after a restore exceed both the checkpoint's newest and the servers' highest generation."""
    grants = world.put(1)
    data = world.ledger.checkpoint("j", now=world.now)
    seen = (7 << 32) | 12  # issued by a later incarnation of the rolled-back controller
    fresh = Ledger()
    fresh.restore(
        data, job_id="j", epoch=2, config=_config(world), now=world.now, available=_held(world, grants),
        min_token=seen,
    )  # fmt: skip
    lease = fresh.acquire("j", "t", max_groups=1, now=world.now)
    assert lease is not None
    assert lease.token > seen
    with pytest.raises(InvalidRequestError):
        Ledger().restore(data, job_id="j", epoch=2, config=_config(world), now=world.now, min_token=-1)


def test_restore_purges_and_counts_what_the_checkpoint_does_not_know(world):
    """Regression (issue 14, item 3): groups acknowledged READY after the checkpoint (and a group put but
    never published) had no ledger state after the restore, while their data stayed on the servers and
    their capacity never came back. They are purged through the GC list and counted."""
    before = world.put(2)
    data = world.ledger.checkpoint("j", now=world.now)
    after = world.put(3, nbytes=700)  # acknowledged READY after the checkpoint
    unpublished = world.ledger.allocate("j", 1, "w0", nbytes=300, now=world.now)  # put, never published
    held = [*_held(world, [*before, *after]), HeldGroup(unpublished.partition, "s0", 250)]
    fresh = Ledger()
    counts = fresh.restore(data, job_id="j", epoch=2, config=_config(world), now=world.now, available=held)
    assert (counts["READY"], counts["purged"], counts["DROPPED"], counts["lost"]) == (2, 4, 4, 0)
    assert fresh.usage("j") == (2 * 1000 + 3 * 700 + 250, 6)  # counted until the deletes are confirmed
    work = fresh.take_deletes(now=world.now)
    assert {w.partition for w in work} == {g.partition for g in after} | {unpublished.partition}
    assert all(w.token > world.ledger.last_token for w in work)  # the server takes the delete
    for w in work:
        fresh.delete_done(w.partition, ok=True, now=world.now)
    assert fresh.usage("j") == (2000, 2)
    assert fresh.counts("j")["purged"] == 4
    lease = fresh.acquire("j", "t", max_groups=10, now=world.now)
    assert lease is not None
    assert set(lease.partitions) == {g.partition for g in before}


def test_a_group_granted_at_the_checkpoint_and_put_afterwards_is_purged(world):
    world.put(1)
    grant = world.ledger.allocate("j", 1, "w0", nbytes=300, now=world.now)
    data = world.ledger.checkpoint("j", now=world.now)
    held = [*_held(world, world.grants), HeldGroup(grant.partition, "s0", 300)]
    counts = Ledger().restore(data, job_id="j", epoch=2, config=_config(world), now=world.now, available=held)
    assert (counts["READY"], counts["purged"], counts["DROPPED"]) == (1, 1, 1)


def test_what_cannot_be_offered_again_is_reported_lost_with_its_partition(world):
    """A restore from an older checkpoint: groups READY at it were committed and deleted after a later
    checkpoint was confirmed. They are not offered (their data is gone) and not silently dropped: each is
    recorded lost, in the counts, the query, and the checkpoints and snapshots that follow."""
    grants = world.put(4)
    old = world.ledger.checkpoint("j", now=world.now)
    world.train(world.lease(2))
    newer = world.ledger.checkpoint("j", now=world.now)
    world.ledger.confirm_checkpoint("j", checkpoint_seq(newer), now=world.now)
    gone = sorted(_deleted(world))
    fresh = Ledger()
    counts = fresh.restore(
        old, job_id="j", epoch=2, config=_config(world), now=world.now, available=_held(world, grants[2:])
    )
    assert (counts["READY"], counts["lost"], counts["DROPPED"]) == (2, 2, 2)
    lost = fresh.lost("j")
    assert sorted(x.partition for x in lost) == gone
    assert all(isinstance(x, LostGroup) and "absent from every storage server" in x.reason for x in lost)
    lease = fresh.acquire("j", "t", max_groups=10, now=world.now)
    assert lease is not None
    assert set(lease.partitions) == {g.partition for g in grants[2:]}
    fresh.release(lease.token, now=world.now)
    assert Ledger.from_snapshot(fresh.snapshot()).lost("j") == lost
    again = Ledger().restore(
        fresh.checkpoint("j", now=world.now),
        job_id="j",
        epoch=3,
        config=_config(world),
        now=world.now,
        available=_held(world, grants[2:]),
    )
    assert again["lost"] == 2  # carried in the checkpoint


def test_restore_refuses_holdings_it_cannot_act_on_and_changes_nothing(world):
    grants = world.put(1)
    data = world.ledger.checkpoint("j", now=world.now)
    ledger = Ledger()
    kwargs = {"job_id": "j", "epoch": 2, "config": _config(world), "now": world.now}
    with pytest.raises(InvalidRequestError, match="not registered"):
        ledger.restore(data, **kwargs, available=[HeldGroup(grants[0].partition, "elsewhere", 10)])
    with pytest.raises(InvalidRequestError, match="another job"):
        ledger.restore(data, **kwargs, available=[("k", 1, 0)])
    with pytest.raises(StaleFenceError, match="epoch 2"):
        ledger.restore(data, **kwargs, available=[HeldGroup(("j", 2, 0), "s0", 10)])
    with pytest.raises(NotFoundError):  # nothing was installed
        ledger.counts("j")


def test_a_checkpoint_of_the_previous_layout_still_restores(world):
    """Checkpoints written before kept commits and lost records existed lack those fields."""
    world.put(2)
    payload = decode(world.ledger.checkpoint("j", now=world.now), KIND_JOB)
    for field in ("checkpoints", "durable", "kept", "lost", "purged"):
        del payload[field]
    counts = Ledger().restore(
        encode(KIND_JOB, payload), job_id="j", epoch=2, config=_config(world), now=world.now
    )
    assert (counts["READY"], counts["lost"], counts["kept"]) == (2, 0, 0)


def test_a_restored_job_keeps_its_commits_until_its_next_checkpoint(world):
    world.put(2)
    data = world.ledger.checkpoint("j", now=world.now)
    fresh = Ledger()
    fresh.restore(data, job_id="j", epoch=2, config=_config(world), now=world.now)
    lease = fresh.acquire("j", "t", max_groups=1, now=world.now)
    for step in ("prepare", "start_training", "finish_training", "commit"):
        getattr(fresh, step)(lease.token, "b", now=world.now)
    assert fresh.counts("j")["kept"] == 1  # a second restore from the same checkpoint must find it
    assert fresh.group(lease.partitions[0]).state is GroupState.COMMITTED
    newer = fresh.checkpoint("j", now=world.now)
    assert checkpoint_seq(newer) == checkpoint_seq(data) + 1
    fresh.confirm_checkpoint("j", checkpoint_seq(newer), now=world.now)
    assert [w.partition for w in fresh.take_deletes(now=world.now)] == list(lease.partitions)


def test_restore_without_listing_trusts_the_checkpoint(world):
    world.put(2)
    data = world.ledger.checkpoint("j", now=world.now)
    config = JobConfig(**_config(world).to_mapping())
    counts = Ledger().restore(data, job_id="j", epoch=2, config=config, now=world.now)
    assert (counts["READY"], counts["lost"], counts["purged"]) == (2, 0, 0)
