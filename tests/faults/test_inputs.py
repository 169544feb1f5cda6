"""Scenarios: a misbehaving client sends out-of-range and malformed requests to the controller and the
storage servers in the middle of a run. Each must be refused, and the run must go on untouched (the
fuzzing suite checks that each refusal is the right typed error; here the run is what is checked)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from fault_audit import Scenario

from trajflight.errors import TrajflightError

pytestmark = pytest.mark.timeout(120)


def _acked(proc) -> int:
    return sum(1 for e in proc.events() if e["ev"] == "acked")


def test_out_of_range_epoch_from_a_client_cannot_fence_the_job(shared_plane, job):
    """Issue 14 item 11: open_job with epoch 2**63 or 2**70 must be refused (out of range) and must not
    fence the job: its writer keeps putting, every group is trained."""
    sc = Scenario(shared_plane, job)
    sc.open()
    w = sc.writer("w0", groups=6, sleep=0.2)
    w.wait_event("acked")
    for bad in (2**63, 2**70):
        try:
            sc.client.open_job(job, bad, sc.config)
            sc.violation("input", f"open_job with epoch {bad} was accepted")
        except TrajflightError:
            pass
    sc.trainer("t0")
    sc.settle()
    if _acked(w) != 6:
        sc.violation("input", f"the writer was stopped by the refused epochs: {_acked(w)} of 6 acknowledged")
    sc.verify()


BAD_TICKETS = [
    b"",
    b"{",
    b'{"v": 1.0, "groups": []}',
    b"[" * 100_000,
    json.dumps({"v": 1, "groups": [{"job_id": "x" * 10_000_000, "epoch": 1, "group_id": 0}]}).encode(),
]


def test_malformed_requests_mid_run_leave_the_run_intact(shared_plane, job):
    """Malformed tickets, bodies 100k levels deep, a 10 MB job id, a fence and a delete with numbers past
    int64, sent to a storage server while a writer and a trainer run: each is refused, the server stays
    up, and the run completes with nothing lost, doubled or left."""
    sc = Scenario(shared_plane, job)
    sc.open()
    w = sc.writer("w0", groups=8, sleep=0.1)
    sc.trainer("t0")
    w.wait_event("acked")
    key = {"job_id": job, "epoch": 1, "group_id": 0}
    actions = [
        ("fence", {"v": 1, "job_id": job, "min_epoch": 2**70}),
        ("fence", {"v": 1, "job_id": job, "min_epoch": 2**70, "purge": True}),
        ("delete", {"v": 1, "groups": [{**key, "generation": 2**70}]}),
        ("delete", {"v": 1, "groups": [{**key, "group_id": 2**70, "generation": 1}]}),
        ("advance_generation", {"v": 1, "groups": [{**key, "group_id": -1, "generation": 1}]}),
    ]
    raw = flight.FlightClient(shared_plane.servers[0].location)
    try:
        for ticket in BAD_TICKETS:
            try:
                raw.do_get(flight.Ticket(ticket)).read_all()
                sc.violation("input", f"do_get served a malformed ticket {ticket[:60]!r}")
            except flight.FlightError:
                pass
            except pa.ArrowException as exc:  # not a Flight error: the refusal itself broke the call
                sc.violation("input", f"a malformed ticket {ticket[:60]!r} broke the call: {str(exc)[:200]}")
        for name, body in [*actions, ("fence", "[" * 100_000)]:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            try:
                list(raw.do_action(flight.Action(name, data)))
                sc.violation("input", f"action {name} accepted {data[:80]!r}")
            except flight.FlightError:
                pass
            except pa.ArrowException as exc:
                sc.violation("input", f"action {name} with {data[:60]!r} broke the call: {str(exc)[:200]}")
    finally:
        raw.close()
    sc.settle()
    if _acked(w) != 8:
        sc.violation(
            "input", f"the writer was stopped by the malformed requests: {_acked(w)} of 8 acknowledged"
        )
    sc.verify()
