"""``trajflight sql`` and ``trajflight export`` through the real CLI entry point."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from trajflight.analytics._sql import needed_columns
from trajflight.cli import main
from trajflight.flight_server import StorageClient

from .conftest import put_rich, write_archive


def test_sql_prints_a_table_csv_json_and_parquet(plane, client, job, capsys, tmp_path):
    put_rich(client, job, 4)
    query = "SELECT policy_version, count(*) AS n, sum(tokens) AS t FROM trajectories GROUP BY 1 ORDER BY 1"
    assert main(["sql", plane.address, "--job", job, query]) == 0
    table = capsys.readouterr().out
    assert "policy_version" in table
    assert "n" in table
    assert main(["sql", plane.address, "--job", job, "--json", query]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy_version"] for r in rows] == [0, 1, 2]
    assert sum(r["n"] for r in rows) == 12
    assert main(["sql", plane.address, "--job", job, "--csv", query]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "policy_version,n,t"
    assert len(lines) == 4
    out = tmp_path / "result.parquet"
    assert main(["sql", plane.address, "--job", job, "--parquet", str(out), query]) == 0
    assert pq.read_table(out).to_pylist() == rows
    assert pq.ParquetFile(out).metadata.row_group(0).column(0).compression == "ZSTD"


def test_sql_over_live_and_archive_with_nested_columns_in_csv(plane, client, job, capsys, tmp_path):
    put_rich(client, job, 2)
    write_archive(tmp_path, job, {1: 4})
    query = "SELECT group_id, top_p_probs FROM trajectories WHERE sample_index = 1 ORDER BY group_id"
    assert main(["sql", plane.address, "--also", str(tmp_path), "--job", job, "--csv", query]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines[1:]] == ["0", "1", "2", "3"]
    assert lines[1].split(",", 1)[1].startswith('"[[')  # a nested list, as JSON text


def test_sql_reads_only_the_columns_the_query_needs(plane, client, job, capsys, monkeypatch):
    """The view's columns are read from the servers only when the query names them (top-p columns are
    the bulk of a group), derived ones through their inputs."""
    put_rich(client, job, 2)
    asked = []
    real = StorageClient.get

    def spy(self, groups, *, columns=None, timeout=None):
        asked.append(None if columns is None else set(columns))
        return real(self, groups, columns=columns, timeout=timeout)

    monkeypatch.setattr(StorageClient, "get", spy)
    query = "SELECT avg(reward), max(tokens) FROM trajectories WHERE finish_reason = 'stop'"
    assert main(["sql", plane.address, "--job", job, "--json", query]) == 0
    assert asked
    assert all(a == {"reward", "prompt_ids", "response_ids", "finish_reason"} for a in asked)
    capsys.readouterr()
    asked.clear()
    assert main(["sql", plane.address, "--job", job, "--json", "SELECT count(*) AS n FROM trajectories"]) == 0
    assert json.loads(capsys.readouterr().out)[-1] == {"n": 6}
    assert all(a == {"group_id"} for a in asked)


def test_needed_columns_by_binding():
    import duckdb
    import pyarrow as pa

    schema = pa.schema([("a", pa.int64()), ("b", pa.list_(pa.int32())), ("c", pa.string())])
    assert needed_columns(duckdb, "SELECT * FROM trajectories", schema) == ["a", "b", "c"]
    # EXCLUDE names b, so the query no longer binds without it: read anyway (more than needed, never less).
    assert needed_columns(duckdb, "SELECT * EXCLUDE (b) FROM trajectories", schema) == ["a", "b", "c"]
    assert needed_columns(duckdb, "SELECT a AS c FROM trajectories ORDER BY c", schema) == ["a"]
    assert needed_columns(duckdb, "SELECT len(b) FROM trajectories WHERE c > 'x'", schema) == ["b", "c"]
    # Anything but one SELECT would run while binding: every column is read instead.
    assert needed_columns(duckdb, "CREATE TABLE t AS SELECT a FROM trajectories", schema) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sql", "{plane}", "SELEKT 1"], "DuckDB refused the query"),
        (["sql", "{plane}", "SELECT nope FROM trajectories"], "DuckDB refused the query"),
        (["sql", "grpc://127.0.0.1:1", "--timeout", "2", "SELECT 1"], "could not be reached"),
        (["sql", "{tmp}/missing", "SELECT 1"], "no archive at"),
        (["export", "grpc://127.0.0.1:1", "{tmp}/x.parquet", "--timeout", "2"], "could not be reached"),
        (["export", "{plane}", "{tmp}/no/such/dir/x.parquet"], "cannot write"),
    ],
)
def test_errors_print_one_line_and_exit_2(plane, tmp_path, capsys, argv, message):
    argv = [a.format(plane=plane.address, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_export_writes_the_live_groups_to_one_zstd_file(plane, client, job, capsys, tmp_path):
    put_rich(client, job, 3)
    out = tmp_path / "dump.parquet"
    assert main(["export", plane.address, str(out), "--job", job, "--columns", "sample_id,top_p_ids"]) == 0
    assert "wrote 9 rows" in capsys.readouterr().out
    table = pq.read_table(out)
    assert table.schema.names == ["sample_id", "top_p_ids"]
    assert table.num_rows == 9
    assert pq.ParquetFile(out).metadata.row_group(0).column(0).compression == "ZSTD"
    assert [p.name for p in tmp_path.iterdir()] == ["dump.parquet"]  # no temporary file left
    assert main(["export", plane.address, str(out), "--job", job, "--derived"]) == 0
    assert "top_p_entropy" in pq.read_table(out).schema.names


def test_help_names_the_view_and_the_derived_columns(capsys):
    with pytest.raises(SystemExit):
        main(["sql", "--help"])
    text = capsys.readouterr().out
    assert "trajectories" in text
    assert "--parquet" in text
