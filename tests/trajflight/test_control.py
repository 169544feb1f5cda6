"""The controller over Flight: typed errors for bad requests, only client operations served."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pyarrow.flight as flight
import pytest

from trajflight import _rpc
from trajflight._control import CALLS, ControlServer
from trajflight._control_client import FlightTransport, connect_control
from trajflight.controller import (
    ControllerClient,
    GroupInfo,
    GroupState,
    LocalController,
    Partition,
    Publication,
    PutGrant,
)
from trajflight.errors import CapacityExceededError, InvalidRequestError, NotFoundError, StaleFenceError
from trajflight.flight_server._errors import translate_errors


@pytest.fixture
def control() -> Iterator[ControlServer]:
    with LocalController() as controller:
        server = ControlServer(controller)
        try:
            yield server
        finally:
            server.shutdown()


def _raw(server: ControlServer, kind: str, body: bytes) -> None:
    client = flight.FlightClient(server.location)
    try:
        with translate_errors(kind):
            list(client.do_action(flight.Action(kind, body), options=flight.FlightCallOptions(timeout=5)))
    finally:
        client.close()


@pytest.mark.parametrize(
    ("kind", "body", "error", "message"),
    [
        (
            "call",
            _rpc.dumps({"method": "tick", "kwargs": {}}),
            InvalidRequestError,
            "unknown controller operation",
        ),
        (
            "call",
            _rpc.dumps({"method": "counts", "kwargs": {"job_id": "j", "now": 1.0}}),
            InvalidRequestError,
            "bad arguments",
        ),
        ("call", _rpc.dumps({"method": "counts", "kwargs": [1]}), InvalidRequestError, "must be an object"),
        ("call", _rpc.dumps({"method": "counts", "timeout": "soon"}), InvalidRequestError, "timeout"),
        ("call", b"\x00garbage", InvalidRequestError, "not JSON"),
        ("call", _rpc.dumps([1, 2]), InvalidRequestError, "must be an object"),
        ("checkpoint", _rpc.dumps({"path": "/tmp/x"}), InvalidRequestError, "'job_id'"),
        ("nope", _rpc.dumps({}), InvalidRequestError, "unknown controller action"),
        ("many", _rpc.dumps({"calls": [["counts"]]}), InvalidRequestError, "list of \\[method, kwargs\\]"),
        ("many", _rpc.dumps({"calls": [["tick", {}]]}), InvalidRequestError, "unknown controller operation"),
    ],
)
def test_bad_requests_get_typed_errors(control, kind, body, error, message):
    with pytest.raises(error, match=message):
        _raw(control, kind, body)


def test_ledger_errors_cross_the_wire_with_their_class(control):
    client = connect_control(control.location, timeout=5)
    with pytest.raises(NotFoundError, match="no lease has token"):
        client.renew(12345)
    info = client.transport.info(5)
    assert info["kind"] == "embedded"
    assert isinstance(client.transport, FlightTransport)


def _job_with_a_writer(control: Any, *, capacity_groups: int) -> Any:
    """A client of ``control`` with one (fake) server, job ``j`` epoch 1 and writer ``w`` registered."""
    client = connect_control(control.location, timeout=5)
    client.register_server(
        "s0", node="n", location="grpc://127.0.0.1:1", capacity_bytes=10**6, capacity_groups=capacity_groups
    )
    client.open_job("j", 1)
    client.register_writer("j", 1, "w", node="n")
    return client


def test_many_runs_operations_in_order_in_one_round_trip(control):
    client = _job_with_a_writer(control, capacity_groups=10)
    grant = client.allocate("j", 1, "w", nbytes=100)
    client.publish(
        grant.partition,
        token=grant.token,
        rows=1,
        nbytes=100,
        tokens=5,
        policy_version=0,
        columns=["response_ids"],
    )
    lease = client.acquire("j", "t", max_groups=1)
    assert lease is not None
    args = {"token": lease.token, "batch_id": "b"}
    steps = ["prepare", "start_training", "finish_training", "commit"]
    results = client.call_many([(s, args) for s in steps])
    assert results[-1] == (grant.partition,)
    assert client.counts("j")["committed_total"] == 1
    with pytest.raises(NotFoundError):  # the first error is raised
        client.call_many([("renew", {"token": 999})])


def test_batched_allocation_crosses_the_wire_as_typed_grants(control):
    client = _job_with_a_writer(control, capacity_groups=3)
    grants = client.allocate_many("j", 1, "w", nbytes=(100, 200, 300, 400))
    assert isinstance(grants, list)
    assert all(isinstance(g, PutGrant) for g in grants)
    assert [(g.partition, g.nbytes) for g in grants] == [
        (Partition("j", 1, i), n) for i, n in enumerate((100, 200, 300))
    ]
    with pytest.raises(CapacityExceededError) as err:
        client.allocate_many("j", 1, "w", nbytes=[400])
    assert err.value.retry_after > 0
    with pytest.raises(InvalidRequestError, match=r"nbytes\[0\] must be an int >= 1"):
        client.allocate_many("j", 1, "w", nbytes=[-1])


def test_batched_publication_crosses_the_wire_as_typed_records_and_is_counted(control):
    client = _job_with_a_writer(control, capacity_groups=3)
    grants = client.allocate_many("j", 1, "w", nbytes=(100, 200, 300))
    items = [Publication(g.partition, g.token, 2, g.nbytes - 10, 7, 0, ("a", "b")) for g in grants]
    with pytest.raises(StaleFenceError):  # a wrong token: nothing published, nothing counted
        client.publish_many([*items[:2], Publication(grants[2].partition, 1, 2, 1, 7, 0, ("a",))])
    infos = client.publish_many(items)
    assert all(isinstance(i, GroupInfo) and i.state is GroupState.READY for i in infos)
    assert [(i.partition, i.nbytes, i.columns) for i in infos] == [
        (g.partition, g.nbytes - 10, ("a", "b")) for g in grants
    ]
    counters = client.transport.info(5)["counters"]
    assert (counters["groups_published"], counters["bytes_published"]) == (3, 570)


def test_every_controller_call_of_the_client_is_served():
    """The allowlist is the security boundary; an operation missing from it is unusable over Flight."""
    actions = {"acquire", "call_many", "checkpoint", "restore"}  # served by their own Flight actions
    operations = {
        name
        for name, fn in inspect.getmembers(ControllerClient, inspect.isfunction)
        if not name.startswith("_")
    }
    assert operations - actions == CALLS


def test_a_caller_cannot_make_the_controller_write_or_read_a_file_it_names(control, tmp_path):
    """issue 18: any local process could make the controller write a checkpoint at any path and read any
    file (``checkpoint`` with ``path``, ``restore`` with a ``source`` path). Paths are refused over the
    wire; a client writes and reads checkpoint files in its own process instead."""
    client = connect_control(control.location, timeout=5)
    client.open_job("j", 1)
    target = tmp_path / "planted"
    with pytest.raises(InvalidRequestError, match="path is refused over the wire"):
        _raw(control, "checkpoint", _rpc.dumps({"job_id": "j", "path": str(target)}))
    assert not target.exists()
    secret = tmp_path / "secret"
    secret.write_bytes(b"not for the caller")
    body = {"source": str(secret), "kwargs": {"job_id": "j", "epoch": 2, "config": None}}
    with pytest.raises(InvalidRequestError, match="source must be the checkpoint's bytes"):
        _raw(control, "restore", _rpc.dumps(body))
    # The client's own path: written here, atomically, then confirmed; and read here to restore.
    mine = tmp_path / "mine.ckpt"
    data = client.checkpoint("j", mine)
    assert mine.read_bytes() == data
    with LocalController() as fresh:
        server = ControlServer(fresh)
        try:
            counts = connect_control(server.location, timeout=5).restore(
                mine, job_id="j", epoch=2, config=None
            )
        finally:
            server.shutdown()
    assert counts["READY"] == 0
