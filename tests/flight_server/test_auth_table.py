"""The refusal table of a storage server (issue 18): every operation, over Flight and over the same-host
socket, x every way a credential can be wrong, is refused with the typed error naming what was wrong, and
changes nothing (the stats, the stored bytes and the lease generation are checked after every case).

One server for the module (an arena, keys of kid ``k1``); the baseline holds one group of ``job-a`` at
generation 1 and one written, unpublished same-host reservation. The role table itself is checked to name
every operation, so that a new operation without a role fails here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from auth_cases import CASES, ROLES_BUT_ADMIN, Case, check_refusal, header
from flight_testkit import make_group

from trajflight.auth import Credential, Keyring
from trajflight.errors import AuthenticationError, PermissionDeniedError
from trajflight.flight_server import (
    ACTIONS,
    FLIGHT_METHODS,
    ROLES,
    GroupRead,
    LeaseToken,
    ShmArena,
    StorageClient,
    StorageServer,
)
from trajflight.flight_server._errors import translate_errors
from trajflight.flight_server._wire import (
    AppendDescriptor,
    DeleteRequest,
    FenceRequest,
    GenerationRequest,
    GetTicket,
    ListCriteria,
    PutDescriptor,
    PutManyDescriptor,
    ShmAbortRequest,
    ShmBatchPublishRequest,
    ShmBatchReserveRequest,
    ShmReserveRequest,
    encode,
    encode_json,
    group_descriptor,
)
from trajflight.flight_server.shm._local import LocalChannel
from trajflight.flight_server.shm._segment import write_segment
from trajflight.keys import Partition

SECRET = "k1:storage-table-secret-0123456789"
KEY = Partition("job-a", 1, 5)
FRESH = Partition("job-a", 1, 77)  # what a put that went through would add


# ------------------------------------------------------------------------------------------ credentials


def credential(case: Case, operation: str, ring: Keyring) -> str | None:
    """The header value ``case`` sends for ``operation``; None sends none."""
    return header(case, ROLES[operation], ring, SECRET)


def applies(case: Case, operation: str) -> bool:
    """Whether ``case`` can be wrong for ``operation``: every role may run some operations, and some
    name no job (their request carries a reservation id, a capability of its writer, or nothing)."""
    if case.name == "wrong role":
        return not set(ROLES[operation]) >= ROLES_BUT_ADMIN
    if case.name == "wrong job":
        return operation not in {"stats", "health", "list_actions", "shm_publish", "shm_abort"}
    return True


# ------------------------------------------------------------------------------------------ the server


@dataclass
class World:
    server: StorageServer
    admin: StorageClient
    ring: Keyring
    reservation: str
    baseline: pa.Table


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    ring = Keyring.from_secret(SECRET)
    with (
        StorageServer(keyring=ring, arena=ShmArena(), shm_ttl=600) as server,
        StorageClient(server.location, timeout=20, credential=ring.mint("table", "admin")) as admin,
    ):
        admin.put_groups([(KEY, make_group(KEY))])
        admin.advance_generation([GroupRead(KEY, LeaseToken(1))])
        pending = Partition("job-a", 1, 200)
        batch = make_group(pending)
        body = ShmBatchReserveRequest("job-a", 1, (200,), (batch.num_rows,), 1 << 16, "w", 600.0)
        reserved = admin._action("shm_reserve", encode(body), None)["batch"]
        write_segment(reserved["path"], reserved["capacity"], batch.schema, [batch])
        yield World(server, admin, ring, reserved["reservation"], admin.get([GroupRead(KEY, LeaseToken(1))]))


def state(world: World) -> tuple[Any, pa.Table]:
    """What a refused call must leave as it was: the server's stats (but its read counters) and the
    stored group, read under generation 1 (a raised generation would refuse this read)."""
    stats = world.admin.stats()
    for volatile in ("groups_read", "bytes_read"):
        stats.pop(volatile)
    return stats, world.admin.get([GroupRead(KEY, LeaseToken(1))])


# ----------------------------------------------------------------------------------------- operations

Call = Callable[[flight.FlightClient, flight.FlightCallOptions, World], object]


def _action(name: str, body: bytes) -> Call:
    return lambda c, o, w: list(c.do_action(flight.Action(name, body), options=o))


def _put(c: flight.FlightClient, o: flight.FlightCallOptions, w: World) -> None:
    group = make_group(FRESH)
    many = PutManyDescriptor((PutDescriptor(FRESH, num_rows=group.num_rows),), "w")
    writer, _ = c.do_put(flight.FlightDescriptor.for_command(encode(many)), group.schema, options=o)
    try:
        writer.write_batch(group)
        writer.done_writing()
    finally:
        writer.close()


def _append(c: flight.FlightClient, o: flight.FlightCallOptions, w: World) -> None:
    column = pa.table({"ref_logprob": pa.array([0.5] * w.baseline.num_rows, pa.float32())})
    descriptor = flight.FlightDescriptor.for_command(encode(AppendDescriptor(KEY, LeaseToken(1))))
    writer, _ = c.do_put(descriptor, column.schema, options=o)
    try:
        writer.write_table(column)
        writer.done_writing()
    finally:
        writer.close()


TICKET = GetTicket((GroupRead(KEY, LeaseToken(1)),))
FLIGHT_CALLS: dict[str, Call] = {
    "put": _put,
    "append": _append,
    "do_get": lambda c, o, w: c.do_get(flight.Ticket(encode(TICKET)), options=o).read_all(),
    "list_flights": lambda c, o, w: list(c.list_flights(encode(ListCriteria("job-a")), options=o)),
    "get_flight_info": lambda c, o, w: c.get_flight_info(group_descriptor(KEY), options=o),
    "get_schema": lambda c, o, w: c.get_schema(group_descriptor(KEY), options=o),
    "list_actions": lambda c, o, w: c.list_actions(options=o),
}


def action_bodies(world: World) -> dict[str, bytes]:
    """A valid body of every action, naming ``job-a``: what a call with a right credential would run."""
    fresh = (PutDescriptor(FRESH, "w", None, 8),)
    return {
        "delete": encode(DeleteRequest((GroupRead(KEY, LeaseToken(1)),))),
        "fence": encode(FenceRequest("job-a", 5, True)),
        "advance_generation": encode(GenerationRequest((GroupRead(KEY, LeaseToken(9)),))),
        "stats": encode_json({}),
        "health": b"",
        "shm_reserve": encode(ShmReserveRequest(fresh, "w", 600.0, 1 << 16)),
        "shm_publish": encode(ShmBatchPublishRequest(world.reservation, 1)),
        "shm_put": encode(ShmReserveRequest((PutDescriptor(FRESH, "w", 64, 8),), "w")),
        "shm_abort": encode(ShmAbortRequest((world.reservation,))),
        "shm_open": encode(TICKET),
    }


def test_the_role_table_names_every_operation_of_the_server_and_nothing_else():
    assert set(ROLES) == set(ACTIONS) | set(FLIGHT_METHODS)
    assert set(FLIGHT_CALLS) == set(FLIGHT_METHODS)
    assert all(ROLES[op] for op in ROLES)


# over Flight: every Flight method and every action but shm_put (carried by the same-host socket only)
FLIGHT_OPS = sorted(FLIGHT_METHODS) + sorted(set(ACTIONS) - {"shm_put"})
FLIGHT_TABLE = [(op, case) for op in FLIGHT_OPS for case in CASES if applies(case, op)]
LOCAL_TABLE = [(op, case) for op in sorted(ACTIONS) for case in CASES if applies(case, op)]


def _check(world: World, case: Case, operation: str, call: Callable[[], object], header: str | None) -> None:
    before = state(world)
    with pytest.raises(case.error) as refused:
        call()
    # pyarrow's get_schema drops the error's fields (apache/arrow#43556): its message still says why
    check_refusal(refused.value, case, header, reason_lost=operation == "get_schema")
    after = state(world)
    assert after[0] == before[0]
    assert after[1].equals(before[1])


@pytest.mark.parametrize(("operation", "case"), FLIGHT_TABLE, ids=[f"{o}-{c.name}" for o, c in FLIGHT_TABLE])
def test_every_flight_call_with_a_wrong_credential_is_refused_and_changes_nothing(world, operation, case):
    header = credential(case, operation, world.ring)
    headers = [] if header is None else [(b"authorization", header.encode())]
    options = flight.FlightCallOptions(timeout=10, headers=headers)
    call = FLIGHT_CALLS.get(operation) or _action(operation, action_bodies(world)[operation])
    raw = flight.FlightClient(world.server.location)
    try:

        def run() -> object:
            with translate_errors(operation):
                return call(raw, options, world)

        _check(world, case, operation, run, header)
    finally:
        raw.close()


@pytest.mark.parametrize(("operation", "case"), LOCAL_TABLE, ids=[f"{o}-{c.name}" for o, c in LOCAL_TABLE])
def test_every_same_host_request_with_a_wrong_credential_is_refused_and_changes_nothing(
    world, operation, case
):
    header = credential(case, operation, world.ring)
    token = None if header is None else Credential(header.split(" ", 1)[1])
    channel = LocalChannel(world.admin.health()["shm_socket"], lambda: token)
    body = action_bodies(world)[operation]
    payload = bytes(64) if operation == "shm_put" else b""
    try:
        _check(world, case, operation, lambda: channel.call(operation, body, 10, payload=payload), header)
    finally:
        channel.close()


def test_a_right_credential_passes_where_the_table_refuses():
    """The other side of the table: each role runs what it may (so the refusals above are not a server
    that refuses everything)."""
    ring = Keyring.from_secret(SECRET)
    with StorageServer(keyring=ring, arena=ShmArena()) as server:

        def client(role: str) -> StorageClient:
            return StorageClient(server.location, timeout=20, credential=ring.mint(role, role, ["job-a"]))

        with client("writer") as w, client("trainer") as t, client("reader") as r, client("admin") as a:
            w.put_groups([(KEY, make_group(KEY))])
            t.append_columns(KEY, pa.table({"ref_logprob": pa.array([0.5] * 8, pa.float32())}), LeaseToken(1))
            assert r.get([KEY]).num_rows == 8
            with pytest.raises(PermissionDeniedError, match="reads without tokens"):  # never fences a lease
                r.get([GroupRead(KEY, LeaseToken(1))])
            with pytest.raises(PermissionDeniedError, match="reads without tokens"):
                r.shm_get([GroupRead(KEY, LeaseToken(1))])
            assert [g.key for g in r.list_groups()] == [KEY]
            assert t.shm_get([GroupRead(KEY, LeaseToken(1))]).num_rows == 8
            assert a.fence("job-a", 1)["min_epoch"] == 1
            assert a.delete([GroupRead(KEY, LeaseToken(2))])["deleted"] == 1


def test_a_scoped_reader_lists_only_its_jobs_groups():
    ring = Keyring.from_secret(SECRET)
    other = Partition("job-b", 1, 1)
    with StorageServer(keyring=ring) as server:
        with StorageClient(server.location, credential=ring.mint("w", "writer")) as writer:
            writer.put_groups([(KEY, make_group(KEY))])
            writer.put_groups([(other, make_group(other))])
        with StorageClient(server.location, credential=ring.mint("r", "reader", ["job-b"])) as reader:
            assert [g.key for g in reader.list_groups()] == [other]


def test_the_same_host_socket_rechecks_expiry_at_every_request():
    """A connection that presented a token keeps its claims; once they expire its requests are refused
    until it presents a fresh one (the channel's client does when its credential changes)."""
    ring = Keyring.from_secret(SECRET)
    with StorageServer(keyring=ring, arena=ShmArena()) as server:
        path = StorageClient(server.location, credential=ring.mint("a", "admin")).health()["shm_socket"]
        held = [ring.mint("w", "reader", ttl=60, now=time.time() - 59)]  # one second of life left
        channel = LocalChannel(path, lambda: held[0])
        try:
            assert channel.call("health", b"", 5)["status"] == "ok"
            time.sleep(1.2)
            with pytest.raises(AuthenticationError, match="expired") as info:
                channel.call("health", b"", 5)
            assert info.value.reason == "expired"
            held[0] = ring.mint("w", "reader")
            assert channel.call("health", b"", 5)["status"] == "ok"
        finally:
            channel.close()


def test_refusals_are_counted_once_by_reason_in_the_metrics():
    """A call refused by the middleware (no handler ran) and one refused by the role check in its handler
    each count once, under ``unauthenticated`` and ``wrong_role``."""
    ring = Keyring.from_secret(SECRET)
    with StorageServer(keyring=ring) as server:

        def refused(reason: str) -> float:
            value = server.metrics.registry.get_sample_value(
                "trajflight_server_refusals_total", {"reason": reason}
            )
            return 0.0 if value is None else value

        with StorageClient(server.location, timeout=10) as anonymous, pytest.raises(AuthenticationError):
            anonymous.health()
        reader = ring.mint("reader", "reader", ["job-a"])
        with (
            StorageClient(server.location, timeout=10, credential=reader) as r,
            pytest.raises(PermissionDeniedError),
        ):
            r.fence("job-a", 1)
        assert (refused("unauthenticated"), refused("wrong_role")) == (1.0, 1.0)
