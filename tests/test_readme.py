"""The README's Python examples run as written (```python blocks; ```py marks fragments).

The Ray example runs on the session's loopback Ray runtime (``ray_runtime``), which ``RayCluster`` uses
when Ray is initialised; the others need nothing but this package.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def _run(block: str) -> None:
    exec(compile(block, str(README), "exec"), {"__name__": "readme"})


def test_readme_python_examples_run(capsys):
    blocks = [b for b in _python_blocks() if "RayCluster(" not in b]
    assert blocks, "the README has no python example"
    for block in blocks:
        _run(block)
    out = capsys.readouterr().out
    assert "torch.Size([6, 7]) [4, 0, 7, 4, 0, 7]" in out
    assert "Partition(job_id='grpo-run', epoch=1, group_id=0) 3 READY" in out
    assert "(0, 0)" in out
    assert "['reward', 'length']" in out  # the Analytics example's report: the figures it could draw


def test_readme_comments_show_what_the_code_prints(capsys):
    """issue 19: the README showed ``Partition('grpo-run', 1, 0)`` where the code prints the fields."""
    text = README.read_text()
    assert "# Partition(job_id='grpo-run', epoch=1, group_id=0) 3 READY" in text
    for field in ("server_id", "nbytes", "policy_version"):
        assert f"`{field}`" in text


@pytest.mark.ray
def test_readme_ray_example_runs_as_written(ray_runtime, capsys):
    """issue 19: the Ray block called ray.init(address="auto") with no Ray running and used an
    unwritable state_dir; it now runs as written (here on the session's Ray)."""
    (block,) = [b for b in _python_blocks() if "RayCluster(" in b]
    _run(block)
    out = capsys.readouterr().out
    assert "ray://" in out
    assert "[1.0, 0.0]" in out
    assert "(0, 0)" in out


def test_readme_lists_every_command_and_extra():
    import tomllib

    from trajflight.cli import COMMANDS

    text = README.read_text()
    for command in COMMANDS:
        assert f"`trajflight {command}" in text, command
    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in extras:
        assert f"| `{extra}` |" in text, extra
    assert "trajflight --version" in text
