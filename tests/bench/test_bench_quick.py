"""``trajflight bench --quick``: every figure it reports is present and positive, the JSON matches its
schema, and a missing peer is skipped with its install hint. Timing decides nothing here.

Ray and TransferQueue are left out of the quick run (Ray may only run through the session's
``ray_runtime`` fixture, and starting TransferQueue's actors costs more than this test's budget); the
skip path is checked by hiding both packages.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from trajflight.bench._report import QUICK_NOTE, add_ratios_and_targets, format_table
from trajflight.bench._run import BenchConfig, run_bench
from trajflight.bench._schema import SCHEMA, SchemaViolation, validate, validate_complete
from trajflight.bench._stats import Progress
from trajflight.cli import main

QUICK_SYSTEMS = "memcpy,flight,trajflight,trajflight-flight"
OPS = ("put", "get_all_jagged", "get_all_padded", "get_subset_jagged", "get_subset_padded")


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One quick run through the CLI, as CI runs it; its JSON document."""
    out = tmp_path_factory.mktemp("bench")
    status = main(
        [
            "bench",
            "--quick",
            "--quiet",
            "--systems",
            QUICK_SYSTEMS,
            "--json",
            str(out / "result.json"),
            "--chart",
            str(out / "chart.png"),
        ]
    )
    assert status == 0
    doc = json.loads((out / "result.json").read_text())
    doc["_chart"] = str(out / "chart.png")
    return doc


def test_quick_run_matches_the_schema(quick_result: dict) -> None:
    doc = {k: v for k, v in quick_result.items() if k != "_chart"}
    validate_complete(doc)
    assert doc["config"]["quick"] is True
    assert set(doc["systems"]) == set(QUICK_SYSTEMS.split(","))


def test_every_reported_figure_is_present_and_positive(quick_result: dict) -> None:
    for name, system in quick_result["systems"].items():
        assert system["status"] == "ok", (name, system["reason"])
        for op in OPS:
            figure = system[op]
            for key in ("GBps", "GBps_min", "GBps_max", "groups_per_s"):
                assert figure[key] > 0, (name, op, key)
            assert figure["seconds"]["n"] == quick_result["config"]["repeats"]
        if name in ("memcpy", "flight"):  # their APIs have a batched put (trajflight's: Writer.put_many)
            assert system["put_batched"]["GBps"] > 0
        assert system["latency"]["p50_ms"] > 0
        assert system["latency"]["p99_ms"] >= system["latency"]["p50_ms"]
        memory = system["memory"]
        assert memory["client_peak_bytes"] > 0
        # Growth may be 0 when the allocator reuses freed pages: present and not negative.
        assert memory["client_per_payload_byte"] >= 0
        if name == "memcpy":
            assert memory["servers_per_payload_byte"] is None
        else:
            assert memory["servers_peak_bytes"] > 0
            assert memory["servers_per_payload_byte"] >= 0
    assert "controller" not in quick_result["systems"]["trajflight-flight"]  # measured once per run
    controller = quick_result["systems"]["trajflight"]["controller"]
    assert controller["group_cycles_per_s"]["median"] > 0
    assert controller["transitions_per_s"] > 0


def _full(quick_result: dict) -> dict:
    """The quick run's document as if it were a full run (so that its targets are judged)."""
    doc = copy.deepcopy({k: v for k, v in quick_result.items() if k != "_chart"})
    doc["config"]["quick"] = False
    return add_ratios_and_targets(doc)


def test_ratios_and_targets_cover_the_references(quick_result: dict) -> None:
    ratios = quick_result["ratios"]
    for op in OPS:
        assert ratios[f"{op} trajflight/flight"] > 0
        assert ratios[f"{op} trajflight/memcpy"] > 0
    quick = {t["id"]: t for t in quick_result["targets"]}
    judged = {t["id"]: t for t in _full(quick_result)["targets"]}
    for ours in ("trajflight", "trajflight-flight"):
        for target in (f"{ours}: put vs flight", f"{ours}: small-group p50"):
            assert judged[target]["met"] in (True, False)
            # issue 19: --quick printed MISS lines for targets its tiny data cannot judge.
            assert quick[target]["met"] is None
            assert quick[target]["note"] == QUICK_NOTE
        # Peers that did not run give no verdict, and say so.
        assert judged[f"{ours}: put vs transferqueue"]["met"] is None
        assert "did not run" in judged[f"{ours}: put vs transferqueue"]["note"]
    assert ratios["get_all_jagged trajflight/trajflight-flight"] > 0


def test_the_table_fits_100_columns_and_names_targets_by_what_they_are(quick_result: dict) -> None:
    """issue 19: the tables ran to 245 characters, under a "Targets (issue 6)" heading."""
    for doc in (quick_result, _full(quick_result)):
        table = format_table(doc)
        assert max(len(line) for line in table.splitlines()) <= 100
        assert "issue" not in table
        assert (
            "Targets (trajflight against TransferQueue, Ray's object store and a bare Flight server)" in table
        )
    assert "MISS" not in format_table(quick_result)
    assert "not judged under --quick" in format_table(quick_result)


def test_bench_writes_nothing_unless_told_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 19: `trajflight bench` wrote trajflight-bench.json and .png into the current directory."""
    monkeypatch.chdir(tmp_path)
    tiny = ["bench", "--quick", "--quiet", "--systems", "memcpy", "--repeats", "1", "--latency-iters", "2"]
    assert main(tiny) == 0
    assert list(tmp_path.iterdir()) == []
    assert main([*tiny, "--out", "results"]) == 0
    written = sorted(p.name for p in (tmp_path / "results").iterdir())
    expected = ["trajflight-bench.json", "trajflight-bench.md"]
    if importlib.util.find_spec("matplotlib") is not None:
        expected.append("trajflight-bench.png")
    assert written == expected
    validate_complete(json.loads((tmp_path / "results" / "trajflight-bench.json").read_text()))


def test_check_exits_1_when_a_target_is_missed(quick_result: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 19: a run that missed targets exited 0; `--check` now fails it (and refuses --quick)."""
    doc = _full(quick_result)
    doc["systems"]["trajflight"]["latency"]["p50_ms"] = 1000.0  # misses the small-group target
    monkeypatch.setattr("trajflight.bench._run.run_bench", lambda cfg, progress=None: copy.deepcopy(doc))
    args = ["bench", "--quiet", "--systems", QUICK_SYSTEMS]
    assert main(args) == 0
    assert main([*args, "--check"]) == 1
    assert main(["bench", "--quick", "--check"]) == 2


def test_chart_is_drawn_or_explained(quick_result: dict) -> None:
    from pathlib import Path

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not Path(quick_result["_chart"]).exists()
    else:
        assert Path(quick_result["_chart"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_peers_are_skipped_with_their_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes `import x` raise ImportError and find_spec return None.
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "transfer_queue", None)
    cfg = BenchConfig.quick_config(systems=("memcpy", "ray", "transferqueue"), repeats=1, latency_iters=2)
    doc = add_ratios_and_targets(run_bench(cfg, Progress(enabled=False)))
    validate_complete(doc)
    assert doc["systems"]["memcpy"]["status"] == "ok"
    for peer, hint in (("ray", "trajflight[ray]"), ("transferqueue", "transferqueue==0.1.11")):
        assert doc["systems"][peer]["status"] == "skipped"
        assert hint in doc["systems"][peer]["hint"]


def test_schema_rejects_a_broken_document(quick_result: dict) -> None:
    doc = copy.deepcopy({k: v for k, v in quick_result.items() if k != "_chart"})
    doc["systems"]["trajflight"]["put"]["GBps"] = 0
    with pytest.raises(SchemaViolation, match=r"\$\.systems\.trajflight\.put\.GBps"):
        validate(doc)
    del doc["systems"]["flight"]["latency"]
    doc["systems"]["trajflight"]["put"]["GBps"] = 1.0
    with pytest.raises(SchemaViolation, match="latency"):
        validate_complete(doc)


def test_schema_is_printable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--schema"]) == 0
    assert json.loads(capsys.readouterr().out) == SCHEMA


@pytest.mark.ray
@pytest.mark.slow
def test_quick_run_of_the_ray_peer_on_the_shared_runtime(ray_runtime) -> None:
    """The Ray reference reuses the session's runtime (never starts or stops its own here)."""
    cfg = BenchConfig.quick_config(systems=("trajflight", "ray"), repeats=1, latency_iters=3)
    doc = add_ratios_and_targets(run_bench(cfg, Progress(enabled=False)))
    validate_complete(doc)
    ray = doc["systems"]["ray"]
    assert ray["status"] == "ok", ray["reason"]
    assert all(ray[op]["GBps"] > 0 for op in OPS)
    assert ray["memory"]["servers_peak_bytes"] > 0
    assert doc["ratios"]["get_all_jagged trajflight/ray"] > 0
    assert ray_runtime.is_initialized()
