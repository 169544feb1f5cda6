"""bench_archive: the commit loop runs with and without an archive, and SQL reads the big archive."""

from __future__ import annotations

import json

import pytest

from trajflight.bench import bench_archive


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_both_commit_loops_settle_and_the_aggregate_sees_every_sample(tmp_path, capsys):
    out = tmp_path / "archive.json"
    assert (
        bench_archive.main(["--rounds", "1", "--repeats", "1", "--samples", "20000", "--json", str(out)]) == 0
    )
    result = json.loads(out.read_text())
    assert len(result["plain"]) == len(result["archived"]) == 1
    for run in (*result["plain"], *result["archived"]):
        assert run["commits_per_s"] > 0
        assert run["settled_s"] >= run["loop_s"] > 0  # every group archived (or deleted) and gone
    assert len(result["sql_s"]) == 1
    assert result["parquet_bytes"] > 0
    printed = capsys.readouterr().out
    assert "SQL aggregate over 20,000 archived samples" in printed
    assert "(target >= 0.90)" in printed


def test_the_big_archive_holds_every_sample_in_the_archive_layout(tmp_path):
    from trajflight.analytics import scan

    bench_archive.write_big_archive(tmp_path, 1000, seed=1)
    table = scan(str(tmp_path), job="big", columns=["group_id", "reward", "response_length"]).to_table()
    assert table.num_rows == 1000
    assert sorted(set(table.column("group_id").to_pylist())) == list(range(125))  # 8 samples a group
