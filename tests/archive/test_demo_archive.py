"""``trajflight demo --archive DIR``: the trained groups land in DIR, and the printed command runs."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

from trajflight.analytics import scan


def test_demo_archives_every_trained_sample_once_and_prints_a_working_sql_command(tmp_path: Path) -> None:
    """Issue 17: the demo run with ``--archive`` must end with every trained sample in the archive
    exactly once and print a ``trajflight sql`` and a ``trajflight report`` command that run on it."""
    archive = tmp_path / "archive"
    cmd = [sys.executable, "-m", "trajflight", "demo", "--workers", "2", "--no-progress", "--groups", "24"]
    result = subprocess.run([*cmd, "--archive", str(archive)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ids = Counter(scan(archive, columns=["sample_id"]).to_table().column("sample_id").to_pylist())
    assert len(ids) == 24 * 8  # --samples defaults to 8
    assert set(ids.values()) == {1}
    (line,) = [x for x in result.stdout.splitlines() if x.strip().startswith("trajflight sql ")]
    argv = shlex.split(line)
    sql = subprocess.run(
        [sys.executable, "-m", "trajflight", *argv[1:], "--csv"], capture_output=True, text=True, timeout=120
    )
    assert sql.returncode == 0, sql.stderr[-2000:]
    rows = sql.stdout.strip().splitlines()
    assert rows[0].startswith("policy_version,samples,reward,staleness")
    assert sum(int(r.split(",")[1]) for r in rows[1:]) == 24 * 8
    (line,) = [x for x in result.stdout.splitlines() if x.strip().startswith("trajflight report ")]
    argv = shlex.split(line)
    command = [sys.executable, "-m", "trajflight", *argv[1:]]
    made = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert made.returncode == 0, made.stderr[-2000:]
    assert "(6 of 6 figures drawn)" in made.stdout  # the demo's archive holds rows, facts and timeline
    assert (tmp_path / "report.html").read_text().count('<img alt="') == 6
