"""The README's main job until the demo exists: `trajflight example` runs and checks its promises."""

from __future__ import annotations

import subprocess
import sys

from trajflight.cli import main


def test_example_runs_and_reports_zero_copy(capsys):
    assert main(["example", "--groups", "3", "--samples", "4", "--top-p"]) == 0
    out = capsys.readouterr().out
    assert "Arrow aliases the numpy inputs: True" in out
    assert "sharing Arrow's buffer: True, bit-exact: True" in out


def test_console_entry_point_help():
    result = subprocess.run(
        [sys.executable, "-m", "trajflight", "--help"], capture_output=True, text=True, check=True
    )
    assert "example" in result.stdout


def test_import_trajflight_starts_nothing_heavy():
    code = "import sys, trajflight; print('torch' in sys.modules, 'ray' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]
