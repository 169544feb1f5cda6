"""A writer blocked on a full job is woken when a commit frees capacity, in-process and over the control
RPC.

Before, a refused writer slept the job's ``capacity_retry_after`` before it asked again; with a hint of
600 s and a 30 s deadline it gave up at once. Now the controller holds its allocate and grants it as soon
as the committed group's delete is confirmed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import trajflight
from trajflight import _rpc
from trajflight._control import ControlServer
from trajflight.controller import ControllerClient, LocalController

from .conftest import put_groups, wait_until


@pytest.fixture(params=["in-process", "control-socket", "control-flight"])
def writer_client(request: pytest.FixtureRequest, cluster: trajflight.LocalCluster) -> Iterator[Any]:
    """The writer's client: the cluster's own (direct calls), or one connected to its control endpoint,
    over the same-host socket or over Flight."""
    if request.param == "in-process":
        yield cluster.client()
        return
    route = "flight" if request.param == "control-flight" else "auto"
    with trajflight.connect(cluster.address, timeout=30.0, transport=route) as remote:
        yield remote


@pytest.mark.timeout(120)
@pytest.mark.parametrize("many", [False, True], ids=["put", "put_many"])
def test_a_writer_blocked_on_a_full_job_completes_soon_after_the_trainer_commits(
    cluster, job, writer_client, many
):
    client = cluster.client()
    client.open_job(job, 1, {"capacity_groups": 2, "capacity_retry_after": "600s"})  # polling cannot pass
    writer = writer_client.writer(job, 1)
    put_groups(writer, 2)  # the job is full
    (group,) = trajflight.workload.make_workload(1, 4, response_median=64, seed=9, first_group_id=2)
    out: dict[str, Any] = {}

    def put() -> None:
        try:
            if many:
                (out["info"],) = writer.put_many([group.columns()], timeout=30.0)
            else:
                out["info"] = writer.put(**group.columns(), timeout=30.0)
        except Exception as exc:  # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=put, daemon=True)
    thread.start()
    wait_until(lambda: cluster.controller.waiting_for_capacity or not thread.is_alive(), "the writer parks")
    assert "error" not in out, out  # refused at once: the hint is far beyond the deadline
    with client.trainer(job).lease(1, wait=5) as batch:
        batch.fetch_table(["reward"])
    thread.join(25.0)  # under the put's deadline: woken by the freed capacity, not by its own poll
    assert not thread.is_alive()
    assert "error" not in out, out
    assert out["info"].state == "READY"
    assert client.controller.usage(job)[1] == 2
    assert cluster.controller.waiting_for_capacity == 0


def test_grants_of_a_waiting_call_whose_reply_was_not_delivered_are_abandoned():
    """As for a lease granted to a long poll: the caller is gone when its grants come, so Flight closes
    the reply generator without resuming it, and the grants are given back at once, not at their TTL."""
    with LocalController() as host:
        client = ControllerClient(host)
        client.register_server("s", node="n", location="grpc://x", capacity_bytes=100, capacity_groups=9)
        client.open_job("j", 1)
        client.register_writer("j", 1, "w", node="n")
        server = ControlServer(host)
        try:
            grants = client.allocate_many("j", 1, "w", nbytes=[10, 10])
            reply = server._deliver(grants, _rpc.dumps(grants))
            next(reply)  # handed to gRPC, whose write then fails
            reply.close()
            counts = client.counts("j")
            assert counts["ALLOCATED"] == 0
            assert counts["DROPPED"] == 2
            delivered = server._deliver(client.allocate("j", 1, "w", nbytes=10), b"")
            assert list(delivered) == [b""]  # delivered: the grant stays
            assert client.counts("j")["ALLOCATED"] == 1
        finally:
            server.shutdown()


@pytest.mark.timeout(120)
def test_a_writer_parked_for_capacity_keeps_the_archives_cue_rising(tmp_path):
    """The archive writes what it holds at once when the count of capacity refusals rises. A writer parked
    on the controller is refused once and then asks again only when capacity comes back, so every look
    that finds it parked counts too: the archive holding the commits it waits for flushes them, long
    before ``archive_flush``."""
    with trajflight.LocalCluster(
        servers=1, processes=False, archive=tmp_path, archive_flush=600.0
    ) as cluster:
        client = cluster.client()
        client.open_job("cue", 1, {"capacity_groups": 1, "capacity_retry_after": "600s"})
        writer = client.writer("cue", 1)
        put_groups(writer, 1)
        out: dict[str, Any] = {}
        thread = threading.Thread(
            target=lambda: out.update(infos=put_groups(writer, 1, first=1)), daemon=True
        )
        thread.start()
        wait_until(lambda: cluster.controller.waiting_for_capacity, "the writer parks")
        looked = cluster._capacity_refusals()
        assert cluster._capacity_refusals() > looked
        with client.trainer("cue").lease(1, wait=5) as batch:
            batch.fetch_table(["reward"])
        thread.join(25.0)  # the archive wrote and deleted the committed group: its capacity came back
        assert not thread.is_alive()
        assert [i.state for i in out["infos"]] == ["READY"]


def test_a_controller_that_refuses_at_once_is_asked_again_after_its_hint(monkeypatch):
    """A host that does not wait (it answers a waiting allocate with its refusal at once) is not asked
    in a busy loop: the writer sleeps the refusal's ``retry_after`` between asks, as it did before."""
    from trajflight import _writer
    from trajflight.errors import CapacityExceededError

    class Refusing:
        def __init__(self) -> None:
            self.waits: list[float] = []

        def register_writer(self, *args: Any, **kwargs: Any) -> None:
            return None

        def allocate(self, *args: Any, wait: float, timeout: float, **kwargs: Any) -> str:
            self.waits.append(wait)
            if len(self.waits) < 3:
                raise CapacityExceededError("full", retry_after=0.01)
            return "grant"

    slept: list[float] = []
    clock = type("WriterTime", (), {"monotonic": staticmethod(time.monotonic), "sleep": slept.append})
    monkeypatch.setattr(_writer, "time", clock)  # the writer's module only
    controller = Refusing()
    session = type("FakeSession", (), {"controller": controller})()
    writer = _writer.Writer(session, "j", 1, node="n")  # type: ignore[arg-type]
    assert writer._allocate(100, time.monotonic() + 30.0) == "grant"
    assert slept == [0.01, 0.01]
    assert all(w > 0 for w in controller.waits)  # it asked the controller to wait each time
