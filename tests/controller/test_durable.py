"""The hosts' shared core: journal, compaction into snapshots, and recovery."""

from __future__ import annotations

import pytest

from trajflight.controller import GroupState, Publication, write_checkpoint
from trajflight.controller._durable import HostCore
from trajflight.errors import CheckpointError, InvalidRequestError, StaleFenceError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _journal(state_dir):
    (path,) = state_dir.glob("journal-*.log")
    return path


def _open(core: HostCore) -> None:
    core.apply("register_server", {"server_id": "s", "node": "n", "location": "grpc://x",
                                   "capacity_bytes": 10**6, "capacity_groups": 100})  # fmt: skip
    core.apply("open_job", {"job_id": "j", "epoch": 1, "config": None})
    core.apply("register_writer", {"job_id": "j", "epoch": 1, "writer_id": "w", "node": "n"})


def _put(core: HostCore, n: int) -> None:
    for _ in range(n):
        g = core.apply("allocate", {"job_id": "j", "epoch": 1, "writer_id": "w", "nbytes": 10})
        publish = {"partition": g.partition, "token": g.token, "rows": 1, "nbytes": 10, "tokens": 1}
        core.apply("publish", {**publish, "policy_version": 0, "columns": ()})


def test_compaction_keeps_state_across_restarts(tmp_path):
    clock = Clock()
    core = HostCore(clock=clock, state_dir=tmp_path, compact_every=3)
    _open(core)
    _put(core, 5)
    lease = core.apply("acquire", {"job_id": "j", "owner": "t", "max_groups": 2})
    core.apply("prepare", {"token": lease.token, "batch_id": "b"})
    core.apply("start_training", {"token": lease.token, "batch_id": "b"})
    core.close()
    again = HostCore(clock=clock, state_dir=tmp_path, compact_every=3)
    counts = again.ledger.counts("j")
    assert counts["READY"] == 3
    assert counts["UNKNOWN"] == 2
    assert again.incarnation == core.incarnation + 1
    assert _journal(tmp_path).stat().st_size == 0  # recovery compacts
    again.close()
    third = HostCore(clock=clock, state_dir=tmp_path)
    assert third.ledger.counts("j") == counts
    assert third.incarnation == again.incarnation + 1
    third.close()


def test_refused_calls_and_empty_acquires_are_not_journaled(tmp_path):
    core = HostCore(clock=Clock(), state_dir=tmp_path)
    _open(core)
    size = _journal(tmp_path).stat().st_size
    assert core.apply("acquire", {"job_id": "j", "owner": "t", "max_groups": 2}) is None
    with pytest.raises(InvalidRequestError):
        core.apply("allocate", {"job_id": "j", "epoch": 1, "writer_id": "w", "nbytes": 0})
    with pytest.raises(InvalidRequestError):
        core.apply("allocate", {"job_id": "j", "unknown_argument": 1})
    assert _journal(tmp_path).stat().st_size == size
    core.close()


def test_corrupt_snapshot_refuses_to_start(tmp_path):
    core = HostCore(clock=Clock(), state_dir=tmp_path)
    _open(core)
    core.close()
    (snap,) = tmp_path.glob("snapshot-*.ckpt")
    snap.write_bytes(snap.read_bytes()[:-5])
    with pytest.raises(CheckpointError, match="truncated"):
        HostCore(clock=Clock(), state_dir=tmp_path)


def test_memory_only_core_has_no_files(tmp_path):
    core = HostCore(clock=Clock())
    _open(core)
    _put(core, 1)
    assert core.ledger.groups_in("j", GroupState.READY)
    assert list(tmp_path.iterdir()) == []


def test_crash_during_compaction_never_replays_a_journal_twice(tmp_path):
    """Regression: a snapshot written before the old journal was removed must not get it replayed again."""
    clock = Clock()
    core = HostCore(clock=clock, state_dir=tmp_path)
    _open(core)
    _put(core, 3)
    (snap,) = tmp_path.glob("snapshot-*.ckpt")
    seq = int(snap.stem.split("-")[1])
    write_checkpoint(tmp_path / f"snapshot-{seq + 1}.ckpt", core.ledger.snapshot())  # crash right here
    core.close()
    again = HostCore(clock=clock, state_dir=tmp_path)
    assert again.ledger.counts("j")["READY"] == 3
    assert again.ledger.usage("j") == (30, 3)
    again.close()


def test_batched_allocation_is_journaled_and_replayed_after_a_crash(tmp_path):
    """A partial batch (capacity ran out after some groups) replays to the same grants and reservations."""
    clock = Clock()
    core = HostCore(clock=clock, state_dir=tmp_path)
    core.apply("register_server", {"server_id": "s", "node": "n", "location": "grpc://x",
                                   "capacity_bytes": 10**6, "capacity_groups": 3})  # fmt: skip
    core.apply("open_job", {"job_id": "j", "epoch": 1, "config": None})
    core.apply("register_writer", {"job_id": "j", "epoch": 1, "writer_id": "w", "node": "n"})
    size = _journal(tmp_path).stat().st_size
    with pytest.raises(InvalidRequestError):  # refused: not journaled
        core.apply("allocate_many", {"job_id": "j", "epoch": 1, "writer_id": "w", "nbytes": []})
    assert _journal(tmp_path).stat().st_size == size
    kwargs = {"job_id": "j", "epoch": 1, "writer_id": "w", "nbytes": [10, 20, 30, 40]}
    grants = core.apply("allocate_many", kwargs)
    assert [g.nbytes for g in grants] == [10, 20, 30]  # the server holds 3 groups
    first = grants[0]
    publish = {"partition": first.partition, "token": first.token, "rows": 1, "nbytes": 10, "tokens": 1}
    core.apply("publish", {**publish, "policy_version": 0, "columns": ()})
    core.close()  # the process dies: the next start replays the journal

    again = HostCore(clock=clock, state_dir=tmp_path)
    assert again.ledger.usage("j") == (60, 3)
    assert [again.ledger.group(g.partition).state for g in grants] == [
        GroupState.READY,
        GroupState.ALLOCATED,
        GroupState.ALLOCATED,
    ]
    assert [again.ledger.group(g.partition).generation for g in grants] == [g.token for g in grants]
    again.close()


def test_batched_publication_is_journaled_and_replayed_after_a_crash(tmp_path):
    """A refused batch publishes nothing and is not journaled; an accepted one replays to the same groups."""
    clock = Clock()
    core = HostCore(clock=clock, state_dir=tmp_path)
    _open(core)
    grants = core.apply(
        "allocate_many", {"job_id": "j", "epoch": 1, "writer_id": "w", "nbytes": [10, 20, 30]}
    )
    items = [Publication(g.partition, g.token, 1, g.nbytes - 1, 5, 0, ("a",)) for g in grants]
    size = _journal(tmp_path).stat().st_size
    wrong = Publication(grants[2].partition, grants[2].token + 1, 1, 1, 5, 0, ("a",))
    with pytest.raises(StaleFenceError):  # refused: nothing published, nothing journaled
        core.apply("publish_many", {"items": [*items[:2], wrong]})
    assert _journal(tmp_path).stat().st_size == size
    assert core.ledger.counts("j")["READY"] == 0
    infos = core.apply("publish_many", {"items": items[:2]})
    core.close()  # the process dies: the next start replays the journal

    again = HostCore(clock=clock, state_dir=tmp_path)
    assert [again.ledger.group(g.partition) for g in grants[:2]] == infos
    assert again.ledger.group(grants[2].partition).state is GroupState.ALLOCATED
    assert again.ledger.usage("j") == (9 + 19 + 30, 3)  # the unused reservations stay given back
    assert again.apply("publish_many", {"items": items})[:2] == infos  # a retry after the crash is answered
    again.close()
