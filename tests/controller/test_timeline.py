"""The controller's timeline: bounded samples of every job's counts, spanning the whole run."""

from __future__ import annotations

import pytest

from trajflight.controller import LocalController
from trajflight.controller._timeline import Timeline


def test_samples_are_spaced_by_the_interval_and_taken_only_when_due():
    timeline = Timeline(interval=1.0, capacity=8)
    calls = []

    def counts() -> dict[str, dict[str, int]]:
        calls.append(1)
        return {"j": {"READY": len(calls)}}

    assert [timeline.sample(t, counts) for t in (0.0, 0.5, 1.0, 1.2, 2.5)] == [True, False, True, False, True]
    assert len(calls) == 3  # counts() is not called for a sample that is not due
    assert [(s["t"], s["jobs"]["j"]["READY"]) for s in timeline.samples()] == [(0.0, 1), (1.0, 2), (2.5, 3)]


def test_a_full_timeline_is_thinned_and_keeps_its_first_sample():
    timeline = Timeline(interval=1.0, capacity=4)
    for t in range(40):
        timeline.sample(float(t), lambda: {})
    times = [s["t"] for s in timeline.samples()]
    assert len(times) < 4
    assert times[0] == 0.0
    assert times[-1] >= 24.0  # the history still reaches the recent end of the run
    assert timeline.interval > 1.0


def test_samples_are_copies():
    timeline = Timeline()
    timeline.sample(0.0, lambda: {"j": {"READY": 1}})
    timeline.samples()[0]["jobs"]["j"]["READY"] = 99
    assert timeline.samples()[0]["jobs"]["j"]["READY"] == 1


@pytest.mark.parametrize(("interval", "capacity"), [(0.0, 8), (-1.0, 8), (1.0, 1)])
def test_bad_settings_are_refused(interval, capacity):
    with pytest.raises(ValueError, match="interval > 0 and capacity >= 2"):
        Timeline(interval, capacity)


def test_the_sweeper_samples_every_jobs_counts():
    clock = [100.0]
    host = LocalController(clock=lambda: clock[0], start=False)  # no sweeper thread: passes by hand
    try:
        host.call("open_job", {"job_id": "j", "epoch": 1}, timeout=None)
        host.sweep()
        clock[0] += 0.3
        host.sweep()
        samples = host.timeline()
    finally:
        host.close()
    assert [s["t"] for s in samples] == [100.0, 100.3]
    assert samples[0]["jobs"] == {"j": {}}  # an open job with no group yet: every count is 0, left out
