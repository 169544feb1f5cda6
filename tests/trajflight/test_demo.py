"""The main job: a GRPO run that learns on real rollouts, its workers' refusals, and its summary's checks.

The end-to-end runs use small settings (two workers, 96-128 prompts); the rest drives the pieces in
this process against an embedded data plane whose servers are threads.
"""

from __future__ import annotations

import argparse
import queue
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import trajflight
from trajflight.codec import DoublyRagged, decode, encode_group
from trajflight.demo import _worker
from trajflight.demo._policy import make_policy, publish_weights, token_logprobs
from trajflight.demo._stages import group_advantages
from trajflight.demo._summary import StepRecord, Tally, print_summary
from trajflight.demo._task import EOS, TOP_P, Engine, load_weights, make_prompt, sample_group, score
from trajflight.demo._trainer import JOB, DemoRun, note_restore
from trajflight.errors import (
    CapacityExceededError,
    DeadlineExceededError,
    LeaseExpiredError,
    NotFoundError,
    SchemaError,
    StaleFenceError,
    TrajflightError,
    UnavailableError,
)


def _demo(*args: str) -> tuple[str, str]:
    cmd = [sys.executable, "-m", "trajflight", "demo", "--workers", "2", "--no-progress", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The summary's column width depends on its labels.
    return re.sub(r" {2,}", "  ", result.stdout), result.stderr


def test_demo_reward_rises_and_every_prompt_is_trained_once(tmp_path: Path) -> None:
    """issue 19: the demo trained on synthetic groups and showed no learning; at a fixed seed its
    reward must now rise by a clear margin, on rollouts sampled from the policy it trains."""
    out, err = _demo("--groups", "128", "--seed", "0", "--plot", str(tmp_path / "reward.png"))
    first, last = (
        float(x) for x in re.search(r"reward, first -> last \d+ steps  ([\d.]+) -> ([\d.]+)", out).groups()
    )
    assert first < 0.3
    assert last - first > 0.25, out
    assert "prompts trained (lineage)  128 of 128" in out
    assert "trained twice / lost  0 / 0" in out
    assert "capacity held at end  0 bytes, 0 groups" in out
    assert "result: OK - every prompt trained exactly once, nothing lost" in out
    assert "Traceback" not in err
    assert (tmp_path / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_resume_refuses_every_stale_writer_in_one_line_each() -> None:
    """issue 19: ``demo --resume`` printed tracebacks from rollout workers in about half the runs
    (StaleFenceError from ``client.writer``, NotFoundError "job not open", a CANCELLED call) and then
    counted one stale writer too few."""
    out, err = _demo("--groups", "96", "--resume", "--crash-after", "3", "--checkpoint-every", "2")
    assert "(with crash and resume)" in out
    assert "crashed after step 3, rolled back 1 steps" in out
    assert "stale writers refused  2 of 2" in out
    assert "trained twice / lost  0 / 0" in out
    assert "result: OK - every prompt trained exactly once, nothing lost" in out
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "fenced by a newer epoch" in line]
    assert len(lines) == 2, err


# ------------------------------------------------------------------------------- task and policy


def test_partial_credit_follows_the_counting_rule() -> None:
    prompt = np.array([3, 4, 5])
    assert score(prompt, np.array([6, 7, 8, 9, EOS])) == 1.0
    assert score(prompt, np.array([6, 7, EOS])) == pytest.approx(2 / 3)
    assert score(prompt, np.array([1, 2, 3])) == pytest.approx(2 / 3)  # each token judged by the one before
    assert score(prompt, np.array([], dtype=np.int64)) == 0.0
    assert all(make_prompt(0, p)[-1] <= 8 for p in range(200))
    assert make_prompt(3, 7).tolist() == make_prompt(3, 7).tolist()


def test_rollouts_carry_the_policys_own_logprobs_and_top_p_candidates(tmp_path: Path) -> None:
    """What the workers put is the policy's: recomputed by the trainer under the same weights, the
    logprobs agree, and each token's candidates are the nucleus of the policy's distribution."""
    policy = make_policy(1)
    publish_weights(policy, tmp_path / "w.npz")
    weights = load_weights(tmp_path / "w.npz")
    assert weights is not None
    prompt = make_prompt(0, 5)
    rollout = sample_group(Engine(weights), prompt, 8, np.random.default_rng(0))
    offsets = rollout.offsets
    group = encode_group(
        job_id="j",
        epoch=1,
        group_id=0,
        prompt_ids=prompt,
        response_ids=(rollout.response_ids, offsets),
        response_logprobs=(rollout.response_logprobs, offsets),
        reward=rollout.rewards,
        top_p_ids=DoublyRagged(rollout.top_p_ids, offsets, rollout.top_p_offsets),
        top_p_probs=DoublyRagged(rollout.top_p_probs, offsets, rollout.top_p_offsets),
        finish_reason=rollout.finish_reasons,
    )
    data = decode(group, layout="ragged")
    p, r = data.ragged["prompt_ids"], data.ragged["response_ids"]
    with torch.no_grad():
        logp = token_logprobs(policy, p.values, p.offsets, r.values, r.offsets)
        full = torch.log_softmax(policy(_windows(prompt, rollout)), dim=-1).exp()
    torch.testing.assert_close(logp, data.ragged["response_logprobs"].values, atol=1e-5, rtol=0)
    ids, probs = data.doubly_ragged["top_p_ids"], data.doubly_ragged["top_p_probs"]
    for token in range(len(r.values)):
        lo, hi = int(ids.inner_offsets[token]), int(ids.inner_offsets[token + 1])
        cand = probs.values[lo:hi]
        assert bool((cand[:-1] >= cand[1:]).all())  # most likely first
        assert float(cand.sum()) >= TOP_P - 1e-5
        assert float(cand[:-1].sum()) < TOP_P
        torch.testing.assert_close(cand, full[token, ids.values[lo:hi].long()], atol=1e-5, rtol=0)


def _windows(prompt: np.ndarray, rollout: Any) -> torch.Tensor:
    out = []
    for i in range(len(rollout.offsets) - 1):
        seq = [*prompt.tolist(), *rollout.response_ids[rollout.offsets[i] : rollout.offsets[i + 1]].tolist()]
        out += [seq[j - 2 : j] for j in range(len(prompt), len(seq))]
    return torch.tensor(out)


def test_group_advantages_are_normalised_within_the_group() -> None:
    adv = group_advantages(np.array([0.0, 0.5, 1.0, 1.0]))
    assert adv.dtype == np.float32
    assert abs(float(adv.mean())) < 1e-6
    assert float(adv.std()) == pytest.approx(1.0, abs=1e-4)
    assert group_advantages(np.array([0.3, 0.3])).tolist() == [0.0, 0.0]


# ------------------------------------------------------------------------------- rollout workers


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (StaleFenceError("epoch 1 of job 'demo-grpo' is fenced by epoch 2"), "fenced"),
        (UnavailableError("the controller could not be reached"), "transient"),
        (DeadlineExceededError("late"), "transient"),
        (CapacityExceededError("full"), "transient"),
        (LeaseExpiredError("expired"), "transient"),
        (NotFoundError("job 'demo-grpo' is not open"), "transient"),
        (TrajflightError("controller call: Flight call failed: ... CANCELLED"), "transient"),
        (TrajflightError("controller call: something else"), "fatal"),
        (SchemaError("bad column"), "fatal"),
    ],
)
def test_every_refusal_a_restart_can_cause_has_one_treatment(error: Exception, kind: str) -> None:
    assert _worker.refusal_kind(error) == kind


class _Events:
    def __init__(self) -> None:
        self.items: list[tuple[Any, ...]] = []

    def put(self, item: tuple[Any, ...]) -> None:
        self.items.append(item)


def _spec(address: str, tmp_path: Path, epoch: int = 1) -> _worker.WorkerSpec:
    return _worker.WorkerSpec(address, JOB, epoch, 0, 4, 0, str(tmp_path), 16)


def test_worker_rides_out_a_controller_restart_then_stops_fenced_in_one_line(tmp_path: Path) -> None:
    """issue 19: a worker registering while the restarted controller had not restored the job died of
    ``NotFoundError: job is not open`` (a traceback, uncounted); registering after the restore raised
    ``StaleFenceError`` outside the handler. Now both are handled where every call is handled."""
    with trajflight.LocalCluster(servers=1, processes=False, capacity="64MiB") as cluster:
        events = _Events()
        worker = threading.Thread(
            target=_worker.rollout_worker,
            args=(_spec(cluster.address, tmp_path), queue.Queue(), threading.Event(), events),
        )
        worker.start()
        deadline = time.monotonic() + 30
        while not any(e[0] == "retry" for e in events.items) and time.monotonic() < deadline:
            time.sleep(0.02)
        cluster.client().open_job(JOB, 2)  # the job comes back under a newer epoch than the worker's
        worker.join(timeout=60)
    kinds = [e[0] for e in events.items]
    assert kinds.count("retry") >= 1
    assert Counter(kinds)["fenced"] == 1
    assert kinds[-1] == "done"
    (line,) = [e[3] for e in events.items if e[0] == "fenced"]
    assert line.startswith("register: StaleFenceError: ")
    assert "\n" not in line


def test_worker_gives_up_after_its_retry_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_worker, "RETRY_BUDGET", 0.3)
    with trajflight.LocalCluster(servers=1, processes=False, capacity="64MiB") as cluster:
        events = _Events()
        _worker.rollout_worker(_spec(cluster.address, tmp_path), queue.Queue(), threading.Event(), events)
    assert [e[0] for e in events.items][-2:] == ["gave up", "done"]
    assert "NotFoundError" in events.items[-2][3]


# ------------------------------------------------------------------------------- trainer and summary


def test_stale_groups_are_dropped_and_their_prompts_generated_again(tmp_path: Path) -> None:
    """The safety net of the staleness bound: a READY group older than the bound would wait forever;
    the trainer drops it and hands its prompt to the workers again, so the prompt is not lost."""
    args = argparse.Namespace(max_staleness=2, batch_groups=4, lr=0.01, seed=0)
    with trajflight.LocalCluster(servers=1, processes=False, capacity="64MiB") as cluster:
        run = DemoRun(args, cluster, tmp_path, note=lambda line: None)
        run.client.open_job(JOB, 1)
        writer = run.client.writer(JOB, 1, writer_id="w")
        for prompt, version in ((7, 0), (8, 5)):
            writer.policy_version = version
            run.client.controller.announce_policy(JOB, version)
            writer.put(
                prompt_ids=[1, 2],
                response_ids=[[3], [3]],
                response_logprobs=[[-1.0], [-1.0]],
                reward=[0.0, 1.0],
                advantage=[-1.0, 1.0],
                sample_ids=[f"p{prompt}/0", f"p{prompt}/1"],
            )
        run.version = 5
        inc = _FakeIncarnation()
        assert run._drop_stale(run.client.trainer(JOB), inc)
        assert inc.dispatched == [7]
        assert run.tally.dropped_stale == 1
        assert run.client.controller.counts(JOB)["READY"] == 1  # the fresh group stays for the trainer


class _FakeIncarnation:
    def __init__(self) -> None:
        self.outstanding: set[int] = {7, 8}
        self.dispatched: list[int] = []

    def dispatch(self, prompts: list[int]) -> None:
        self.dispatched += prompts
        self.outstanding.update(prompts)


def _tally(fenced: int) -> Tally:
    tally = Tally(
        lineage=list(range(4)), curve=[StepRecord(1, 0.1, (0,), 10, 9.0), StepRecord(2, 0.9, (1,), 10, 1.0)]
    )
    tally.workers = {1: 3, 2: 3}
    tally.crashed_after, tally.rolled_back = 2, 1
    for w in range(3):
        tally.endings[(1, w)] = ("fenced", "put: StaleFenceError: ...") if w < fenced else ("done", "")
        tally.endings[(2, w)] = ("done", "")
    return tally


def test_summary_fails_unless_every_stale_writer_was_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """issue 19: the summary reported OK while counting 2 stale writers refused instead of 3."""
    kwargs: dict[str, Any] = {
        "groups": 4,
        "counts": {},
        "usage": (0, 0),
        "elapsed": 1.0,
        "config": "test",
        "resumed": True,
        "staleness_bound": 4,
    }
    assert print_summary(_tally(3), **kwargs)
    assert "stale writers refused" in capsys.readouterr().out
    assert not print_summary(_tally(2), **kwargs)
    out = capsys.readouterr().out
    assert re.search(r"stale writers refused\s+2 of 3", out)
    assert "not every stale writer was refused" in out


def test_what_a_restore_reports_is_read_in_one_place() -> None:
    tally = Tally()
    note_restore(tally, {"READY": 4, "COMMITTED": 0, "lost": 2, "purged": 3})
    assert tally.restore == {"READY": 4, "lost": 2, "purged": 3}
    assert tally.orphans_purged == 3


def test_demo_refuses_options_that_cannot_work(capsys: pytest.CaptureFixture[str]) -> None:
    """A crash planned after the run's last step would never happen, and the resume checks would then
    judge a run that did not resume: refused before anything starts."""
    from trajflight.cli import main

    assert main(["demo", "--groups", "16", "--resume", "--crash-after", "6"]) == 2
    assert "--crash-after must be at least 1 and come before the run's end" in capsys.readouterr().err
    assert main(["demo", "--samples", "1"]) == 2
