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
