"""The archive of trained groups: written before the deletes, bit-exact, never lost, never twice."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

import trajflight
from trajflight.analytics import scan

from .conftest import commit_all, group_columns, put_groups, written


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([("group_id", "ascending"), ("sample_index", "ascending")])


def _files(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


def _check_round_trip(got: pa.Table, job: str, count: int) -> None:
    want = written(job, count)
    got = _sorted(got)
    assert got.num_rows == want.num_rows
    for name in want.schema.names:  # every column, nested top-p, dictionary and struct included
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    assert got.column("trained_by").to_pylist() == ["trainer-a"] * got.num_rows
    assert got.column("trained_version").to_pylist() == [2] * got.num_rows
    staleness = pc.subtract(pa.scalar(2, pa.int64()), want.column("policy_version"))
    assert got.column("staleness").to_pylist() == staleness.to_pylist()
    assert got.column("committed_at").null_count == 0
    assert set(got.column("outcome").to_pylist()) == {"committed"}
    assert got.schema.field("committed_at").type == pa.timestamp("us", tz="UTC")


def test_committed_groups_round_trip_bit_exact_through_scan(tmp_path, job):
    """Issue 17: committed groups are archived (every column plus the lease facts) before their data is
    deleted, many groups per file, no temporary or manifest left behind."""
    with (
        trajflight.LocalCluster(
            servers=2, processes=False, archive=tmp_path, archive_flush=0.2, capacity="64MiB"
        ) as cluster,
        cluster.client() as client,
    ):
        put_groups(client, job, 8)
        commit_all(client, job, 8)
        assert cluster.wait_idle(job, timeout=30.0) == (0, 0)
        status = trajflight.connect(cluster.address, timeout=10.0).stats()["controller"]["archive"]
    _check_round_trip(scan(tmp_path, job=job).to_table(), job, 8)
    files = _files(str(tmp_path))
    assert all(f.endswith(".parquet") and "/part-" in f for f in files), files
    assert status["groups"] == 8
    assert status["files"] == len(files) < 8
    assert status["error"] is None
    assert status["pending"] == 0


def test_round_trip_through_a_real_s3_api(s3, job):
    """The archive writes to any pyarrow.fs filesystem: here S3 (moto's server) via endpoint_override."""
    fs, bucket = s3
    root = f"{bucket}/runs"
    with (
        trajflight.LocalCluster(
            servers=1, processes=False, archive=root, archive_filesystem=fs, archive_flush=0.2
        ) as cluster,
        cluster.client() as client,
    ):
        put_groups(client, job, 5)
        commit_all(client, job, 5)
        assert cluster.wait_idle(job, timeout=30.0) == (0, 0)
    _check_round_trip(scan(root, job=job, filesystem=fs).to_table(), job, 5)
    keys = [i.path for i in fs.get_file_info(pafs.FileSelector(root, recursive=True))]
    assert [k for k in keys if "/.tmp-" in k or "/_manifests/" in k] == [], keys


def test_a_full_plane_s_writer_gets_room_without_waiting_for_the_flush_timer(tmp_path, job):
    """Issue 17: on a plane holding fewer groups than an archive file, committed groups sat held for
    ``archive_flush`` while writers were refused for capacity; the refusal now has them written and
    deleted at once, so the waiting put succeeds long before the timer (and its own deadline)."""
    with (
        trajflight.LocalCluster(
            servers=1, processes=False, archive=tmp_path, archive_flush=600.0, max_groups=4
        ) as cluster,
        cluster.client() as client,
    ):
        put_groups(client, job, 4)
        commit_all(client, job, 4)
        writer = client.writer(job, epoch=1)
        assert cluster.archive is not None
        assert cluster.archive.counters["groups"] == 0  # held for the timer
        assert cluster.controller is not None
        writer.put(**group_columns(4, seed=1), timeout=30.0)  # 600 s timer: only the refusal frees room
        assert cluster.controller.metrics.refusals()["capacity"] >= 1  # it was refused, then got room
        assert cluster.archive.counters["groups"] == 4
    assert sorted(set(scan(tmp_path, job=job).to_table().column("group_id").to_pylist())) == [0, 1, 2, 3]
