"""``trajflight.analytics.scan`` over a real embedded data plane and a Parquet archive made here."""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pytest

import trajflight
from trajflight.analytics import DERIVED_COLUMNS, _live, scan
from trajflight.errors import (
    ConfigError,
    InvalidRequestError,
    NotFoundError,
    SchemaError,
    UnavailableError,
)
from trajflight.flight_server import StorageClient

from .conftest import encoded, put_rich, write_archive


def _listed(location: str, job: str) -> list:
    with StorageClient(location) as storage:
        return storage.list_groups(job)


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([("group_id", "ascending"), ("sample_index", "ascending")])


def _server_state(client: trajflight.Client, job: str) -> list[dict]:
    """What a storage server knows of a job's leases: its groups, bytes and highest generation."""
    out = []
    for server in client.controller.servers():
        with StorageClient(server.location) as storage:
            out.append(storage.stats()["jobs"].get(job, {}))
    return out


def test_a_live_scan_reads_every_column_as_put(plane, client, job):
    put_rich(client, job, 4)
    got = _sorted(scan(plane.address, job=job).to_table())
    want = pa.Table.from_batches([encoded(job, 1, g) for g in range(4)])
    # Every column, nested top-p, dictionary and struct included, equal to what the codec encodes.
    assert got.schema.names == want.schema.names
    for name in want.schema.names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    assert got.schema.field("top_p_probs").type == want.schema.field("top_p_probs").type


def test_projection_goes_down_to_the_servers(plane, client, job, monkeypatch):
    put_rich(client, job, 3)
    asked = []
    real = StorageClient.get

    def spy(self, groups, *, columns=None, timeout=None):
        asked.append(None if columns is None else tuple(columns))
        return real(self, groups, columns=columns, timeout=timeout)

    monkeypatch.setattr(StorageClient, "get", spy)
    table = scan(plane.address, job=job, columns=["reward", "response_length"]).to_table()
    assert table.schema.names == ["reward", "response_length"]
    assert table.num_rows == 9
    assert asked
    assert set(asked) == {("reward", "response_ids")}


def test_a_live_scan_during_a_held_lease_changes_no_lease_token_or_state(plane, client, job):
    """issue 17: a live scan takes no lease and changes none: the held lease commits afterwards, and the
    controller's counts and every server's generations are what they were before the scan."""
    put_rich(client, job, 4)
    trainer = client.trainer(job)
    with trainer.lease(2, wait=10) as batch:
        before = (client.controller.counts(job), _server_state(client, job), batch.token)
        table = scan(plane.address, job=job, derived=True).to_table()
        assert table.num_rows == 12  # leased groups are read too
        after = (client.controller.counts(job), _server_state(client, job), batch.token)
        assert after == before
        batch.fetch(["reward"])  # the lease's own read still passes its fence
    counts = client.controller.counts(job)
    assert counts["COMMITTED"] == 2
    assert counts["READY"] == 2


def test_a_group_committed_between_listing_and_reading_is_skipped(plane, client, job):
    put_rich(client, job, 3)
    found = scan(plane.address, job=job, columns=["group_id"])
    assert found.schema.names == ["group_id"]  # the servers are listed now
    with client.trainer(job).lease(1, wait=10) as batch:
        (gone,) = batch.partitions
    deadline = time.monotonic() + 30  # bounds a hang only: the commit deletes the group's data
    while any(g.key == gone for s in client.controller.servers() for g in _listed(s.location, job)):
        assert time.monotonic() < deadline, "the committed group was never deleted"
        time.sleep(0.05)
    ids = found.to_table().column("group_id").to_pylist()
    assert sorted(set(ids)) == sorted({0, 1, 2} - {gone.group_id})
    assert len(ids) == 6


def test_every_job_in_small_chunks(plane, client, job, monkeypatch):
    """Without ``job`` every job is read, one job per stream (a server refuses to join jobs whose types
    differ), in chunks of at most CHUNK_GROUPS groups."""
    monkeypatch.setattr(_live, "CHUNK_GROUPS", 2)
    put_rich(client, job, 5)
    table = scan(plane.address, columns=["job_id", "sample_id"]).to_table()
    ids = table.filter(pc.field("job_id") == job).column("sample_id").to_pylist()
    assert sorted(ids) == sorted(f"{job}/1/{g}/{i}" for g in range(5) for i in range(3))
    assert len(table.column("sample_id").to_pylist()) == len(set(table.column("sample_id").to_pylist()))


def test_derived_where_and_epochs(plane, client, job):
    put_rich(client, job, 3)
    everything = scan(plane.address, job=job, derived=True).to_table()
    assert everything.schema.names[-len(DERIVED_COLUMNS) :] == list(DERIVED_COLUMNS)
    # A where over a derived column that is not yielded: computed, filtered, then left out.
    long = scan(plane.address, job=job, columns=["sample_id"], where=pc.field("response_length") > 2)
    want = everything.filter(pc.field("response_length") > 2).column("sample_id").to_pylist()
    assert sorted(long.to_table().column("sample_id").to_pylist()) == sorted(want)
    # A where over a stored column the scan does not yield.
    rich = scan(plane.address, job=job, columns=["group_id"], where=pc.field("policy_version") == 1)
    assert set(rich.to_table().column("group_id").to_pylist()) == {1}
    # A SQL where (DuckDB) over yielded columns.
    sql = scan(plane.address, job=job, columns=["reward", "group_id"], where="group_id = 2")
    assert set(sql.to_table().column("group_id").to_pylist()) == {2}
    assert scan(plane.address, job=job, epochs=[2]).to_table().num_rows == 0


def test_duckdb_and_polars_see_the_scan(plane, client, job):
    import duckdb
    import polars as pl

    put_rich(client, job, 6)
    table = scan(plane.address, job=job, derived=True).to_table()
    want = {
        row["policy_version"]: row["reward_mean"]
        for row in table.group_by("policy_version").aggregate([("reward", "mean")]).to_pylist()
    }
    con = duckdb.connect()
    relation = scan(plane.address, job=job, derived=True).to_duckdb(con)
    rows = relation.aggregate("policy_version, avg(reward), sum(tokens)", "policy_version").fetchall()
    assert {v: pytest.approx(r) for v, r, _ in rows} == want
    assert sum(t for _, _, t in rows) == pc.sum(table.column("tokens")).as_py()
    lazy = scan(plane.address, job=job, derived=True).to_polars()
    assert isinstance(lazy, pl.LazyFrame)
    frame = lazy.group_by("finish_reason").agg(pl.col("response_length").sum()).collect()
    assert frame["response_length"].sum() == pc.sum(table.column("response_length")).as_py()


def test_an_archive_reads_back_every_column_and_prunes_epochs(tmp_path, job):
    written = write_archive(tmp_path, job, {1: 3, 2: 2})
    got = scan(tmp_path, job=job).to_table()
    assert got.num_rows == written.num_rows
    for name in written.schema.names:  # nested, dictionary, struct and the lease facts, bit for bit
        assert got.column(name).to_pylist() == written.column(name).to_pylist(), name
    two = scan(tmp_path, job=job, epochs=2, columns=["epoch", "group_id", "tokens"]).to_table()
    assert set(two.column("epoch").to_pylist()) == {2}
    assert two.num_rows == 6
    pushed = scan(str(tmp_path), columns=["sample_id"], where=pc.field("staleness") == 1).to_table()
    assert pushed.num_rows == pc.sum(pc.equal(written.column("staleness"), 1)).as_py()
    assert scan(tmp_path, job="another").to_table().num_rows == 0
    # Any pyarrow.fs URI: here the local filesystem's, and an explicit filesystem with a bare path.
    assert scan(tmp_path.as_uri(), job=job).to_table().num_rows == written.num_rows
    local = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    assert scan("/", job=job, epochs=[1], filesystem=local).to_table().num_rows == 9


def test_an_archive_whose_files_leave_the_keys_to_the_path(tmp_path, job):
    written = write_archive(tmp_path, job, {3: 2}, keep_keys=False)
    got = scan(tmp_path, columns=["job_id", "epoch", "sample_id"]).to_table()
    assert got.to_pylist() == written.select(["job_id", "epoch", "sample_id"]).to_pylist()
    assert got.schema.field("epoch").type == pa.int64()


def test_live_and_archived_together_count_each_group_once(plane, client, job, tmp_path):
    """A group the archive holds that is still live (the archive writes before the delete) is read once."""
    put_rich(client, job, 3)
    write_archive(tmp_path, job, {1: 5}, facts=True)  # groups 0..4: 0..2 are live too
    columns = ["sample_id", "group_id", "trained_by"]
    table = scan([plane.address, tmp_path], job=job, columns=columns).to_table()
    ids = table.column("sample_id").to_pylist()
    assert len(ids) == len(set(ids)) == 15
    by_group = {r["group_id"]: r["trained_by"] for r in table.to_pylist()}
    assert [by_group[g] for g in range(5)] == [None, None, None, "trainer-0", "trainer-0"]


def test_errors_are_typed_and_say_what_to_do(plane, client, job, tmp_path, monkeypatch):
    put_rich(client, job, 1)
    with pytest.raises(SchemaError, match="no source has a column 'nope'"):
        scan(plane.address, job=job, columns=["nope"]).to_table()
    with pytest.raises(InvalidRequestError, match=r"pyarrow\.compute expression"):
        scan(plane.address, where=42)
    with pytest.raises(InvalidRequestError, match="does not apply"):
        scan(plane.address, job=job, where=pc.field("nope") > 1).to_table()
    with pytest.raises(InvalidRequestError, match="DuckDB refused"):
        scan(plane.address, job=job, columns=["reward"], where="nope >>> 1").to_table()
    with pytest.raises(NotFoundError, match="no archive at"):
        scan(tmp_path / "missing")
    with pytest.raises(UnavailableError, match="could not be reached"):
        scan("grpc://127.0.0.1:1", timeout=2).to_table()
    with pytest.raises(InvalidRequestError, match="epochs"):
        scan(plane.address, epochs="1")

    import builtins

    real_import = builtins.__import__

    def no_duckdb(name, *args, **kwargs):
        if name == "duckdb":
            raise ImportError("no duckdb here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_duckdb)
    monkeypatch.delitem(__import__("sys").modules, "duckdb")
    with pytest.raises(ConfigError, match=r"pip install 'trajflight\[analytics\]'"):
        scan(plane.address, job=job).to_duckdb()


def test_an_empty_source_still_has_the_standard_columns(plane, tmp_path):
    (tmp_path / "empty").mkdir()
    found = scan(tmp_path / "empty", derived=True)
    assert {"reward", "tokens"} <= set(found.schema.names)
    assert found.to_table().num_rows == 0
    assert scan(plane.address, job="no-such-job").to_table().num_rows == 0
