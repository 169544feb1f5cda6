"""The refusal table of the controller's Flight endpoint and its same-host socket (issues 18 and 16):
every client operation (and the endpoint's own actions) x every way a credential can be wrong is refused
with the typed error naming what was wrong, and changes nothing (the ledger's snapshot is compared byte
for byte after every case).

One endpoint for the module, with a ledger on a frozen clock (nothing expires between cases) holding a
server, ``job-a`` at epoch 1, a writer, a READY group, a live lease and an open grant. The storage side of
the table is tests/flight_server/test_auth_table.py; TLS refusals (plaintext to a TLS server, a client
certificate of another CA) are in tests/trajflight/test_tls.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow.flight as flight
import pytest
from auth_cases import CASES, ROLES_BUT_ADMIN, Case, check_refusal, header

import trajflight
from trajflight import _rpc
from trajflight._control import ControlServer
from trajflight._control_client import FlightTransport
from trajflight.auth import Credential, Keyring, Role
from trajflight.controller import COMMANDS, ROLES, LocalController, Publication, Route
from trajflight.errors import AuthenticationError, ConfigError, PermissionDeniedError, TrajflightError
from trajflight.flight_server import LocalChannel
from trajflight.flight_server._errors import translate_errors
from trajflight.keys import Partition

SECRET = "k1:controller-table-secret-0123456789"
T0 = 1_000_000.0


ENDPOINT_ROLES: dict[str, tuple[Role, ...]] = {
    "info": (Role.WRITER, Role.TRAINER, Role.READER),
    "list_actions": (Role.WRITER, Role.TRAINER, Role.READER),
    "token": (Role.WRITER,),  # a writer token asked by a reader, or for another job
    "many": (Role.ADMIN,),  # a batch holding an admin operation
}
"""The endpoint's own actions, beside the commands of ``ROLES``, with the roles the cases use."""


def roles_of(operation: str) -> tuple[Role, ...]:
    return ENDPOINT_ROLES.get(operation) or ROLES[operation]


def credential(case: Case, operation: str, ring: Keyring) -> str | None:
    """The header value ``case`` sends for ``operation`` (the wrong role of ``token``: a reader asking for
    a writer token); None sends none."""
    return header(case, roles_of(operation), ring, SECRET, Role.READER if operation == "token" else None)


def applies(case: Case, operation: str) -> bool:
    if case.name == "wrong role":
        return operation == "token" or not set(roles_of(operation)) >= ROLES_BUT_ADMIN
    if case.name == "wrong job":
        return operation not in {"servers", "info", "list_actions"}  # no job, and every role may
    return True


@dataclass
class World:
    server: ControlServer
    controller: LocalController
    ring: Keyring
    lease: int
    grant: Any
    ready: Any


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    ring = Keyring.from_secret(SECRET)
    with LocalController(clock=lambda: T0, start=False) as controller:
        call = controller.call
        call("register_server", {"server_id": "s0", "node": "n", "location": "grpc://127.0.0.1:1",
                                 "capacity_bytes": 10**6, "capacity_groups": 100})  # fmt: skip
        call("open_job", {"job_id": "job-a", "epoch": 1})
        call("register_writer", {"job_id": "job-a", "epoch": 1, "writer_id": "w", "node": "n"})
        alloc = {"job_id": "job-a", "epoch": 1, "writer_id": "w", "nbytes": 100}
        grants = [call("allocate", alloc) for _ in "ab"]
        for grant in grants:
            call("publish", {"partition": grant.partition, "token": grant.token, "rows": 1, "nbytes": 100,
                             "tokens": 5, "policy_version": 0, "columns": ["response_ids"]})  # fmt: skip
        lease = controller.acquire({"job_id": "job-a", "owner": "t", "max_groups": 1, "ttl": 600}, wait=0)
        ready = next(g for g in grants if g.partition not in lease.partitions)
        open_grant = call("allocate", alloc)
        server = ControlServer(controller, keyring=ring)
        try:
            yield World(server, controller, ring, lease.token, open_grant, ready.partition)
        finally:
            server.shutdown()


def requests(w: World) -> dict[str, tuple[str, dict[str, Any]]]:
    """(action, body) of every operation, naming ``job-a``: what a right credential would run."""
    job = {"job_id": "job-a"}
    lease = {"token": w.lease}
    publication = Publication(w.grant.partition, w.grant.token, 1, 100, 5, 0, ("response_ids",))
    calls: dict[str, dict[str, Any]] = {
        "register_server": {
            "server_id": "s9",
            "node": "n",
            "location": "grpc://127.0.0.1:2",
            "capacity_bytes": 10**6,
            "capacity_groups": 100,
        },
        "open_job": {**job, "epoch": 5},
        "register_writer": {**job, "epoch": 1, "writer_id": "w2", "node": "n"},
        "announce_policy": {**job, "version": 3},
        "ack_policy": {**job, "epoch": 1, "writer_id": "w", "version": 0},
        "policy_status": job,
        "allocate": {**job, "epoch": 1, "writer_id": "w", "nbytes": 100},
        "allocate_many": {**job, "epoch": 1, "writer_id": "w", "nbytes": [100]},
        "publish": {
            "partition": w.grant.partition,
            "token": w.grant.token,
            "rows": 1,
            "nbytes": 100,
            "tokens": 5,
            "policy_version": 0,
            "columns": ["response_ids"],
        },
        "publish_many": {"items": [publication]},
        "publish_ahead": {"items": [publication], **job, "epoch": 1, "writer_id": "w", "ahead": [100]},
        "abandon": {"partition": w.grant.partition, "token": w.grant.token},
        "group": {"partition": w.ready},
        "renew": {**lease, "ttl": 900},
        "prepare": {**lease, "batch_id": "b"},
        "start_training": {**lease, "batch_id": "b"},
        "finish_training": {**lease, "batch_id": "b"},
        "commit": {**lease, "batch_id": "b"},
        "release": lease,
        "report_unusable": {**lease, "unreachable": ["s0"]},
        "resolve": {**job, "partitions": [w.ready], "action": "drop"},
        "counts": job,
        "usage": job,
        "lease_groups": lease,
        "gc_list": job,
        "fence_list": {},
        "servers": {},
        "lost": job,
        "confirm_checkpoint": {**job, "seq": 1},
    }
    out = {name: ("call", {"method": name, "kwargs": kwargs}) for name, kwargs in calls.items()}
    out["acquire"] = ("acquire", {"kwargs": {**job, "owner": "t2", "max_groups": 1}, "wait": 0})
    out["checkpoint"] = ("checkpoint", job)
    out["restore"] = (
        "restore",
        {"source": b"not a checkpoint", "kwargs": {**job, "epoch": 2, "config": None}},
    )
    out["info"] = ("info", {})
    out["list_actions"] = ("list_actions", {})
    out["token"] = ("token", {"role": "writer", "jobs": ["job-a"]})
    out["many"] = ("many", {"calls": [["counts", job], ["open_job", {**job, "epoch": 6}]]})
    return out


OPERATIONS = sorted({n for n, c in COMMANDS.items() if c.route is not Route.HOST} | set(ENDPOINT_ROLES))
TABLE = [(op, case) for op in OPERATIONS for case in CASES if applies(case, op)]


def test_every_operation_of_the_endpoint_is_in_the_table(world):
    """A client operation without a role or a request here would have no row."""
    assert set(requests(world)) == set(OPERATIONS)
    client_ops = {n for n, c in COMMANDS.items() if c.route is not Route.HOST}
    assert set(ROLES) == client_ops
    assert {op for op, _ in TABLE} == set(OPERATIONS)


def _send(server: ControlServer, kind: str, body: dict[str, Any], value: str | None) -> None:
    headers = [] if value is None else [(b"authorization", value.encode())]
    options = flight.FlightCallOptions(timeout=10, headers=headers)
    raw = flight.FlightClient(server.location)
    try:
        with translate_errors(kind):
            if kind == "list_actions":
                raw.list_actions(options=options)
            else:
                payload = b'{"v": 1}' if kind == "info" else _rpc.dumps(body)
                list(raw.do_action(flight.Action(kind, payload), options=options))
    finally:
        raw.close()


def _send_local(server: ControlServer, kind: str, body: dict[str, Any], value: str | None) -> None:
    """The same request over the controller's same-host socket (the token presented on connecting)."""
    token = None if value is None else Credential(value.split(" ", 1)[-1])
    channel = LocalChannel(server._info(b"")["control_socket"], lambda: token)
    try:
        channel.call_bytes(kind, b'{"v": 1}' if kind == "info" else _rpc.dumps(body), 10)
    finally:
        channel.close()


# The socket serves the actions; list_actions is a Flight method only.
LOCAL_TABLE = [(op, case) for op, case in TABLE if op != "list_actions"]
ROUTED_TABLE = [("flight", op, case) for op, case in TABLE] + [("socket", op, c) for op, c in LOCAL_TABLE]


@pytest.mark.parametrize(
    ("route", "operation", "case"), ROUTED_TABLE, ids=[f"{r}-{o}-{c.name}" for r, o, c in ROUTED_TABLE]
)
def test_every_controller_call_with_a_wrong_credential_is_refused_and_changes_nothing(
    world, route, operation, case
):
    kind, body = requests(world)[operation]
    value = credential(case, operation, world.ring)
    before = world.controller._core.ledger.snapshot()
    with pytest.raises(case.error) as refused:
        (_send if route == "flight" else _send_local)(world.server, kind, body, value)
    check_refusal(refused.value, case, value)
    assert world.controller._core.ledger.snapshot() == before


def test_publish_ahead_naming_the_credential_s_job_cannot_publish_another_job_s_groups(world):
    """issue 16: ``publish_ahead`` names the writer's job beside its items; a writer credential of
    ``job-a`` is refused for an item of ``job-b`` even when ``job_id`` says ``job-a``."""
    foreign = Publication(Partition("job-b", 1, 0), 1, 1, 100, 5, 0, ("response_ids",))
    kwargs = {"items": [foreign], "job_id": "job-a", "epoch": 1, "writer_id": "w", "ahead": [100]}
    before = world.controller._core.ledger.snapshot()
    with pytest.raises(PermissionDeniedError, match="job-b"):
        _send(world.server, "call", {"method": "publish_ahead", "kwargs": kwargs},
              "Bearer " + world.ring.mint("w", "writer", ["job-a"]).reveal())  # fmt: skip
    assert world.controller._core.ledger.snapshot() == before


def test_a_right_credential_runs_each_role_s_operations_and_mints_storage_tokens(world):
    def connect(role: str) -> Any:
        return trajflight._control_client.connect_control(
            world.server.location, timeout=10, credential=world.ring.mint(role, role, ["job-a"])
        )

    reader, trainer = connect("reader"), connect("trainer")
    assert reader.counts("job-a")["READY"] >= 1
    assert [g.partition for g in trainer.lease_groups(world.lease)]
    transport = trainer.transport
    assert isinstance(transport, FlightTransport)
    storage = world.ring.verify(transport.storage_token(10))
    assert (storage.role, storage.jobs, storage.sub) == (Role.TRAINER, ("job-a",), "trainer")
    assert storage.exp - storage.iat <= 300
    with pytest.raises(PermissionDeniedError, match="mints trainer tokens only"):
        transport.storage_token(10, role="admin")


def test_a_storage_token_never_outlives_the_credential_that_asked_for_it():
    """The ``token`` action caps a storage token at the caller's own expiry; a credential with less than
    the one second a token can live is told to renew, not handed a token that outlives it."""
    now = [T0]
    ring = Keyring.from_secret(SECRET, clock=lambda: now[0])
    with LocalController(start=False) as controller:
        server = ControlServer(controller, keyring=ring)
        try:
            asking = ring.mint("trainer", "trainer", ["job-a"], ttl=30, now=T0)
            transport = FlightTransport(server.location, credential=asking)
            caller = ring.verify(asking, now=T0)
            now[0] = T0 + 20  # 10 s left of the caller's 30
            storage = ring.verify(transport.storage_token(10), now=now[0])
            assert storage.exp <= caller.exp
            now[0] = caller.exp - 0.5
            with pytest.raises(AuthenticationError, match="expires within a second"):
                transport.storage_token(10)
        finally:
            server.shutdown()


def test_a_controller_without_a_secret_mints_nothing():
    with LocalController(start=False) as controller:
        server = ControlServer(controller)
        try:
            transport = FlightTransport(server.location, credential=Credential("x.y.z"))
            with pytest.raises(TrajflightError, match="does not authenticate"):
                transport.storage_token(5)
        finally:
            server.shutdown()


@pytest.mark.parametrize("make", ["control", "storage"])
def test_a_non_loopback_bind_without_a_secret_refuses_to_start_unless_insecure(make):
    from trajflight.flight_server import StorageServer

    def start(**kwargs: Any) -> Any:
        if make == "storage":
            return StorageServer("0.0.0.0", 0, **kwargs)
        return ControlServer(LocalController(start=False), host="0.0.0.0", **kwargs)

    with pytest.raises(ConfigError, match="without authentication") as info:
        start()
    assert info.value.setting == "insecure"
    server = start(insecure=True)
    (server.close if make == "storage" else server.shutdown)()


def test_the_server_command_refuses_a_public_host_without_a_secret():
    result = subprocess.run(
        [sys.executable, "-m", "trajflight", "server", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "TRAJFLIGHT_SECRET"},
    )
    assert result.returncode == 2
    assert "--insecure" in result.stderr
