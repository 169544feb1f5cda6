"""Job checkpoints and ledger snapshots: round trip, refusals, and atomic files."""

from __future__ import annotations

import hashlib
import json

import pytest

from trajflight.controller import GroupState, Ledger, read_checkpoint, write_checkpoint
from trajflight.controller._checkpoint import KIND_JOB, MAGIC, decode, encode
from trajflight.errors import (
    AlreadyExistsError,
    CheckpointError,
    ConfigError,
    InvalidStateError,
    NotFoundError,
    StaleFenceError,
)


def _config(world):
    return world.ledger._jobs["j"].config


def _busy_world(world):
    """READY, UNKNOWN, committed-not-deleted and unpublished groups, and an announced policy."""
    world.put(4)
    world.ledger.announce_policy("j", 2, now=world.now)
    world.train(world.lease(1))  # committed, on the GC list
    lease = world.lease(1)  # will be UNKNOWN
    world.ledger.prepare(lease.token, "b", now=world.now)
    world.ledger.start_training(lease.token, "b", now=world.now)
    world.clock.advance(10.0)
    world.ledger.tick(world.now)
    grant = world.ledger.allocate("j", 1, "w0", nbytes=500, now=world.now)  # never published
    return lease, grant


def test_round_trip_reoffers_ready_groups_with_larger_tokens(world):
    lease, grant = _busy_world(world)
    data = world.ledger.checkpoint("j", now=world.now)
    fresh = Ledger()
    counts = fresh.restore(data, job_id="j", epoch=2, config=_config(world), now=world.now + 1)
    assert counts["READY"] == 2
    assert counts["UNKNOWN"] == 1
    assert counts["COMMITTED"] == 1
    assert counts["DROPPED"] == 1  # the unpublished grant of the old epoch is abandoned
    assert counts["committed_total"] == 1
    assert fresh.policy_status("j").version == 2
    assert fresh.usage("j") == world.ledger.usage("j")
    new = fresh.acquire("j", "t", max_groups=10, now=world.now + 1)
    assert new is not None
    assert len(new.groups) == 2
    assert new.token > world.ledger.last_token
    assert fresh.group(lease.partitions[0]).state is GroupState.UNKNOWN
    assert {w.partition for w in fresh.gc_list("j")} == {w.partition for w in world.ledger.gc_list("j")} | {
        grant.partition
    }
    with pytest.raises(StaleFenceError):  # the old epoch's writers are fenced
        fresh.allocate("j", 1, "w0", nbytes=10, now=world.now + 1)


def test_restore_can_drop_old_ready_groups(world):
    world.put(3)
    data = world.ledger.checkpoint("j", now=world.now)
    fresh = Ledger()
    counts = fresh.restore(data, job_id="j", epoch=5, config=_config(world), now=world.now, old_ready="drop")
    assert counts["READY"] == 0
    assert counts["DROPPED"] == 3
    assert fresh.acquire("j", "t", max_groups=10, now=world.now) is None
    assert len(fresh.take_deletes(now=world.now)) == 3


def test_restore_drops_ready_groups_whose_data_is_gone(world):
    """A group READY at the checkpoint whose data the storage servers no longer hold (deleted after a later
    checkpoint covered its commit, or its server lost it) must not be offered again: restore drops it and
    records it lost (issue 14: never silently dropped)."""
    metas = world.put(3)
    data = world.ledger.checkpoint("j", now=world.now)
    gone = metas[0].partition
    still_there = [m.partition for m in metas[1:]]
    fresh = Ledger()
    counts = fresh.restore(
        data, job_id="j", epoch=2, config=_config(world), now=world.now, available=still_there
    )
    assert counts["READY"] == 2
    assert counts["DROPPED"] == 1
    assert counts["lost"] == 1
    assert [x.partition for x in fresh.lost("j")] == [gone]
    lease = fresh.acquire("j", "t", max_groups=10, now=world.now)
    assert lease is not None
    assert set(lease.partitions) == set(still_there)
    assert [w.partition for w in fresh.take_deletes(now=world.now)] == [gone]  # a delete of nothing is done


def test_checkpoint_refused_while_a_group_is_leased_to_trained(world):
    world.put(1)
    lease = world.lease(1)
    with pytest.raises(InvalidStateError, match=r"LEASED\.\.TRAINED"):
        world.ledger.checkpoint("j", now=world.now)
    world.train(lease)
    world.ledger.checkpoint("j", now=world.now)


@pytest.mark.parametrize("epoch", [0, 1])
def test_restore_with_equal_or_smaller_epoch_refused(world, epoch):
    world.put(1)
    data = world.ledger.checkpoint("j", now=world.now)
    with pytest.raises(StaleFenceError):
        Ledger().restore(data, job_id="j", epoch=epoch, config=_config(world), now=world.now)


def test_restore_with_other_config_names_the_setting(world):
    data = world.ledger.checkpoint("j", now=world.now)
    other = {**_config(world).to_mapping(), "default_lease_ttl": 20.0}
    with pytest.raises(ConfigError) as err:
        Ledger().restore(data, job_id="j", epoch=2, config=other, now=world.now)
    assert err.value.setting == "default_lease_ttl"


def test_restore_of_other_job_or_into_a_ledger_with_the_job_refused(world):
    data = world.ledger.checkpoint("j", now=world.now)
    with pytest.raises(CheckpointError, match="of job 'j'"):
        Ledger().restore(data, job_id="k", epoch=2, config=_config(world), now=world.now)
    with pytest.raises(AlreadyExistsError):
        world.ledger.restore(data, job_id="j", epoch=2, config=_config(world), now=world.now)


@pytest.mark.parametrize("cut", [0, 5, len(MAGIC) + 3, -1, -100])
def test_truncated_checkpoint_refused(world, cut):
    world.put(3)
    data = world.ledger.checkpoint("j", now=world.now)
    with pytest.raises(CheckpointError, match=r"truncated|magic"):
        Ledger().restore(data[:cut], job_id="j", epoch=2, config=_config(world), now=world.now)


def test_corrupted_checkpoint_refused(world):
    world.put(3)
    data = bytearray(world.ledger.checkpoint("j", now=world.now))
    data[-10] ^= 0x01
    with pytest.raises(CheckpointError, match="checksum"):
        Ledger().restore(bytes(data), job_id="j", epoch=2, config=_config(world), now=world.now)
    with pytest.raises(CheckpointError, match="magic"):
        Ledger().restore(b"garbage" + bytes(data), job_id="j", epoch=2, config=_config(world), now=world.now)
    with pytest.raises(CheckpointError, match="trailing"):
        Ledger().restore(bytes(data) + b"x", job_id="j", epoch=2, config=_config(world), now=world.now)


def _reframe(data: bytes, fmt: int) -> bytes:
    payload = decode(data, KIND_JOB)
    body = json.dumps(payload).encode()
    header = {
        "format": fmt,
        "kind": KIND_JOB,
        "length": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
    }
    return MAGIC + json.dumps(header).encode() + b"\n" + body


@pytest.mark.parametrize(("fmt", "word"), [(0, "older"), (99, "newer")])
def test_other_format_version_refused(world, fmt, word):
    data = _reframe(world.ledger.checkpoint("j", now=world.now), fmt)
    with pytest.raises(CheckpointError, match=word) as err:
        Ledger().restore(data, job_id="j", epoch=2, config=_config(world), now=world.now)
    assert err.value.format == fmt


def test_snapshot_is_not_a_job_checkpoint(world):
    with pytest.raises(CheckpointError, match="not a 'job-checkpoint'"):
        Ledger().restore(world.ledger.snapshot(), job_id="j", epoch=2, config=_config(world), now=world.now)


def test_malformed_payload_refused():
    data = encode(KIND_JOB, {"job_id": "j", "config": {}, "epoch": 1})
    ledger = Ledger()
    with pytest.raises(CheckpointError, match="malformed"):
        ledger.restore(data, job_id="j", epoch=2, config=None, now=0.0)
    with pytest.raises(NotFoundError):  # nothing was installed
        ledger.counts("j")


def test_atomic_file_round_trip(world, tmp_path):
    world.put(2)
    path = tmp_path / "job.ckpt"
    write_checkpoint(path, world.ledger.checkpoint("j", now=world.now))
    write_checkpoint(path, world.ledger.checkpoint("j", now=world.now))  # replaces atomically
    assert [p.name for p in tmp_path.iterdir()] == ["job.ckpt"]  # no temp file left behind
    counts = Ledger().restore(
        read_checkpoint(path), job_id="j", epoch=2, config=_config(world), now=world.now
    )
    assert counts["READY"] == 2
    with pytest.raises(NotFoundError):
        read_checkpoint(tmp_path / "missing.ckpt")
    with pytest.raises(CheckpointError, match="could not write"):
        write_checkpoint(tmp_path / "no" / "such" / "dir.ckpt", b"x")


def test_snapshot_round_trip_keeps_leases_and_then_recover_ends_them(world):
    world.put(3)
    a = world.lease(1)
    b = world.lease(1)
    world.ledger.prepare(b.token, "b", now=world.now)
    world.ledger.start_training(b.token, "b", now=world.now)
    copy = Ledger.from_snapshot(world.ledger.snapshot())
    assert copy.counts("j") == world.ledger.counts("j")
    assert copy.usage("j") == world.ledger.usage("j")
    copy.renew(a.token, now=world.now)  # the lease is live in the copy
    assert copy.recover(copy.incarnation + 1, now=world.now) == 2
    assert copy.group(a.partitions[0]).state is GroupState.READY
    assert copy.group(b.partitions[0]).state is GroupState.UNKNOWN
    again = copy.acquire("j", "t", max_groups=5, now=world.now)
    assert again is not None
    assert again.token > b.token
    with pytest.raises(StaleFenceError):  # the lease ended at the restart, and the group was re-granted
        copy.release(a.token, partitions=a.partitions, now=world.now)
