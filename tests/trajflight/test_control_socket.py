"""The controller's same-host socket (issue 16): clients on its host call over it, with the answers,
errors, long polls and recovery of the Flight endpoint. Its refusals are in test_auth_table.py."""

from __future__ import annotations

import os
import socket
import stat
import struct
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from trajflight import _rpc
from trajflight._control import ControlServer
from trajflight._control_client import FlightTransport, connect_control
from trajflight.controller import ControllerClient, LocalController
from trajflight.errors import InvalidRequestError, NotFoundError

from .conftest import wait_until

SERVER = {"server_id": "s0", "node": "n", "location": "grpc://127.0.0.1:1", "capacity_bytes": 10**6,
          "capacity_groups": 100}  # fmt: skip


@pytest.fixture
def host() -> Iterator[LocalController]:
    with LocalController() as controller:
        controller.call("register_server", SERVER)
        yield controller


@pytest.fixture
def control(host: LocalController) -> Iterator[ControlServer]:
    server = ControlServer(host)
    try:
        yield server
    finally:
        server.shutdown()


def _transport(client: ControllerClient) -> FlightTransport:
    transport = client.transport
    assert isinstance(transport, FlightTransport)
    return transport


def _publish_one(client: ControllerClient, job: str) -> None:
    client.register_writer(job, 1, "w", node="n")
    grant = client.allocate(job, 1, "w", nbytes=10)
    client.publish(
        grant.partition, token=grant.token, rows=1, nbytes=10, tokens=1, policy_version=0, columns=()
    )


def test_a_client_on_the_controller_s_host_calls_over_the_socket_with_the_same_answers(control):
    over_socket = connect_control(control.location, timeout=10)
    over_flight = connect_control(control.location, timeout=10, local=False)
    over_socket.open_job("j", 1)
    _publish_one(over_socket, "j")
    assert over_socket.counts("j") == over_flight.counts("j")
    assert over_socket.servers() == over_flight.servers()
    assert (_transport(over_socket).route, _transport(over_flight).route) == ("socket", "flight")
    lease = over_socket.acquire("j", "t", max_groups=1)
    assert lease is not None
    assert over_flight.lease_groups(lease.token)
    assert over_socket.call_many([("counts", {"job_id": "j"})]) == [over_flight.counts("j")]


def test_errors_cross_the_socket_with_their_class(control):
    client = connect_control(control.location, timeout=10)
    with pytest.raises(NotFoundError):
        client.counts("no-such-job")
    with pytest.raises(InvalidRequestError, match="unknown controller operation"):
        client.transport.invoke("tick", {}, 5.0)
    assert _transport(client).route == "socket"


def test_the_socket_is_private_and_removed_at_shutdown(host):
    server = ControlServer(host)
    path = server._info(b"")["control_socket"]
    directory = os.path.dirname(path)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    server.shutdown()
    assert not os.path.exists(directory)


def test_a_server_without_the_socket_is_reached_over_flight(host):
    server = ControlServer(host, local_socket=False)
    try:
        client = connect_control(server.location, timeout=10)
        assert "control_socket" not in server._info(b"")
        client.open_job("j", 1)
        assert _transport(client).route == "flight"
    finally:
        server.shutdown()


def test_a_restarted_controller_is_reached_through_its_new_socket_at_the_first_call(host):
    """A restarted control server listens on the same port but serves a fresh socket: the first call
    after the restart (its request never left: the old socket is gone) goes over Flight, the next over
    the new socket."""
    first = ControlServer(host)
    port, old = first.port, first._info(b"")["control_socket"]
    client = connect_control(first.location, timeout=10)
    client.open_job("j", 1)
    assert _transport(client).route == "socket"
    first.shutdown()
    second = ControlServer(host, port=port)
    try:
        assert client.counts("j")["READY"] == 0
        client.counts("j")
        assert _transport(client).route == "socket"
        assert _transport(client)._channel is not None
        assert _transport(client)._channel.path == second._info(b"")["control_socket"] != old
    finally:
        second.shutdown()


def _frame(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


@pytest.mark.timeout(60)
def test_a_poll_whose_caller_closed_the_socket_is_granted_nothing(host, control):
    """A trainer that hangs up while parked in ``acquire`` (killed, or gave up) leaves no lease behind:
    the handler notices the closed connection and the next group goes to a live trainer."""
    client = ControllerClient(host)
    client.open_job("j", 1)
    path = control._info(b"")["control_socket"]
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(path)
    body = _rpc.dumps({"kwargs": {"job_id": "j", "owner": "gone", "max_groups": 1}, "wait": 30.0})
    raw.sendall(_frame(b"acquire") + _frame(body) + _frame(b""))
    wait_until(lambda: host.waiting == 1, "the poll is parked")
    raw.close()
    wait_until(lambda: host.waiting == 0, "the handler noticed its caller left", timeout=15.0)
    _publish_one(client, "j")
    assert client.counts("j")["READY"] == 1
    assert client.acquire("j", "live", max_groups=1) is not None


@pytest.mark.timeout(60)
def test_a_parked_poll_over_the_socket_is_woken_by_a_publish(host, control):
    trainer = connect_control(control.location, timeout=20)
    writer = ControllerClient(host)
    writer.open_job("j", 1)
    got: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: got.update(lease=trainer.acquire("j", "t", max_groups=1, wait=20))
    )
    thread.start()
    wait_until(lambda: host.waiting == 1, "the trainer is parked")
    _publish_one(writer, "j")
    thread.join(20)
    assert got["lease"] is not None
    assert _transport(trainer).route == "socket"


def test_a_temporary_directory_too_deep_for_a_socket_leaves_the_server_on_flight(host, tmp_path, monkeypatch):
    """A Unix socket path has at most 107 bytes: under a deeper TMPDIR the server serves Flight only and
    says so, instead of failing to start."""
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    server = ControlServer(host)
    try:
        assert "control_socket" not in server._info(b"")
        client = connect_control(server.location, timeout=10)
        client.open_job("j", 1)
        assert _transport(client).route == "flight"
        assert list(deep.iterdir()) == []  # the directory made for the socket is gone too
    finally:
        server.shutdown()
