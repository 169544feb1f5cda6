"""The README's Python examples run as written (```python blocks; ```py marks fragments)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_python_examples_run(capsys):
    blocks = _python_blocks()
    assert blocks, "the README has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "torch.Size([6, 7]) [4, 0, 7, 4, 0, 7]" in out
    assert "Partition(job_id='grpo-run', epoch=1, group_id=0) 3 READY" in out
    assert "(0, 0)" in out
