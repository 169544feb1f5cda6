"""The controller as a named async Ray actor, in a real local Ray runtime (the session's ``ray_runtime``)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from trajflight.controller import ControllerClient, GroupState, Publication, connect_ray, start_ray_controller
from trajflight.errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    InvalidRequestError,
    LeaseExpiredError,
    NotFoundError,
    StaleFenceError,
    UnavailableError,
)

pytestmark = pytest.mark.ray


@pytest.fixture
def controller(ray_runtime, tmp_path):
    """A fresh controller actor in its own namespace, with a state directory; killed afterwards."""
    namespace = f"trajflight-test-{uuid.uuid4().hex[:8]}"
    client = start_ray_controller(
        name="controller", namespace=namespace, state_dir=str(tmp_path), timeout=30.0
    )
    client.register_server(
        "s0", node="n0", location="grpc://127.0.0.1:1", capacity_bytes=10**9, capacity_groups=10**6
    )
    client.open_job("j", 1, {"default_lease_ttl": "30s"})
    client.register_writer("j", 1, "w0", node="n0")
    client.test_namespace = namespace
    yield client
    ray_runtime.kill(client.transport.actor, no_restart=True)


def _put(client: ControllerClient, n: int) -> list:
    out = []
    for _ in range(n):
        grant = client.allocate("j", 1, "w0", nbytes=100)
        client.publish(
            grant.partition,
            token=grant.token,
            rows=8,
            nbytes=100,
            tokens=10,
            policy_version=0,
            columns=("a",),
        )
        out.append(grant.partition)
    return out


def _train(client: ControllerClient, lease) -> None:
    """Take every group of ``lease`` through prepare, training and commit as batch ``b``."""
    for step in (client.prepare, client.start_training, client.finish_training, client.commit):
        step(lease.token, "b")


def _wait_for_restart(client: ControllerClient, old_pid: int, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = client.transport.info(5.0)
        except Exception:  # restarting: RayActorError / UnavailableError until the new actor is up
            time.sleep(0.2)
            continue
        if info["pid"] != old_pid:
            return info
        time.sleep(0.2)
    raise AssertionError("the controller actor did not restart")


def test_long_poll_acquire_does_not_block_other_callers(controller, ray_runtime):
    actor = controller.transport.actor
    kwargs = {
        "job_id": "j",
        "owner": "t",
        "max_groups": 2,
        "ttl": None,
        "max_tokens": None,
        "max_staleness": None,
        "require": (),
        "lack": (),
    }
    pending = actor.acquire.remote(kwargs, 20.0)  # a trainer long-polls for 2 groups
    t0 = time.monotonic()
    for _ in range(5):  # other callers proceed meanwhile
        assert controller.counts("j")["READY"] == 0
    (part,) = _put(controller, 1)
    assert time.monotonic() - t0 < 10.0
    status, lease = ray_runtime.get(pending, timeout=20.0)
    assert status == "ok"
    assert lease.partitions == (part,)


def test_long_poll_through_the_client_times_out_with_none(controller):
    t0 = time.monotonic()
    assert controller.acquire("j", "t", max_groups=1, wait=0.3) is None
    assert time.monotonic() - t0 >= 0.25


def test_typed_errors_and_deadlines_through_ray(controller):
    (part,) = _put(controller, 1)
    with pytest.raises(StaleFenceError):
        controller.allocate("j", 0, "w0", nbytes=1)
    with pytest.raises(NotFoundError):
        controller.renew(10**18)
    with pytest.raises(DeadlineExceededError):
        controller.counts("j", timeout=1e-6)
    with pytest.raises(NotFoundError):
        connect_ray("no-such-controller", namespace="nowhere")
    same = connect_ray("controller", namespace=controller.test_namespace)  # another process would do this
    assert same.group(part).state is GroupState.READY


@pytest.mark.slow
def test_killed_actor_restarts_with_larger_tokens_and_training_groups_unknown(controller, ray_runtime):
    parts = _put(controller, 4)
    training = controller.acquire("j", "t", max_groups=1)
    controller.prepare(training.token, "b")
    controller.start_training(training.token, "b")
    leased = controller.acquire("j", "t", max_groups=1)
    before = controller.transport.info(10.0)

    ray_runtime.kill(controller.transport.actor, no_restart=False)
    after = _wait_for_restart(controller, before["pid"])

    assert after["incarnation"] == before["incarnation"] + 1
    assert after["recovered_leases"] == 2
    counts = controller.counts("j")
    assert counts["UNKNOWN"] == 1
    assert counts["READY"] == 3
    assert controller.group(training.partitions[0]).state is GroupState.UNKNOWN
    lease = controller.acquire("j", "t", max_groups=10)
    assert lease.token > leased.token > training.token
    assert set(lease.partitions) == set(parts) - set(training.partitions)
    with pytest.raises(LeaseExpiredError):
        controller.finish_training(training.token, "b")
    with pytest.raises(StaleFenceError):
        controller.release(leased.token, partitions=leased.partitions)
    controller.resolve("j", training.partitions, "requeue")
    again = controller.acquire("j", "t", max_groups=10)
    assert again.partitions == training.partitions
    assert again.token > lease.token


def test_sweeper_in_the_actor_confirms_deletes_and_releases_capacity(controller):
    _put(controller, 3)
    lease = controller.acquire("j", "t", max_groups=3)
    _train(controller, lease)
    deadline = time.monotonic() + 20.0
    while controller.counts("j")["deleted"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert controller.counts("j")["deleted"] == 3
    assert controller.usage("j") == (0, 0)
    assert controller.gc_list("j") == ()


def test_batched_calls_share_one_round_trip(controller):
    grants = controller.transport.invoke_many(
        [("allocate", {"job_id": "j", "epoch": 1, "writer_id": "w0", "nbytes": 10})] * 5, 10.0
    )
    assert [g.partition.group_id for g in grants] == [0, 1, 2, 3, 4]
    assert [g.token for g in grants] == sorted(g.token for g in grants)
    with pytest.raises(StaleFenceError):
        controller.transport.invoke_many(
            [("allocate", {"job_id": "j", "epoch": 0, "writer_id": "w0", "nbytes": 10})], 10.0
        )


def test_batched_allocation_is_one_actor_call_with_typed_refusals(controller):
    grants = controller.allocate_many("j", 1, "w0", nbytes=[10, 20, 30])
    assert [(g.partition.group_id, g.nbytes) for g in grants] == [(0, 10), (1, 20), (2, 30)]
    assert [g.token for g in grants] == sorted({g.token for g in grants})
    with pytest.raises(StaleFenceError):
        controller.allocate_many("j", 0, "w0", nbytes=[10])
    with pytest.raises(InvalidRequestError, match="nbytes is empty"):
        controller.allocate_many("j", 1, "w0", nbytes=[])
    assert controller.usage("j") == (60, 3)


def test_batched_publication_is_one_actor_call_with_typed_refusals(controller):
    grants = controller.allocate_many("j", 1, "w0", nbytes=[100, 100])
    items = [Publication(g.partition, g.token, 8, 60, 10, 0, ("a",)) for g in grants]
    infos = controller.publish_many(items)
    assert [(i.partition, i.state, i.nbytes) for i in infos] == [
        (g.partition, GroupState.READY, 60) for g in grants
    ]
    assert controller.publish_many(items) == infos  # a retry is answered the same
    with pytest.raises(AlreadyExistsError):
        controller.publish_many([Publication(grants[0].partition, grants[0].token, 9, 60, 10, 0, ("a",))])
    with pytest.raises(InvalidRequestError, match="items is empty"):
        controller.publish_many([])
    assert controller.usage("j") == (120, 2)


def test_close_answers_a_parked_acquire_and_a_long_wait_is_cut(controller, ray_runtime):
    """Item 5 on the Ray host: a parked acquire (``wait=1e9``) is answered with UnavailableError when the
    actor closes, instead of holding the caller until the actor is killed under it."""
    actor = controller.transport.actor
    kwargs = {"job_id": "j", "owner": "t", "max_groups": 1}
    pending = actor.acquire.remote(kwargs, 1e9)
    assert ray_runtime.get(actor.acquire.remote(kwargs, float("nan")), timeout=20.0)[0] == "err"
    ready, _ = ray_runtime.wait([pending], timeout=0.5)
    assert not ready  # parked
    ray_runtime.get(actor.close.remote(), timeout=20.0)
    status, error = ray_runtime.get(pending, timeout=20.0)
    assert status == "err"
    assert isinstance(error, UnavailableError)


def test_the_actor_fences_expired_leases_and_retries_failed_fences(ray_runtime, tmp_path):
    """Item 9 on the Ray host: the actor's sweeper hands the fences of an expired lease to its fencer."""

    def fencer(work):  # shipped by value to the actor; fails, so the fence stays listed with its error
        raise ConnectionError(f"server down ({len(work)} groups)")

    namespace = f"trajflight-test-{uuid.uuid4().hex[:8]}"
    client = start_ray_controller(name="c", namespace=namespace, fencer=fencer, timeout=30.0)
    try:
        client.register_server(
            "s0", node="n0", location="grpc://127.0.0.1:1", capacity_bytes=10**9, capacity_groups=10**6
        )
        client.open_job("j", 1)
        client.register_writer("j", 1, "w0", node="n0")
        (part,) = _put(client, 1)
        lease = client.acquire("j", "t", max_groups=1, ttl=0.5)
        deadline = time.monotonic() + 30.0
        while not (fences := client.fence_list()) or fences[0].last_error is None:
            assert time.monotonic() < deadline, "the sweeper did not run the fence"
            time.sleep(0.05)
        (fence,) = fences
        assert fence.partition == part
        assert fence.generation > lease.token
        assert "server down (1 groups)" in fence.last_error
    finally:
        ray_runtime.kill(client.transport.actor, no_restart=True)


def test_a_refused_allocate_with_wait_is_granted_when_the_actors_sweeper_frees_room(controller):
    """The actor awaits capacity for a waiting allocate (as it awaits READY groups for acquire) and grants
    it once the commit's delete is confirmed, long before the wait or the job's retry hint run out."""
    controller.open_job("k", 1, {"capacity_groups": 1, "capacity_retry_after": "600s"})
    controller.register_writer("k", 1, "w0", node="n0")
    grant = controller.allocate("k", 1, "w0", nbytes=100)
    controller.publish(grant.partition, token=grant.token, rows=1, nbytes=100, tokens=1, policy_version=0,
                       columns=())  # fmt: skip
    out: dict = {}
    thread = threading.Thread(
        target=lambda: out.update(grant=controller.allocate("k", 1, "w0", nbytes=100, wait=60, timeout=90))
    )
    thread.start()
    time.sleep(0.5)  # let it park (granted at once instead, had it come late: the test still holds)
    lease = controller.acquire("k", "t", max_groups=1)
    _train(controller, lease)
    thread.join(15.0)  # below MAX_WAIT: a poll that was not woken would still be parked
    assert not thread.is_alive()
    assert out["grant"].partition.group_id == 1
