"""The main job runs with small settings, and its summary says what it did."""

from __future__ import annotations

import re
import subprocess
import sys


def _demo(*args: str) -> str:
    cmd = [
        sys.executable,
        "-m",
        "trajflight",
        "demo",
        "--groups",
        "24",
        "--workers",
        "2",
        "--batch-groups",
        "4",
        "--response-median",
        "64",
        "--rollout-time",
        "0.02",
        "--no-progress",
        *args,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return re.sub(r" {2,}", "  ", result.stdout)  # the summary's column width depends on its labels


def test_demo_trains_every_group_once_and_frees_capacity():
    out = _demo()
    assert "groups trained (lineage)  24" in out
    assert "capacity held at end  0 bytes, 0 groups" in out
    assert "result: OK - nothing lost, nothing trained twice" in out


def test_demo_resume_crashes_restores_and_still_trains_each_group_once():
    out = _demo("--resume", "--crash-after", "3", "--checkpoint-every", "2")
    assert "(with crash and resume)" in out
    assert "steps_rolled_back=1" in out
    assert "trained twice  0" in out
    assert "result: OK - nothing lost, nothing trained twice" in out
