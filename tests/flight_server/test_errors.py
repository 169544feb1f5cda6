"""The error table (trajflight class <-> Flight type) and malformed wire messages."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_testkit import make_group, serving

from trajflight.errors import (
    AlreadyExistsError,
    AuthenticationError,
    CapacityExceededError,
    ConfigError,
    DeadlineExceededError,
    InvalidRequestError,
    InvalidStateError,
    LeaseExpiredError,
    NotFoundError,
    PermissionDeniedError,
    SchemaError,
    StaleFenceError,
    TrajflightError,
    UnavailableError,
)
from trajflight.flight_server import WIRE_ERRORS, StorageClient
from trajflight.flight_server._errors import from_flight_error, server_errors, translate_errors
from trajflight.keys import Partition

# (error raised by a handler, Flight type on the wire). Adding a class to trajflight.errors without a
# row here fails test_every_error_class_has_a_row.
TABLE = [
    (StaleFenceError("stale", generation=1, highest=2), flight.FlightUnauthorizedError),
    (LeaseExpiredError("expired"), flight.FlightUnauthorizedError),
    (AuthenticationError("no token", reason="missing"), flight.FlightUnauthenticatedError),
    (PermissionDeniedError("wrong role", reason="role", operation="fence"), flight.FlightUnauthorizedError),
    (CapacityExceededError("full", retry_after=2.5, needed_bytes=10), flight.FlightUnavailableError),
    (UnavailableError("down"), flight.FlightUnavailableError),
    (DeadlineExceededError("slow"), flight.FlightTimedOutError),
    (NotFoundError("gone", job_id="j", epoch=0, group_id=1), flight.FlightServerError),
    (AlreadyExistsError("dup"), flight.FlightServerError),
    (SchemaError("bad column", column="reward", row=3), flight.FlightServerError),
    (InvalidStateError("wrong state"), flight.FlightServerError),
    (InvalidRequestError("garbage"), flight.FlightServerError),
    (ConfigError("bad setting", setting="capacity"), flight.FlightServerError),
    (TrajflightError("internal"), flight.FlightInternalError),
]


class ErrorServer(flight.FlightServerBase):
    """Raises ``TABLE[int(action.type)]``'s error from a real handler, through ``server_errors``."""

    def do_action(self, context, action):
        with server_errors("do_action"):
            raise TABLE[int(action.type)][0]


@pytest.fixture(scope="module")
def error_server():
    with ErrorServer("grpc://127.0.0.1:0") as server:
        yield server


def test_every_error_class_has_a_row():
    assert {type(e) for e, _ in TABLE} == set(WIRE_ERRORS)


@pytest.mark.parametrize(("error", "flight_type"), TABLE, ids=[type(e).__name__ for e, _ in TABLE])
def test_error_crosses_the_wire_as_its_flight_type_and_comes_back_as_its_class(
    error_server, error, flight_type
):
    index = next(i for i, (e, _) in enumerate(TABLE) if e is error)
    raw = flight.FlightClient(f"grpc://127.0.0.1:{error_server.port}")
    try:
        with pytest.raises(flight.FlightError) as wire:
            list(raw.do_action(flight.Action(str(index), b""), options=flight.FlightCallOptions(timeout=10)))
        assert type(wire.value) is flight_type
        assert f"[trajflight:{error.code}]" in str(wire.value)  # what a bare client sees
        with pytest.raises(TrajflightError) as back, translate_errors("test"):
            raise wire.value
    finally:
        raw.close()
    assert type(back.value) is type(error)
    assert back.value.message == error.message
    assert back.value.fields == error.fields


def test_unexpected_handler_errors_become_internal_errors_not_crashes(error_server):
    class Boom(flight.FlightServerBase):
        def do_action(self, context, action):
            with server_errors("do_action"):
                raise RuntimeError("bug")

    with (
        Boom("grpc://127.0.0.1:0") as server,
        StorageClient(f"grpc://127.0.0.1:{server.port}") as client,
        pytest.raises(TrajflightError, match="internal server error") as info,
    ):
        client.health()
    assert type(info.value) is TrajflightError


def test_a_client_deadline_maps_to_deadline_exceeded_and_refused_connections_to_unavailable():
    import socket

    with socket.socket() as listener:  # accepts TCP, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with (
            StorageClient(f"grpc://127.0.0.1:{port}", timeout=0.5) as client,
            pytest.raises(DeadlineExceededError),
        ):
            client.health()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    with StorageClient(f"grpc://127.0.0.1:{free}", timeout=2) as client, pytest.raises(UnavailableError):
        client.health()


GARBAGE = {
    "not-json": b"\x00\xffgarbage",
    "json-list": b"[1, 2]",
    "no-version": b'{"groups": []}',
    "unknown-version": b'{"v": 99, "groups": []}',
    "version-is-bool": b'{"v": true}',
    "groups-not-list": b'{"v": 1, "groups": "all"}',
    "empty-groups": b'{"v": 1, "groups": []}',
    "epoch-is-string": b'{"v": 1, "groups": [{"job_id": "j", "epoch": "0", "group_id": 1}]}',
    "epoch-is-bool": b'{"v": 1, "groups": [{"job_id": "j", "epoch": true, "group_id": 1}]}',
    "negative-group": b'{"v": 1, "groups": [{"job_id": "j", "epoch": 0, "group_id": -1}]}',
    "columns-not-names": b'{"v": 1, "groups": [{"job_id": "j", "epoch": 0, "group_id": 1}], "columns": [1]}',
}


@pytest.mark.parametrize("ticket", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_tickets_get_a_clear_invalid_request(ticket):
    with serving() as (server, _):
        raw = flight.FlightClient(server.location)
        with pytest.raises(flight.FlightServerError, match=r"\[trajflight:invalid_request\] ticket"):
            raw.do_get(flight.Ticket(ticket)).read_all()
        raw.close()


@pytest.mark.parametrize(
    ("action", "body", "match"),
    [
        ("delete", b"\x00", "not a trajflight message"),
        ("delete", b'{"v": 2, "groups": []}', "unknown wire version 2"),
        ("fence", b'{"v": 1, "job_id": "j"}', "missing field 'min_epoch'"),
        ("fence", b'{"v": 1, "job_id": "j", "min_epoch": 1, "purge": "yes"}', "'purge' must be a boolean"),
        (
            "advance_generation",
            b'{"v": 1, "groups": [{"job_id": "j", "epoch": 0, "group_id": 1}]}',
            "generation",
        ),
        ("stats", b"junk", "not a trajflight message"),
        ("launch_missiles", b"{}", "unknown action"),
    ],
)
def test_garbage_action_bodies_get_a_clear_invalid_request(action, body, match):
    with serving() as (_, client), pytest.raises(InvalidRequestError, match=match), translate_errors("test"):
        list(client._client.do_action(flight.Action(action, body)))


@pytest.mark.parametrize(
    "descriptor",
    [
        flight.FlightDescriptor.for_command(b"\xde\xad"),
        flight.FlightDescriptor.for_command(json.dumps({"v": 1, "kind": "upsert"}).encode()),
        flight.FlightDescriptor.for_command(json.dumps({"v": 1, "kind": "put", "job_id": 5}).encode()),
        flight.FlightDescriptor.for_path("only", "two"),
        flight.FlightDescriptor.for_path("j", "zero", "1"),
    ],
    ids=["garbage", "unknown-kind", "job-id-not-string", "short-path", "non-integer-path"],
)
def test_garbage_put_descriptors_are_refused_and_store_nothing(descriptor):
    key = Partition("j", 0, 1)
    group = make_group(key)
    with serving() as (server, client):
        raw = flight.FlightClient(server.location)
        writer, _ = raw.do_put(descriptor, group.schema)
        with pytest.raises(flight.FlightServerError, match="invalid_request"):  # noqa: PT012
            # the refusal surfaces at the write or at close, depending on timing
            writer.write_batch(group)
            writer.close()
        raw.close()
        assert client.stats()["groups"] == 0


def test_list_flights_refuses_garbage_criteria():
    with serving() as (server, _):
        raw = flight.FlightClient(server.location)
        with pytest.raises(flight.FlightServerError, match="criteria"):
            list(raw.list_flights(b'{"v": 1, "epoch": "x"}'))
        raw.close()


def test_server_survives_garbage_and_keeps_serving():
    key = Partition("j", 0, 1)
    with serving() as (server, client):
        raw = flight.FlightClient(server.location)
        for ticket in GARBAGE.values():
            with pytest.raises(flight.FlightServerError):
                raw.do_get(flight.Ticket(ticket)).read_all()
        raw.close()
        client.put_groups([(key, make_group(key))])
        assert client.get([key]).num_rows == 8
        assert pa.Table.from_batches([make_group(key)]).equals(client.get([key]))


def test_a_get_schema_refusal_maps_back_to_its_class():
    """Regression: pyarrow's get_schema callback drops a handler's Flight type (its get_flight_info
    callback keeps it), so a bare client got ``ArrowException: Unknown error: [trajflight:not_found]...``
    and the mapping, which looked for the prefix only at the start, answered a plain TrajflightError."""
    with serving() as (server, _):
        raw = flight.FlightClient(server.location)
        with pytest.raises(pa.ArrowException) as wire:
            raw.get_schema(flight.FlightDescriptor.for_path("j", "0", "9"))
        raw.close()
    err = from_flight_error(wire.value)
    assert type(err) is NotFoundError
    assert "Traceback" not in err.message
    assert str(wire.value).count("File ") <= 2  # raised unchained: no trace of the server's internals
