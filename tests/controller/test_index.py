"""The READY index: order, filters, lazy deletion, and cost proportional to what is taken."""

from __future__ import annotations

from trajflight.controller._index import ReadyIndex


def _index(valid: dict[str, int]) -> tuple[ReadyIndex[str], dict[str, int]]:
    calls = {"n": 0}

    def is_valid(key: str, seq: int) -> bool:
        calls["n"] += 1
        return valid.get(key) == seq

    return ReadyIndex(is_valid), calls


def test_fifo_across_buckets_and_front_insertions_first():
    valid: dict[str, int] = {}
    index, _ = _index(valid)
    for i, (version, cols) in enumerate([(0, "a"), (1, "a"), (0, "ab"), (1, "a")]):
        valid[f"g{i}"] = index.push(f"g{i}", version, frozenset(cols))
    valid["back"] = index.push("back", 0, frozenset("a"), front=True)
    assert index.take(10) == ["back", "g0", "g1", "g2", "g3"]


def test_filters_version_columns_and_budget():
    valid: dict[str, int] = {}
    index, _ = _index(valid)
    for i in range(6):
        valid[f"g{i}"] = index.push(f"g{i}", i % 3, frozenset({"x", "adv"} if i % 2 else {"x"}))
    assert index.take(10, min_version=2) == ["g2", "g5"]
    assert index.take(10, require=frozenset({"adv"})) == ["g1", "g3"]
    assert index.take(10, exact_version=0, lack=frozenset({"adv"})) == ["g0"]
    assert index.take(1, max_tokens=5, tokens_of=lambda k: 3) == ["g4"]


def test_token_budget_stops_before_exceeding():
    valid: dict[str, int] = {}
    index, _ = _index(valid)
    for i in range(5):
        valid[f"g{i}"] = index.push(f"g{i}", 0, frozenset())
    assert index.take(10, max_tokens=7, tokens_of=lambda k: 3) == ["g0", "g1"]
    assert index.take(10, max_tokens=2, tokens_of=lambda k: 3) == ["g2"]  # one oversized group alone


def test_stale_entries_are_skipped_and_dropped():
    valid: dict[str, int] = {}
    index, _ = _index(valid)
    for i in range(4):
        valid[f"g{i}"] = index.push(f"g{i}", 0, frozenset())
    del valid["g0"]
    valid["g1"] = -99  # re-indexed elsewhere since
    assert index.take(10) == ["g2", "g3"]
    assert len(index) == 0


def test_acquire_cost_does_not_grow_with_ready_groups():
    """Regression guard for an O(READY) acquire: count the entries an acquire looks at (no timing)."""
    for n in (1_000, 100_000):
        valid: dict[str, int] = {}
        index, calls = _index(valid)
        for i in range(n):
            valid[f"g{i}"] = index.push(f"g{i}", i % 4, frozenset({"x"}))
        calls["n"] = 0
        assert len(index.take(64, min_version=1)) == 64
        assert calls["n"] <= 64 * 4 * 2  # heads of the eligible buckets per group taken, never O(n)
