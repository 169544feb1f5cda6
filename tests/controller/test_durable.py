"""The hosts' shared core: journal, compaction into snapshots, and recovery."""

from __future__ import annotations

import pytest

from trajflight.controller import GroupState, LocalController, Publication, write_checkpoint
from trajflight.controller._commands import parse
from trajflight.controller._durable import HostCore
from trajflight.controller._journal import RECORD as _RECORD
from trajflight.controller._journal import encode
from trajflight.errors import (
    CheckpointError,
    InvalidRequestError,
    NotFoundError,
    RecoveryError,
    StaleFenceError,
    error_class_for_code,
)


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


def _append_record(path, method, kwargs, now):
    """Append a well-formed journal record (valid length and checksum), as a tamperer or a bug would."""
    with open(path, "ab") as f:
        f.write(encode(parse(method, kwargs), now))


def test_a_journal_record_that_fails_on_replay_refuses_to_start(tmp_path):
    """Regression (issue 14, item 12): replay ran each record under ``contextlib.suppress(Exception)``, so
    a record that failed on replay (the ledger diverged from what happened) was silently skipped and the
    host ran on the diverged ledger. Only calls that succeeded are journaled: the start must fail, loud
    and typed, naming the journal, the record, the operation and the original error."""
    clock = Clock()
    core = HostCore(clock=clock, state_dir=tmp_path)
    _open(core)
    _put(core, 2)
    core.close()
    journal = _journal(tmp_path)
    _append_record(journal, "commit", {"token": 1 << 50, "batch_id": "never"}, clock.now)
    with pytest.raises(RecoveryError) as err:
        HostCore(clock=clock, state_dir=tmp_path)
    assert err.value.path == str(journal)
    assert err.value.record == 8  # after register_server, open_job, register_writer, 2 x (allocate, publish)
    assert err.value.method == "commit"
    assert "NotFoundError" in str(err.value)
    assert str(1 << 50) in str(err.value)
    assert isinstance(err.value, CheckpointError)
    assert isinstance(err.value.__cause__, NotFoundError)
    assert error_class_for_code(RecoveryError.code) is RecoveryError


def test_a_corrupt_record_before_the_last_refuses_to_start_but_a_torn_tail_is_ignored(tmp_path):
    """A checksum mismatch in the middle is corruption (refused); at the very end it is a torn write of a
    call that never returned (ignored, as before)."""
    clock = Clock()
    core = HostCore(clock=clock, state_dir=tmp_path)
    _open(core)
    _put(core, 2)
    core.close()
    journal = _journal(tmp_path)
    good = journal.read_bytes()
    journal.write_bytes(good[:-3])  # the last publish torn mid-write
    again = HostCore(clock=clock, state_dir=tmp_path)
    assert again.ledger.counts("j")["READY"] == 1
    assert again.ledger.counts("j")["ALLOCATED"] == 1
    again.close()

    core = HostCore(clock=clock, state_dir=tmp_path)
    _put(core, 1)
    core.close()
    journal = _journal(tmp_path)
    data = bytearray(journal.read_bytes())
    data[_RECORD.size + 2] ^= 0xFF  # inside the first record's body; two valid records follow it
    journal.write_bytes(bytes(data))
    with pytest.raises(RecoveryError, match=r"record 1 cannot be replayed: its checksum"):
        HostCore(clock=clock, state_dir=tmp_path)
    tail = bytearray(journal.read_bytes())
    tail[_RECORD.size + 2] ^= 0xFF  # repaired ...
    tail[-2] ^= 0xFF  # ... and the last record's body damaged instead: a torn tail, ignored
    journal.write_bytes(bytes(tail))
    third = HostCore(clock=clock, state_dir=tmp_path)
    assert third.ledger.counts("j")["READY"] == 1  # the new group's publish was the torn record
    assert third.ledger.counts("j")["ALLOCATED"] == 2
    third.close()


def test_a_local_controller_does_not_start_on_a_diverged_journal(tmp_path):
    clock = Clock()
    core = HostCore(clock=clock, state_dir=tmp_path)
    _open(core)
    core.close()
    _append_record(_journal(tmp_path), "publish", {"partition": ("j", 1, 7), "token": 1, "rows": 1,
                   "nbytes": 1, "tokens": 1, "policy_version": 0, "columns": ()}, clock.now)  # fmt: skip
    with pytest.raises(RecoveryError, match=r"\(publish\) cannot be replayed"):
        LocalController(clock=clock, state_dir=tmp_path, start=False)


def test_the_journal_records_commands_as_versioned_json_not_pickle(tmp_path):
    """Regression (issue 15): the journal pickled ``(method, kwargs, now)``, so reading a state directory
    could run code. Each record is now length, CRC-32 and a JSON body naming the operation, its tagged
    arguments and ``now``, under a version."""
    import json

    clock = Clock()
    core = HostCore(clock=clock, state_dir=tmp_path)
    _open(core)
    _put(core, 1)
    core.close()
    data = _journal(tmp_path).read_bytes()
    bodies, pos = [], 0
    while pos < len(data):
        length, _ = _RECORD.unpack_from(data, pos)
        bodies.append(json.loads(data[pos + _RECORD.size : pos + _RECORD.size + length]))
        pos += _RECORD.size + length
    assert [b["op"] for b in bodies] == [
        "register_server",
        "open_job",
        "register_writer",
        "allocate",
        "publish",
    ]
    assert {b["v"] for b in bodies} == {1}
    assert bodies[-1]["args"]["partition"] == {"$t": "Partition", "v": ["j", 1, 0]}
    assert bodies[-1]["now"] == clock.now


def test_a_journal_of_the_old_pickle_format_is_refused_with_a_way_out(tmp_path):
    """Regression (issue 15): a journal written by an older trajflight (pickled records, which it replayed
    by unpickling them) must not be unpickled; the start fails naming the file and saying how to recover,
    and leaves the files alone."""
    import pickle
    import zlib

    clock = Clock()
    HostCore(clock=clock, state_dir=tmp_path).close()
    journal = _journal(tmp_path)
    old = [
        ("register_server", {"server_id": "s", "node": "n", "location": "grpc://x", "capacity_bytes": 10**6,
                             "capacity_groups": 100}),
        ("open_job", {"job_id": "j", "epoch": 1, "config": None}),
    ]  # fmt: skip
    with open(journal, "wb") as f:
        for method, kwargs in old:
            body = pickle.dumps((method, kwargs, clock.now), protocol=pickle.HIGHEST_PROTOCOL)
            f.write(_RECORD.pack(len(body), zlib.crc32(body)) + body)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(RecoveryError, match="older trajflight") as err:
        HostCore(clock=clock, state_dir=tmp_path)
    assert err.value.path == str(journal)
    assert "restore the jobs from their checkpoints" in str(err.value)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "does not decode"),
        (b'{"v": 1, "op": "announce_policy", "args": {}, "now": 1}', r"\(announce_policy\) cannot be"),
        (b'{"v": 1, "op": "counts", "args": {"job_id": "j"}, "now": 1}', "names no journaled operation"),
        (b'{"v": 2, "op": "announce_policy", "args": {}, "now": 1}', "version 2"),
        (b'{"v": 1, "op": "announce_policy", "args": {"job_id": {"$d": "Nope", "v": {}}}, "now": 1}',
         "does not decode"),
    ],
)  # fmt: skip
def test_a_journal_record_that_does_not_read_back_refuses_to_start(tmp_path, body, message):
    import zlib

    core = HostCore(clock=Clock(), state_dir=tmp_path)
    _open(core)
    core.close()
    with open(_journal(tmp_path), "ab") as f:
        f.write(_RECORD.pack(len(body), zlib.crc32(body)) + body)
    with pytest.raises(RecoveryError, match=message) as err:
        HostCore(clock=Clock(), state_dir=tmp_path)
    assert err.value.record == 4


def test_a_command_the_journal_cannot_record_is_refused_before_it_runs(tmp_path):
    core = HostCore(clock=Clock(), state_dir=tmp_path)
    _open(core)
    size = _journal(tmp_path).stat().st_size
    with pytest.raises(InvalidRequestError, match="cannot send a object"):
        core.apply("announce_policy", {"job_id": "j", "version": object()})
    with pytest.raises(InvalidRequestError, match="not a finite number"):
        core.apply("renew", {"token": 1, "ttl": float("nan")})
    assert _journal(tmp_path).stat().st_size == size
    assert core.ledger.policy_status("j").version == 0
    core.close()
