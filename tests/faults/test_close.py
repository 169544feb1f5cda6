"""Scenarios: shutting the embedded plane down while a trainer's long poll is parked in the controller
(issue 14 item 5), as ``LocalCluster.close()`` in a user's script and as ``trajflight up`` on SIGTERM."""

from __future__ import annotations

import os
import time

import pytest
from fault_audit import Findings
from faultkit import PY, Children

import trajflight

pytestmark = pytest.mark.timeout(120)


def _park(kids: Children, address: str) -> None:
    """A trainer parked in a long poll that would wait forever (``wait=1e9``) on an empty job."""
    with trajflight.connect(address, timeout=10) as client:
        client.open_job("parked", 1)
    args = ["--address", address, "--job", "parked", "--owner", "parked", "--wait", "1e9"]
    parked = kids.spawn("parked", "proc_trainer.py", *args, "--max-leases", "1")
    parked.wait_event("polling")
    time.sleep(1.5)  # the acquire reaches the controller and parks there (not a timing assertion)


def test_local_cluster_close_returns_while_an_acquire_is_parked(tmp_path):
    """Issue 14 item 5: LocalCluster.close() in a user's script returns (within a generous bound) while
    another process's acquire with wait=1e9 is parked in its controller, and leaves nothing in /dev/shm."""
    findings = Findings()
    kids = Children(tmp_path)
    close_file = tmp_path / "close"
    try:
        driver = kids.spawn(
            "driver", "proc_driver.py", "--servers", "1", "--groups", "0", "--close-file", str(close_file)
        )
        up = driver.wait_event("up", timeout=60)
        _park(kids, up["address"])
        close_file.touch()
        if findings.expect_event("hang", driver, "closed", 25) is not None:
            findings.expect(
                "orphan", "its arena directory removed", lambda: not os.path.exists(up["shm_dir"]), 10
            )
    finally:
        kids.close()
    findings.finish()


def test_trajflight_up_stops_on_sigterm_while_an_acquire_is_parked(tmp_path):
    """Issue 14 item 5: ``trajflight up`` exits on SIGTERM (within a generous bound) while an acquire with
    wait=1e9 is parked in its controller."""
    findings = Findings()
    kids = Children(tmp_path)
    try:
        up = kids.run(
            "up", [PY, "-m", "trajflight", "up", "--servers", "1", "--capacity", "64MiB"], pipe_stdout=True
        )
        address = up.first_line(60)
        _park(kids, address)
        up.killed = True
        if up.terminate(25) is None:
            findings.violation(
                "hang", "trajflight up did not exit within 25 s of SIGTERM with an acquire parked"
            )
    finally:
        kids.close()
    findings.finish()
