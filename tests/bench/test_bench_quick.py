"""``trajflight bench --quick``: every figure it reports is present and positive, the JSON matches its
schema, and a missing peer is skipped with its install hint. Timing decides nothing here.

Ray (both forms) and TransferQueue are left out of the quick run (Ray may only run through the session's
``ray_runtime`` fixture, and starting TransferQueue's actors costs more than this test's budget); the
skip path is checked by hiding both packages.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from trajflight.bench._report import QUICK_NOTE, add_ratios_and_targets, format_table
from trajflight.bench._run import BenchConfig, _make_system, run_bench
from trajflight.bench._schema import SCHEMA, SchemaViolation, validate, validate_complete
from trajflight.bench._stats import Progress
from trajflight.bench._system import GET_VARIANTS, USER_COLUMNS, payload_of, user_columns
from trajflight.cli import main
from trajflight.workload import make_workload

QUICK_SYSTEMS = "memcpy,shm-ceiling,flight,flight-per-group,trajflight,trajflight-flight"
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
        assert system["put_batched"]["GBps"] > 0  # every system here has one (trajflight's: put_many)
        assert system["latency"]["p50_ms"] > 0
        assert system["latency"]["p99_ms"] >= system["latency"]["p50_ms"]
        memory = system["memory"]
        assert memory["client_peak_bytes"] > 0
        # Growth may be 0 when the allocator reuses freed pages: present and not negative.
        assert memory["client_per_payload_byte"] >= 0
        if name == "memcpy":
            assert memory["servers_per_payload_byte"] is None
        elif name == "shm-ceiling":
            assert memory["servers_peak_bytes"] > 0  # the writer process
        else:
            assert memory["servers_peak_bytes"] > 0
            assert memory["servers_per_payload_byte"] >= 0
    assert "controller" not in quick_result["systems"]["trajflight-flight"]  # measured once per run
    controller = quick_result["systems"]["trajflight"]["controller"]
    assert controller["group_cycles_per_s"]["median"] > 0
    assert controller["transitions_per_s"] > 0


def test_trajflight_gets_follow_its_batched_put_and_the_per_group_form_is_kept(quick_result: dict) -> None:
    """issue 16: trajflight's gets followed one put per group (a join copy) while Ray's followed one
    object per batch; its gets now follow put_many, and those after single puts stay, labelled."""
    for name in ("trajflight", "trajflight-flight"):
        singles = quick_result["systems"][name]["gets_after_single_puts"]
        assert set(singles) == {op for op in OPS if op != "put"}
        assert all(figure["GBps"] > 0 for figure in singles.values())
    for name in ("flight", "flight-per-group", "memcpy", "shm-ceiling"):
        assert "gets_after_single_puts" not in quick_result["systems"][name]
    rows = [line for line in format_table(quick_result).splitlines() if line.startswith("  after 1 put/")]
    assert len(rows) == 2  # one under each trajflight row


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


def test_the_table_fits_110_columns_and_names_targets_by_what_they_are(quick_result: dict) -> None:
    """issue 19: the tables ran to 245 characters, under a "Targets (issue 6)" heading; issue 16: the
    targets say they compare with each peer's strongest form (the table grew to 110 columns for it)."""
    for doc in (quick_result, _full(quick_result)):
        table = format_table(doc)
        assert max(len(line) for line in table.splitlines()) <= 110
        assert "issue" not in table
        assert "Targets (trajflight against each peer's strongest form" in table
        assert "each peer's strongest form (marked *)" in table
    assert "MISS" not in format_table(quick_result)
    assert "not judged under --quick" in format_table(quick_result)


def test_every_system_is_labelled_with_its_form(quick_result: dict) -> None:
    """issue 16: the peers ran in weaker forms than users run, unlabelled; each entry now names its form
    and whether it is the peer's strongest, and the ratio table leaves the weaker forms out."""
    systems = quick_result["systems"]
    assert all(system["form"] for system in systems.values())
    assert systems["flight"]["strongest"] is True
    assert systems["flight"]["form"] == "one stream of the batch"
    assert systems["flight-per-group"]["strongest"] is False
    assert systems["shm-ceiling"]["role"] == "reference"
    table = format_table(quick_result)
    assert "trajflight / flight " in table
    assert "trajflight / flight-per-group" not in table
    assert quick_result["ratios"]["get_all_jagged trajflight/flight-per-group"] > 0  # kept in the JSON
    assert quick_result["ratios"]["put_batched trajflight/flight"] > 0
    judged = {t["id"] for t in _full(quick_result)["targets"] if t["met"] is not None}
    assert "trajflight: put_batched vs flight" in judged
    assert not any("per-group" in t for t in judged)


def test_the_workload_carries_two_user_columns(quick_result: dict) -> None:
    """issue 16: the standard workload carries two user columns (``extra=``) that every system moves."""
    assert quick_result["config"]["user_columns"] == list(USER_COLUMNS)
    groups = make_workload(8, 8, seed=0, response_median=64.0)
    assert quick_result["config"]["payload_bytes"] == payload_of(groups)
    assert payload_of(groups) == sum(g.payload_bytes for g in groups) + 8 * 8 * 16


def test_the_handoff_is_measured_across_processes(quick_result: dict) -> None:
    """issue 16: a cross-process handoff figure (writer process -> trainer process waiting in lease)."""
    for name in ("trajflight", "trajflight-flight", "shm-ceiling"):
        handoff = quick_result["systems"][name]["handoff"]
        assert handoff["n"] == quick_result["config"]["handoff_iters"]
        assert 0 < handoff["p50_ms"] <= handoff["p99_ms"]
    assert "handoff" not in quick_result["systems"]["flight"]
    assert quick_result["ratios"]["handoff_p50 trajflight/shm-ceiling"] > 0
    judged = {t["id"]: t for t in _full(quick_result)["targets"]}
    assert judged["trajflight: handoff p50"]["met"] in (True, False)


@pytest.mark.parametrize("name", ["flight", "shm-ceiling", "trajflight-flight"])
def test_each_form_hands_the_consumer_every_column_it_was_given(name: str) -> None:
    """The strongest forms and trajflight move the workload's values, user columns included, bit-exact
    (the one-stream Flight form and the shared-memory ceiling are new in issue 16)."""
    cfg = BenchConfig.quick_config(groups=3, systems=(name,))
    groups = make_workload(3, 8, seed=0, response_median=64.0)
    system = _make_system(name, groups, cfg)
    system.setup()
    try:
        system.put_all()
        system.prepare_get()
        got = system.get(GET_VARIANTS[0])
        tensors = getattr(got, "tensors", got)
        expected = {
            "response_ids": np.concatenate([g.response_values for g in groups]),
            "user_sample_id": np.concatenate([user_columns(g)["user_sample_id"] for g in groups]),
            "user_group_id": np.concatenate([user_columns(g)["user_group_id"] for g in groups]),
        }
        for column, values in expected.items():
            tensor = tensors[column]
            flat = tensor.values() if getattr(tensor, "is_nested", False) else tensor
            assert np.array_equal(flat.numpy(), values), column
        del got, tensors, tensor, flat
        system.finish_get()
        system.drain()
    finally:
        system.close()


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
        assert doc["systems"][peer]["form"]  # labelled even when skipped


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
    """The Ray reference reuses the session's runtime (never starts or stops its own here); both its
    forms run (issue 16: one object per batch, the strongest, with its cross-process handoff)."""
    cfg = BenchConfig.quick_config(systems=("trajflight", "ray", "ray-per-group"), repeats=1, latency_iters=3)
    doc = add_ratios_and_targets(run_bench(cfg, Progress(enabled=False)))
    validate_complete(doc)
    for name in ("ray", "ray-per-group"):
        ray = doc["systems"][name]
        assert ray["status"] == "ok", ray["reason"]
        assert all(ray[op]["GBps"] > 0 for op in OPS)
        assert ray["memory"]["servers_peak_bytes"] > 0
    assert doc["systems"]["ray"]["form"] == "one object per batch"
    assert doc["systems"]["ray"]["strongest"]
    assert not doc["systems"]["ray-per-group"]["strongest"]
    assert doc["systems"]["ray"]["handoff"]["n"] == cfg.handoff_iters
    assert doc["ratios"]["get_all_jagged trajflight/ray"] > 0
    assert doc["ratios"]["handoff_p50 trajflight/ray"] > 0
    assert ray_runtime.is_initialized()
