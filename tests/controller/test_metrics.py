"""The controller's Prometheus metrics: the ledger collector read at scrape time, calls timed and counted,
refusals by reason, lease expiries."""

from __future__ import annotations

import pytest

from trajflight.controller import ControllerMetrics, LocalController
from trajflight.errors import CapacityExceededError, InvalidRequestError, LeaseExpiredError, StaleFenceError
from trajflight.refusals import REFUSAL_REASONS

from .conftest import FakeClock


@pytest.fixture
def host():
    clock = FakeClock()
    with LocalController(clock=clock, start=False) as controller:
        controller.call(
            "register_server",
            {
                "server_id": "s0",
                "node": "n0",
                "location": "grpc://127.0.0.1:1",
                "capacity_bytes": 10**6,
                "capacity_groups": 100,
            },
        )
        config = {"default_lease_ttl": 10.0, "capacity_groups": 4, "max_group_bytes": 1000}
        controller.call("open_job", {"job_id": "j", "epoch": 2, "config": config})
        controller.call("register_writer", {"job_id": "j", "epoch": 2, "writer_id": "w", "node": "n0"})
        yield controller, clock


def put(controller: LocalController, n: int) -> list:
    grants = []
    for _ in range(n):
        grant = controller.call("allocate", {"job_id": "j", "epoch": 2, "writer_id": "w", "nbytes": 100})
        controller.call(
            "publish",
            {
                "partition": grant.partition,
                "token": grant.token,
                "rows": 2,
                "nbytes": 100,
                "tokens": 4,
                "policy_version": 0,
                "columns": ["response_ids"],
            },
        )
        grants.append(grant)
    return grants


def sample(controller: LocalController, name: str, **labels: str) -> float | None:
    return controller.metrics.registry.get_sample_value(name, labels)


def test_groups_by_state_follow_the_ledger_and_match_counts(host):
    controller, _ = host
    put(controller, 3)
    lease = controller.acquire({"job_id": "j", "owner": "t", "max_groups": 2})
    assert lease is not None
    for step in ("prepare", "start_training", "finish_training", "commit"):
        controller.call(step, {"token": lease.token, "batch_id": "b"})
    counts = controller.call("counts", {"job_id": "j"})
    for state in ("READY", "LEASED", "COMMITTED", "UNKNOWN"):
        assert sample(controller, "trajflight_groups", job="j", state=state) == counts[state]
    assert sample(controller, "trajflight_groups", job="j", state="READY") == 1
    assert sample(controller, "trajflight_groups_published_total") == 3
    assert sample(controller, "trajflight_groups_committed_total", job="j") == 2 == counts["committed_total"]
    assert sample(controller, "trajflight_leases_granted_total") == 1
    assert sample(controller, "trajflight_groups_leased_total") == 2
    assert sample(controller, "trajflight_gc_backlog", job="j") == 2  # committed, not yet deleted
    assert sample(controller, "trajflight_job_held_groups", job="j") == 3
    assert sample(controller, "trajflight_job_capacity_groups", job="j") == 4
    assert sample(controller, "trajflight_controller_server_used_groups", server="s0") == 3
    assert sample(controller, "trajflight_controller_server_capacity_bytes", server="s0") == 10**6
    assert sample(controller, "trajflight_controller_call_seconds_count", op="publish") == 3
    assert sample(controller, "trajflight_controller_calls_total", op="commit", outcome="ok") == 1


def test_an_expired_lease_is_counted_and_its_training_groups_show_as_unknown(host):
    controller, clock = host
    put(controller, 2)
    lease = controller.acquire({"job_id": "j", "owner": "t", "max_groups": 2})
    first = lease.groups[0].partition
    controller.call("prepare", {"token": lease.token, "batch_id": "b", "partitions": [first]})
    controller.call("start_training", {"token": lease.token, "batch_id": "b"})
    assert sample(controller, "trajflight_live_leases", job="j") == 1
    clock.advance(60)
    controller.sweep()
    assert sample(controller, "trajflight_leases_ended_total", reason="expired") == 1
    assert sample(controller, "trajflight_unknown_groups", job="j") == 1
    assert sample(controller, "trajflight_groups", job="j", state="READY") == 1
    assert sample(controller, "trajflight_live_leases", job="j") == 0


def test_refusals_are_counted_by_reason(host):
    controller, clock = host
    for reason in REFUSAL_REASONS:
        assert sample(controller, "trajflight_controller_refusals_total", reason=reason) == 0
    with pytest.raises(StaleFenceError):
        controller.call("open_job", {"job_id": "j", "epoch": 1})  # older than epoch 2
    put(controller, 4)
    with pytest.raises(CapacityExceededError):
        controller.call("allocate", {"job_id": "j", "epoch": 2, "writer_id": "w", "nbytes": 100})
    expired = controller.acquire({"job_id": "j", "owner": "t", "max_groups": 1})
    clock.advance(60)
    controller.sweep()
    with pytest.raises(LeaseExpiredError):
        controller.call("renew", {"token": expired.token})
    fenced = controller.acquire({"job_id": "j", "owner": "t", "max_groups": 1})
    controller.call("open_job", {"job_id": "j", "epoch": 3})  # ends the epoch-2 lease
    with pytest.raises(StaleFenceError):  # a zombie of the old epoch
        controller.call("renew", {"token": fenced.token})
    with pytest.raises(InvalidRequestError):
        controller.call("acquire", {"job_id": "j", "owner": "t", "max_groups": 0})  # bad input: no refusal
    refused = {
        r: sample(controller, "trajflight_controller_refusals_total", reason=r) for r in REFUSAL_REASONS
    }
    assert (refused["fenced_epoch"], refused["capacity"]) == (1, 1)
    assert (refused["lease_expired"], refused["stale_token"]) == (1, 1)
    assert sample(controller, "trajflight_controller_calls_total", op="acquire", outcome="error") == 1


def test_count_refusal_is_the_hook_of_credential_checks():
    metrics = ControllerMetrics()
    metrics.count_refusal("unauthenticated")
    metrics.count_refusal("wrong_role")
    get = metrics.registry.get_sample_value
    assert get("trajflight_controller_refusals_total", {"reason": "unauthenticated"}) == 1
    assert get("trajflight_controller_refusals_total", {"reason": "wrong_role"}) == 1
    with pytest.raises(InvalidRequestError):
        metrics.count_refusal("nope")


def test_two_controllers_in_one_process_keep_their_own_registries():
    with LocalController(start=False) as a, LocalController(start=False) as b:
        a.call("open_job", {"job_id": "only-a", "epoch": 1})
        assert a.metrics.registry is not b.metrics.registry
        assert (
            a.metrics.registry.get_sample_value("trajflight_groups", {"job": "only-a", "state": "READY"}) == 0
        )
        assert (
            b.metrics.registry.get_sample_value("trajflight_groups", {"job": "only-a", "state": "READY"})
            is None
        )
