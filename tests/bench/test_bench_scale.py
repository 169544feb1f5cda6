"""bench_scale: 4 writer and 2 trainer processes train every group of each scale, and report it."""

from __future__ import annotations

import json

import pytest

from trajflight.bench import bench_scale


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_group_of_each_scale_is_trained_and_reported(tmp_path, capsys):
    out = tmp_path / "scale.json"
    assert bench_scale.main(["--scales", "1,2", "--repeats", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [row["scale"] for row in result["scales"]] == [1, 2]
    assert [row["groups"] for row in result["scales"]] == [64, 128]
    for row in result["scales"]:
        (run,) = row["runs"]
        assert run["trained"] == row["groups"]  # every group leased, fetched and committed once
        assert run["idle"] == [0, 0]  # and deleted: the job holds nothing
        assert row["payload_bytes"] > 0
        assert row["wall_s"] > 0
        assert row["put_GBps"] > 0
        assert row["trained_GBps"] > 0
    assert result["scales"][0]["time_growth"] == 1.0
    printed = capsys.readouterr().out
    assert "4 writer and 2 trainer processes" in printed
    assert "targets at 2x" in printed
