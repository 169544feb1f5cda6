"""The README's Analytics example runs as written, with real DuckDB and Polars, and prints what its
comments say (``tests/test_readme.py`` runs every python block; this one checks this block's output)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_analytics_example_prints_what_it_says(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "trajflight.analytics" in b]
    exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "[(0, 0.0), (1, 0.5)]" in out
    assert "(2, 3) [3, 3]" in out
    assert "# [(0, 0.0), (1, 0.5)]" in block
    assert "# (2, 3) [3, 3]" in block


def test_the_readme_names_both_commands_and_the_view():
    text = README.read_text()
    for needle in ("## Analytics", "`trajflight sql SOURCE", "`trajflight export SOURCE", "trajectories"):
        assert needle in text
