"""The tier switches of ``bench/_codec_tiers.py`` name what the codec has: a renamed or deleted tier must
take its switch (and its BENCHMARKS.md figure) with it, or the benchmark would measure nothing."""

from __future__ import annotations

import pytest

from trajflight.bench._codec_tiers import SWITCHES, operations
from trajflight.workload import make_workload


@pytest.mark.parametrize("switch", SWITCHES, ids=[s.name for s in SWITCHES])
def test_every_switch_patches_an_existing_attribute_and_serves_a_known_operation(switch):
    ops = operations(make_workload(1, 2, seed=0, response_median=8))
    assert switch.operation in ops
    for owner, attribute, _ in switch.patches:
        assert hasattr(owner, attribute), f"{owner!r} has no {attribute!r}"
    with switch.off():
        ops[switch.operation]()  # the operation still runs with the tier switched off


def test_another_trees_codec_loads_beside_this_one(tmp_path):
    """``bench_codec.py --against`` loads another tree's codec/ as its own package, imports rewritten, and
    writes nothing into that tree (no bytecode that this tree's import could pick up)."""
    import shutil
    from pathlib import Path

    import trajflight.codec
    from trajflight.bench._codec_against import NAME, compare, load_codec

    other_root = tmp_path / "codec"
    shutil.copytree(
        Path(trajflight.codec.__file__).parent, other_root, ignore=shutil.ignore_patterns("__pycache__")
    )
    other = load_codec(other_root)
    assert other.__name__ == NAME
    assert other.encode_group is not trajflight.codec.encode_group
    assert other.encode_group.__module__ == f"{NAME}._encode"
    rows = compare(trajflight.codec, other, make_workload(2, 2, seed=0, response_median=8), rounds=2, calls=1)
    assert {r["operation"] for r in rows} >= {"encode_group x G (numpy)", "validate_group x G (after IPC)"}
    assert not list(other_root.rglob("*.pyc"))
