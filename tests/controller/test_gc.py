"""The GC list: due order, back-off, hand-out timeout, confirmation."""

from __future__ import annotations

from trajflight.controller._gc import GcList


def test_failures_back_off_exponentially_up_to_the_cap():
    gc: GcList[str] = GcList(retry_initial=0.5, retry_max=2.0, timeout=30.0)
    gc.add("a", 0.0)
    now = 0.0
    delays = []
    for _ in range(5):
        (entry,) = gc.take(now, 10)
        gc.done("a", False, now, "down")
        due = gc.next_due()
        delays.append(due - now)
        assert gc.take(due - 0.01, 10) == []
        now = due
    assert delays == [0.5, 1.0, 2.0, 2.0, 2.0]
    assert entry.last_error == "down"


def test_handed_out_and_unreported_comes_back_after_timeout():
    gc: GcList[str] = GcList(timeout=5.0)
    gc.add("a", 0.0)
    assert len(gc.take(0.0, 10)) == 1
    assert gc.take(4.9, 10) == []
    (again,) = gc.take(5.0, 10)
    assert again.attempts == 2


def test_confirmation_removes_and_late_reports_are_ignored():
    gc: GcList[str] = GcList()
    gc.add("a", 0.0)
    gc.add("a", 0.0)  # idempotent
    gc.add("b", 0.0)
    assert [e.key for e in gc.take(0.0, 1)] == ["a"]
    assert gc.done("a", True, 0.0)
    assert not gc.done("a", True, 0.0)
    assert "a" not in gc
    assert len(gc) == 1
    assert [e.key for e in gc.take(0.0, 10)] == ["b"]
