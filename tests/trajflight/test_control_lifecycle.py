"""Long polls and the lifecycle of the embedded controller (issue 14 items 5 and 6).

Item 5: ``LocalCluster.close()`` (and so ``trajflight up``) shut the Flight control server down before
the controller, and the server waits for its calls: a trainer parked in ``lease(wait=30)`` held the close
for the whole wait, and a raw acquire with ``wait=1e9`` held it forever. Now the controller closes first
and answers parked acquires with UnavailableError, the control server's own shutdown wakes them too, and a
host parks one poll for at most ``MAX_WAIT`` seconds (the client polls again for longer waits).

Item 6: a trainer killed while parked in ``try_lease(wait=20)`` left a handler behind that leased the
next group put, so live trainers waited out its TTL. Now the handler notices that its caller is gone and
never leaves it a lease.

Every test bounds its hang with a generous pytest timeout and asserts outcomes, never durations.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow.flight as flight
import pytest

import trajflight
from trajflight import _rpc
from trajflight._control import ControlServer
from trajflight.controller import ControllerClient, Lease, LocalController
from trajflight.controller._host import MAX_WAIT
from trajflight.errors import TrajflightError, UnavailableError
from trajflight.flight_server._errors import translate_errors

from .conftest import put_groups, wait_until

# A trainer that long-polls an empty job; prints what its lease call ended with.
PARKED_TRAINER = textwrap.dedent(
    """
    import json, sys
    import trajflight
    address, job, wait, transport = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    client = trajflight.connect(address, timeout=10, transport=transport)
    print(json.dumps({"parking": True}), flush=True)
    try:
        batch = client.trainer(job).try_lease(1, wait=wait)
        out = {"lease": None if batch is None else [list(p) for p in batch.partitions]}
    except Exception as exc:
        out = {"error": type(exc).__name__, "message": str(exc)}
    print(json.dumps(out), flush=True)
    """
)


def _child(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", PARKED_TRAINER, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def plane() -> Iterator[trajflight.LocalCluster]:
    cluster = trajflight.LocalCluster(servers=1, capacity="64MiB", processes=False, timeout=20.0).start()
    try:
        yield cluster
    finally:
        cluster.close()


def _raw_acquire(location: str, kwargs: dict[str, Any], wait: float, out: dict[str, Any]) -> None:
    """A plain Flight client's long poll, as any other language would send it."""
    client = flight.FlightClient(location)
    try:
        body = _rpc.dumps({"kwargs": kwargs, "wait": wait})
        with translate_errors("acquire"):
            results = list(client.do_action(flight.Action("acquire", body)))
        out["result"] = [_rpc.loads(r.body.to_pybytes()) for r in results]
    except TrajflightError as exc:
        out["error"] = exc
    finally:
        client.close()


# A client on the controller's host calls over its same-host socket; transport="flight" over Flight.
ROUTES = ["auto", "flight"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ROUTES)
def test_close_returns_while_a_trainer_process_is_parked_in_lease(plane, transport):
    """``lease(wait=30)`` held ``LocalCluster.close()`` (and ``trajflight up``) for 29.7 s."""
    plane.client().open_job("parked", 1)
    child = _child(plane.address, "parked", 30, transport)
    try:
        assert json.loads(child.stdout.readline())["parking"]
        controller = plane.controller
        wait_until(lambda: controller.waiting == 1, "the trainer is parked")
        plane.close()  # must not wait the poll out
        assert plane.controller is None
        outcome = json.loads(child.stdout.readline() or "{}")
    finally:
        child.kill()
        child.communicate(timeout=30)
    assert outcome.get("error") == "UnavailableError", outcome
    assert "shutting down" in outcome["message"]


@pytest.mark.timeout(90)
def test_close_returns_while_a_raw_acquire_waits_a_billion_seconds(plane):
    """A raw Flight acquire with ``wait=1e9`` held ``LocalCluster.close()`` forever (15 minutes seen)."""
    plane.client().open_job("raw", 1)
    out: dict[str, Any] = {}
    kwargs = {"job_id": "raw", "owner": "raw", "max_groups": 1}
    poll = threading.Thread(target=_raw_acquire, args=(plane.address, kwargs, 1e9, out), daemon=True)
    poll.start()
    controller = plane.controller
    wait_until(lambda: controller.waiting == 1, "the acquire is parked")
    plane.close()
    poll.join(30.0)
    assert not poll.is_alive()
    assert isinstance(out.get("error"), UnavailableError), out


@pytest.mark.timeout(90)
def test_the_control_servers_own_shutdown_answers_parked_acquires():
    """A control server shut down before its controller closes does not wait for parked polls either."""
    with LocalController() as controller:
        client = ControllerClient(controller)
        client.open_job("j", 1)
        server = ControlServer(controller)
        out: dict[str, Any] = {}
        kwargs = {"job_id": "j", "owner": "raw", "max_groups": 1}
        poll = threading.Thread(target=_raw_acquire, args=(server.location, kwargs, 1e9, out), daemon=True)
        poll.start()
        wait_until(lambda: controller.waiting == 1, "the acquire is parked")
        server.shutdown()
        poll.join(30.0)
        assert not poll.is_alive()
        assert isinstance(out.get("error"), UnavailableError), out
        assert client.counts("j")["LEASED"] == 0


def test_a_host_parks_one_poll_for_at_most_max_wait_and_the_client_polls_again():
    """The server-side bound: a longer wait is cut to MAX_WAIT; ControllerClient re-polls up to ``wait``."""
    waits: list[float] = []

    class Recording:
        def __init__(self, host: LocalController) -> None:
            self.host = host

        def invoke(self, method: str, kwargs: dict[str, Any], timeout: float) -> Any:
            return self.host.call(method, kwargs, timeout=timeout)

        def acquire(self, kwargs: dict[str, Any], wait: float, timeout: float) -> Lease | None:
            waits.append(wait)
            return None  # as a host answers when its poll ran out empty

    with LocalController() as host:
        client = ControllerClient(Recording(host), timeout=1000.0)  # type: ignore[arg-type]
        assert client.acquire("j", "t", max_groups=1, wait=2.5 * MAX_WAIT) is None
    assert len(waits) == 3
    assert max(waits) == MAX_WAIT


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ROUTES)
def test_a_killed_trainers_long_poll_leaves_the_next_group_to_live_trainers(plane, transport):
    """Item 6: SIGKILL a trainer parked in ``try_lease(wait=20)``, put a group: a live trainer gets it at
    once, instead of waiting out the TTL of a lease granted to the dead poll."""
    client = plane.client()
    client.open_job("abandoned", 1, {"default_lease_ttl": "60s"})
    child = _child(plane.address, "abandoned", 20, transport)
    controller = plane.controller
    try:
        assert json.loads(child.stdout.readline())["parking"]
        wait_until(lambda: controller.waiting == 1, "the trainer is parked")
        child.kill()
        child.wait(30)
    finally:
        child.kill()
        child.communicate(timeout=30)
    # The dead poll's handler notices (its call is cancelled) long before its 20 s wait would end.
    wait_until(lambda: controller.waiting == 0, "the dead poll gave up", timeout=15.0)
    put_groups(client.writer("abandoned", 1), 1)
    batch = client.trainer("abandoned").try_lease(1, wait=15)  # well within the dead poll's TTL
    assert batch is not None, client.controller.counts("abandoned")
    batch.release()
    assert controller.call("live_leases", {"job_id": "abandoned"}) == ()


def test_a_lease_granted_as_its_caller_left_is_released_at_once():
    """The race of item 6: the caller leaves between the check before the grant and the grant."""
    with LocalController() as host:
        client = ControllerClient(host)
        client.register_server("s", node="n", location="grpc://x", capacity_bytes=100, capacity_groups=9)
        client.open_job("j", 1)
        client.register_writer("j", 1, "w", node="n")
        grant = client.allocate("j", 1, "w", nbytes=10)
        client.publish(
            grant.partition, token=grant.token, rows=1, nbytes=10, tokens=1, policy_version=0, columns=()
        )
        looks = iter([False, True])  # still there before the grant, gone right after it
        kwargs = {"job_id": "j", "owner": "gone", "max_groups": 1}
        assert host.acquire(kwargs, wait=1.0, abandoned=lambda: next(looks)) is None
        assert client.counts("j")["READY"] == 1
        assert client.acquire("j", "live", max_groups=1) is not None


def test_a_lease_whose_reply_was_not_delivered_is_released():
    """The last window: the grant's reply cannot be written (the caller is gone), so Flight stops
    iterating and closes the reply generator without resuming it: the lease goes back."""
    with LocalController() as host:
        client = ControllerClient(host)
        client.register_server("s", node="n", location="grpc://x", capacity_bytes=100, capacity_groups=9)
        client.open_job("j", 1)
        client.register_writer("j", 1, "w", node="n")
        grant = client.allocate("j", 1, "w", nbytes=10)
        client.publish(
            grant.partition, token=grant.token, rows=1, nbytes=10, tokens=1, policy_version=0, columns=()
        )
        server = ControlServer(host)
        try:
            lease = client.acquire("j", "gone", max_groups=1)
            reply = server._deliver(lease, _rpc.dumps(lease))
            next(reply)  # handed to gRPC, whose write then fails
            reply.close()
            assert client.counts("j")["READY"] == 1
            delivered = server._deliver(client.acquire("j", "live", max_groups=1), b"")
            assert list(delivered) == [b""]  # delivered: the lease stays
            assert client.counts("j")["LEASED"] == 1
        finally:
            server.shutdown()


def _record_waits(host: Any, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """From now on, whether each wait of the host's condition returned notified (``True``) or timed out;
    the abandonment check's interval raised far beyond the test."""
    from trajflight.controller import _host

    monkeypatch.setattr(_host, "POLL_CHECK", 1000.0)
    cond = host._cond
    waits: list[bool] = []
    real_wait = cond.wait

    def recording_wait(timeout: float | None = None) -> bool:
        notified = real_wait(timeout)
        waits.append(notified)
        return notified

    monkeypatch.setattr(cond, "wait", recording_wait)
    return waits


def _nothing_overdue(host: Any) -> bool:
    """Whether the host's ledger has no deadline already past (a due delete the sweeper has not taken)."""
    with host._cond:
        due = host._core.ledger.next_deadline()
        return due is None or due > host._core.clock()


def _parked_lease_woken_by(host: Any, trainer: Any, waits: list[bool], put: Any) -> None:
    """Park ``trainer`` in ``lease(1)``, run ``put`` (which returns the put groups' metadata), and check
    that the parked trainer got that group, woken by the host's notify (the last wait returned notified,
    not timed out); then commit it."""
    got: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: got.update(batch=trainer.lease(1, wait=30.0, renew=False)))
    thread.start()
    wait_until(lambda: host.waiting == 1, "the trainer to park")
    (meta,) = put()
    thread.join(30.0)
    assert not thread.is_alive()
    assert got["batch"].partitions == (meta.partition,)
    assert waits
    assert waits[-1] is True  # woken by notify_all, not by a timeout
    got["batch"].commit()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ROUTES)
def test_a_trainer_parked_in_lease_over_the_control_rpc_is_woken_by_the_publish(
    plane, monkeypatch, transport
):
    """The handoff's wake: a trainer parked in ``lease`` through the control server gets the group put by
    another client because the publish notifies the host's condition, not because a poll ran out: the
    parked wait that precedes the grant returns notified (``Condition.wait`` gives True), with the
    abandonment check's interval raised far beyond the test."""
    host = plane.controller
    waits = _record_waits(host, monkeypatch)
    writer_client = trajflight.connect(plane.address, timeout=20.0, transport=transport)
    trainer_client = trajflight.connect(plane.address, timeout=20.0, transport=transport)
    try:
        writer_client.open_job("wake", 1)
        writer = writer_client.writer("wake", 1)
        trainer = trainer_client.trainer("wake")
        _parked_lease_woken_by(host, trainer, waits, lambda: put_groups(writer, 1))
    finally:
        writer_client.close()
        trainer_client.close()


def test_a_put_with_a_grant_held_ahead_wakes_a_trainer_parked_over_the_control_rpc(plane, monkeypatch):
    """issue 16: with ``grant_ahead`` a steady-state put is one ``publish_ahead`` call (no allocate), and
    that publication wakes the parked trainer through the host's condition as ``publish`` does."""
    host = plane.controller

    writer_client = trajflight.connect(plane.address, timeout=20.0)
    trainer_client = trajflight.connect(plane.address, timeout=20.0)
    try:
        writer_client.open_job("wake-ahead", 1)
        writer = writer_client.writer("wake-ahead", 1, grant_ahead=True)
        trainer = trainer_client.trainer("wake-ahead")
        put_groups(writer, 1)  # the first put allocates, and holds the next grant
        trainer.lease(1, wait=5.0, renew=False).commit()
        # The commit's delete falls due at once; until the sweeper has taken it, a parked poll wakes at
        # that overdue deadline every millisecond (a timed-out wait), which is not what this test is about.
        wait_until(lambda: _nothing_overdue(host), "the sweeper took the commit's delete")
        waits = _record_waits(host, monkeypatch)
        sent: list[str] = []
        run = writer_client.controller._run
        monkeypatch.setattr(writer_client.controller, "_run", lambda c, t: sent.append(c.name) or run(c, t))
        _parked_lease_woken_by(host, trainer, waits, lambda: put_groups(writer, 1, first=1))
        assert sent == ["publish_ahead"]  # the put's one controller call (the trainer's are not counted)
    finally:
        writer_client.close()
        trainer_client.close()
