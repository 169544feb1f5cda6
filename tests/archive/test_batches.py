"""How the archive batches: many groups per file, cut by count and size, flushed on a timer; dropped
groups are deleted without archiving. Driven with a fake clock and fake servers, no data plane."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trajflight._archive import Archive
from trajflight.controller import DeleteWork
from trajflight.keys import Partition

from .conftest import encoded


@dataclass
class FakeServers:
    """Groups of job ``j`` epoch 1 on one location; records reads and deletes."""

    job: str = "j"
    deleted: list[int] = field(default_factory=list)
    reads: int = 0
    refused: set[int] = field(default_factory=set)  # groups whose deletes are refused (a stale token)
    delete_calls: int = 0

    def read(self, location: str, keys: list[Partition]) -> pa.Table:
        self.reads += 1
        return pa.Table.from_batches([encoded(k.job_id, k.epoch, k.group_id) for k in keys])

    def delete_groups(self, work: Sequence[DeleteWork]) -> list[tuple[DeleteWork, bool, str | None]]:
        self.delete_calls += 1
        refused = [w.partition.group_id in self.refused for w in work]
        self.deleted.extend(w.partition.group_id for w, no in zip(work, refused, strict=True) if not no)
        return [
            (w, not no, "StaleFenceError: refused" if no else None)
            for w, no in zip(work, refused, strict=True)
        ]


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def _work(group: int, reason: str = "committed") -> DeleteWork:
    facts: dict[str, Any] = {}
    if reason == "committed":
        facts = {"committed_at": 1.5, "trained_by": "t", "trained_version": 2}
    return DeleteWork(Partition("j", 1, group), "s0", "grpc://s0", 1, 1, None, reason, **facts)


def _files(root: Any) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".parquet"))


def test_groups_wait_for_the_timer_then_share_one_file(tmp_path):
    """A slow job's committed groups are not held forever: after ``flush_after`` they are written, all
    in one file, and only then deleted; a dropped group is deleted at once and never archived."""
    servers, clock = FakeServers(), Clock()
    archive = Archive(
        tmp_path, read=servers.read, delete_groups=servers.delete_groups, flush_after=5.0, clock=clock
    )
    assert archive([_work(0), _work(1), _work(9, "dropped")]) == [(_work(9, "dropped"), True, None)]
    assert (archive.pending, servers.deleted, _files(tmp_path)) == (2, [9], [])
    clock.now += 4.9
    assert archive([]) == []
    clock.now += 0.1
    out = archive([])
    assert sorted(w.partition.group_id for w, ok, _ in out if ok) == [0, 1]
    (path,) = _files(tmp_path)
    assert pq.read_table(path).column("group_id").to_pylist() == [0, 0, 0, 1, 1, 1]
    assert sorted(servers.deleted) == [0, 1, 9]
    assert os.listdir(tmp_path / "_manifests") == []


def test_files_are_cut_by_group_count_and_by_size(tmp_path):
    """``max_groups`` waiting groups are written at once, in files of at most ``max_groups``; a file
    also ends before the group that would take it past ``max_bytes``."""
    servers = FakeServers()
    archive = Archive(
        tmp_path, read=servers.read, delete_groups=servers.delete_groups, max_groups=3, clock=Clock()
    )
    out = archive([_work(g) for g in range(7)])
    assert len(out) == 7
    assert sorted(pq.read_metadata(f).num_rows for f in _files(tmp_path)) == [3, 9, 9]
    sizes = {g: encoded("j", 1, g).nbytes for g in range(6)}
    limit = sum(sizes.values()) // 3
    small = Archive(
        tmp_path / "small",
        read=servers.read,
        delete_groups=servers.delete_groups,
        max_groups=6,
        max_bytes=limit,
    )
    assert len(small([_work(g) for g in range(6)])) == 6
    files = [pq.read_table(f).column("group_id").to_pylist() for f in _files(tmp_path / "small")]
    assert len(files) >= 3
    assert sorted(g for f in files for g in set(f)) == list(range(6))  # every group in one file
    for groups in files:
        ids = sorted(set(groups))
        assert len(ids) == 1 or sum(sizes[g] for g in ids) <= limit, (ids, limit)


def test_dropped_groups_are_archived_marked_only_when_asked(tmp_path):
    """With ``archive_dropped`` a dropped group (an UNKNOWN group an operator dropped, say) is archived
    with ``outcome = "dropped"`` and null lease facts, beside the committed ones."""
    servers = FakeServers()
    archive = Archive(
        tmp_path,
        read=servers.read,
        delete_groups=servers.delete_groups,
        archive_dropped=True,
        flush_after=0.0,
    )
    out = archive([_work(0), _work(1, "dropped")])
    assert sorted(w.partition.group_id for w, ok, _ in out if ok) == [0, 1]
    (path,) = _files(tmp_path)
    rows = pq.read_table(path, columns=["group_id", "outcome", "trained_by"]).to_pylist()
    assert {(r["group_id"], r["outcome"], r["trained_by"]) for r in rows} == {
        (0, "committed", "t"),
        (1, "dropped", None),
    }


def test_a_file_is_deleted_in_one_call_and_a_refused_group_alone_is_retried(tmp_path):
    """Issue 17: a durable file's groups are deleted in one batched call; a group whose delete is
    refused (a stale token) is reported failed on its own, the others confirmed, and its retry only
    deletes it: no second file, and the manifest goes once the last member is deleted."""
    servers = FakeServers(refused={2})
    archive = Archive(
        tmp_path, read=servers.read, delete_groups=servers.delete_groups, max_groups=4, clock=Clock()
    )
    out = archive([_work(g) for g in range(4)])
    assert sorted((w.partition.group_id, ok) for w, ok, _ in out) == [
        (0, True),
        (1, True),
        (2, False),
        (3, True),
    ]
    assert servers.delete_calls == 1
    assert len(os.listdir(tmp_path / "_manifests")) == 1  # kept: one member is not deleted yet
    servers.refused.clear()
    again = archive([_work(2)]) + archive.flush()  # handed out again after the GC list's back-off
    assert again == [(_work(2), True, None)]
    assert sorted(servers.deleted) == [0, 1, 2, 3]
    assert len(_files(tmp_path)) == 1
    assert archive.status()["rewrites"] == 0
    assert os.listdir(tmp_path / "_manifests") == []


def test_the_archive_files_read_the_same_in_duckdb_and_polars(tmp_path):
    """Issue 17: the archive's cheaper Parquet options (byte-stream-split token ids, a lower zstd level
    for log-probabilities, statistics on scalar columns only) stay readable by the analytics tools:
    DuckDB and Polars see every row and the same token lists and log-probabilities as pyarrow."""
    duckdb = pytest.importorskip("duckdb")
    pl = pytest.importorskip("polars")
    servers = FakeServers()
    archive = Archive(tmp_path, read=servers.read, delete_groups=servers.delete_groups, max_groups=4)
    archive([_work(g) for g in range(4)])
    (path,) = _files(tmp_path)
    meta = pq.read_metadata(path).row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    assert "BYTE_STREAM_SPLIT" in encodings["response_ids.list.element"]
    want = pq.read_table(path, columns=["group_id", "response_ids", "response_logprobs"])
    rows = duckdb.sql(
        f"SELECT group_id, response_ids, response_logprobs FROM read_parquet('{path}') ORDER BY group_id"
    ).fetchall()
    assert [list(r) for r in rows] == [list(r.values()) for r in want.to_pylist()]
    frame = pl.read_parquet(path, columns=["group_id", "response_ids", "response_logprobs"])
    assert frame.to_dicts() == want.to_pylist()


def test_time_queued_before_the_archive_counts_towards_the_flush_timer(tmp_path):
    """Issue 17: deletes that waited in the worker's queue (behind a file being written) for
    ``flush_after`` already are written at once, not held ``flush_after`` more while the plane is full."""
    servers, clock = FakeServers(), Clock()
    archive = Archive(
        tmp_path, read=servers.read, delete_groups=servers.delete_groups, flush_after=5.0, clock=clock
    )
    assert archive([_work(0)], since=clock.now - 1.0) == []  # queued 1 s: held 4 s more
    clock.now += 3.9
    assert archive([]) == []
    clock.now += 0.1
    assert [(w.partition.group_id, ok) for w, ok, _ in archive([])] == [(0, True)]
    out = archive([_work(1), _work(2)], since=clock.now - 5.0)  # queued for flush_after already
    assert sorted((w.partition.group_id, ok) for w, ok, _ in out) == [(1, True), (2, True)]
    assert len(_files(tmp_path)) == 2


def test_writers_refused_for_capacity_get_the_held_groups_written_at_once(tmp_path):
    """Issue 17: a plane too small to hold a file's worth of groups stalled its writers until the flush
    timer; a capacity refusal since the last pass now writes the held groups (and deletes them) at once."""
    servers, clock, refusals = FakeServers(), Clock(), [3]
    archive = Archive(
        tmp_path,
        read=servers.read,
        delete_groups=servers.delete_groups,
        flush_after=60.0,
        clock=clock,
        pressure=lambda: refusals[0],
    )
    assert archive([_work(0), _work(1)]) == []  # refusals from before the archive opened do not count
    assert archive([]) == []
    assert archive.pending == 2
    refusals[0] += 1  # a writer was refused for capacity
    out = archive([_work(2)])
    assert sorted((w.partition.group_id, ok) for w, ok, _ in out) == [(0, True), (1, True), (2, True)]
    assert (archive.pending, len(_files(tmp_path)), sorted(servers.deleted)) == (0, 1, [0, 1, 2])
    assert archive([_work(3)]) == []
    assert archive.pending == 1
