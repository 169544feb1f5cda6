"""``trajflight sql`` and ``trajflight export`` through the real CLI entry point."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from trajflight.cli import main

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
