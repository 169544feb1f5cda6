"""bench_padded: its reference (the padder before) pads as the codec does, and a short run reports."""

from __future__ import annotations

import json
from unittest import mock

import pyarrow as pa
import pytest
import torch

from trajflight.bench import bench_padded
from trajflight.codec import _decode, decode
from trajflight.workload import make_workload


def test_the_reference_padder_gives_the_codecs_tensors_on_the_workload():
    """Otherwise the ABBA rounds would compare different work."""
    table = pa.Table.from_batches([g.encode("j", 1) for g in make_workload(4, 8, seed=0)])
    for rows in (table, table.slice(0, 8)):  # a batch and one group: both routes of the old padder
        got = decode(rows, layout="padded")
        with mock.patch.object(_decode, "_padded", bench_padded._padded_before):
            want = decode(rows, layout="padded")
        assert got.padded.keys() == want.padded.keys()
        for name, padded in got.padded.items():
            assert padded.values.dtype == want.padded[name].values.dtype
            assert torch.equal(padded.values, want.padded[name].values)
            assert torch.equal(padded.lengths, want.padded[name].lengths)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_short_run_reports_both_arms_for_both_figures(tmp_path, capsys):
    out = tmp_path / "padded.json"
    assert bench_padded.main(["--rounds", "2", "--calls", "1", "--no-ray", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    for variant in ("get_all_padded", "get_subset_padded"):
        for figure in ("fetch", "fetch+read"):
            for arm in ("after", "before"):
                row = result["rows"][f"{variant}/{figure}/{arm}"]
                assert row["n"] == 2
                assert row["gb_s_median"] > 0
    assert "get_all_padded/fetch: before / after (speed-up)" in result["ratios"]
    assert '"load_1min"' in capsys.readouterr().out
