"""Every number, size and depth on the wire is checked before it touches state (issue 14, items 4 and 11).

Each test names the bad input a black-box run found: a generation beyond int64 that answered an internal
error yet raised the stored generation (poisoning the group), ``"v": 1.0`` accepted as version 1, a
``group_id`` beyond int64 in a put, 100k-deep JSON, a 10 MB job id echoed into an error gRPC then could
not carry, and fences at epochs beyond int64.
"""

from __future__ import annotations

import json

import pyarrow.flight as flight
import pytest
from flight_testkit import make_group, serving
from hypothesis import given
from hypothesis import strategies as st
from shm_testkit import shm_serving

from trajflight.errors import InvalidRequestError, SchemaError, StaleFenceError
from trajflight.flight_server import GroupRead, LeaseToken
from trajflight.flight_server._errors import translate_errors
from trajflight.flight_server._store import GroupStore
from trajflight.flight_server._wire import decode_action_body, decode_descriptor, decode_ticket
from trajflight.flight_server._wire_bounds import ECHO_CHARS, INT64_MAX, MAX_DEPTH, _depth
from trajflight.flight_server.shm._local import LocalChannel
from trajflight.keys import Partition

KEY = Partition("job-a", 0, 1)
SERVERS = {"flight": serving, "shm": shm_serving}  # the fence board (shm) was where 2**70 overflowed


def _body(**fields: object) -> bytes:
    return json.dumps({"v": 1, **fields}).encode()


def _key(**override: object) -> dict[str, object]:
    return {"job_id": KEY.job_id, "epoch": KEY.epoch, "group_id": KEY.group_id, **override}


def _raw_action(client, name: str, body: bytes) -> None:
    with translate_errors(f"action {name}"):
        list(
            client._client.do_action(flight.Action(name, body), options=flight.FlightCallOptions(timeout=20))
        )


def _raw_get(client, ticket: bytes) -> None:
    with translate_errors("get"):
        reader = client._client.do_get(flight.Ticket(ticket), options=flight.FlightCallOptions(timeout=20))
        while True:
            try:
                reader.read_chunk()
            except StopIteration:
                return


def _local_call(client, name: str, body: bytes) -> None:
    channel = LocalChannel(client.health()["shm_socket"])
    try:
        channel.call(name, body, 20)
    finally:
        channel.close()


def _raw_put(client, descriptor: bytes) -> None:
    group = make_group(KEY)
    with translate_errors("put"):
        writer, _ = client._client.do_put(flight.FlightDescriptor.for_command(descriptor), group.schema)
        try:
            writer.write_batch(group)  # the refusal surfaces at the write or at close
        finally:
            writer.close()


def _raw_info(client, descriptor: bytes) -> None:
    with translate_errors("get_flight_info"):
        client._client.get_flight_info(flight.FlightDescriptor.for_command(descriptor))


def _raw_list(client, criteria: bytes) -> None:
    with translate_errors("list_flights"):
        list(client._client.list_flights(criteria))


SENDS = {
    "do_get": _raw_get,
    "advance_generation": lambda c, b: _raw_action(c, "advance_generation", b),
    "delete": lambda c, b: _raw_action(c, "delete", b),
    "shm_open": lambda c, b: _local_call(c, "shm_open", b),
}


@pytest.mark.parametrize("generation", [2**63, 2**70])
@pytest.mark.parametrize(
    ("server", "how"),
    [
        (server, how)
        for server in sorted(SERVERS)
        for how in sorted(SENDS)
        if server == "shm" or how != "shm_open"
    ],
)
def test_a_generation_beyond_int64_is_refused_and_leaves_the_group_as_it_was(server, generation, how):
    """Regression: ``"generation": 2**70`` answered OverflowError after raising the stored generation;
    every legitimate read and delete then got stale_fence and the group stayed leased forever."""
    with SERVERS[server]() as (_, client):
        client.put_groups([(KEY, make_group(KEY))])
        client.advance_generation([GroupRead(KEY, LeaseToken(3))])
        body = _body(groups=[_key(generation=generation)])
        with pytest.raises(InvalidRequestError, match="generation") as info:
            SENDS[how](client, body)
        assert info.value.fields["field"] == "generation"
        # Nothing moved: the holder of generation 3 still reads and deletes.
        assert client.get([GroupRead(KEY, LeaseToken(3))]).num_rows == 8
        assert client.delete([GroupRead(KEY, LeaseToken(3))])["deleted"] == 1


@pytest.mark.parametrize(
    ("what", "field", "value"),
    [
        ("epoch", "epoch", 2**63),
        ("group_id", "group_id", 2**70),
        ("nbytes", "nbytes", 2**64),
        ("num_rows", "num_rows", 2**63),
        ("group_id-float", "group_id", 1.0),
        ("epoch-bool", "epoch", True),
    ],
)
def test_a_put_with_a_number_out_of_range_is_an_invalid_request_naming_it(what, field, value):
    """Regression: ``group_id`` 2**70 in a put descriptor answered an internal OverflowError."""
    group = make_group(KEY)
    with serving() as (srv, client):
        raw = flight.FlightClient(srv.location)
        body = {"kind": "put", **_key(), "num_rows": 8, field: value}
        writer, _ = raw.do_put(flight.FlightDescriptor.for_command(_body(**body)), group.schema)
        with pytest.raises(flight.FlightServerError, match=rf"invalid_request.*'{field}'"):  # noqa: PT012
            writer.write_batch(group)  # the refusal surfaces at the write or at close
            writer.close()
        raw.close()
        assert client.stats()["groups"] == 0


@pytest.mark.parametrize("min_epoch", [2**63, 2**70, -1, 1.0, True])
def test_a_fence_beyond_int64_is_refused_and_puts_still_work(min_epoch):
    """Regression: ``min_epoch`` 2**63 was accepted; every later put then failed."""
    with serving() as (_, client):
        with pytest.raises(InvalidRequestError, match="min_epoch"):
            _raw_action(client, "fence", _body(job_id=KEY.job_id, min_epoch=min_epoch))
        assert client.stats()["jobs"] == {}
        client.put_groups([(KEY, make_group(KEY))])
        assert client.fence(KEY.job_id, INT64_MAX)["min_epoch"] == INT64_MAX  # the largest one is fine


@pytest.mark.parametrize(
    "decode",
    [
        lambda b: decode_ticket(b),
        lambda b: decode_action_body("delete", b),
        lambda b: decode_action_body("stats", b),
        lambda b: decode_descriptor(flight.FlightDescriptor.for_command(b)),
    ],
    ids=["ticket", "delete", "stats", "descriptor"],
)
@pytest.mark.parametrize("version", [1.0, True, "1", 1.5, None])
def test_the_version_is_the_integer_1_and_nothing_else(decode, version):
    """Regression: ``"v": 1.0`` was accepted as version 1."""
    body = {"v": version, "kind": "group", "groups": [_key()], **_key()}
    with pytest.raises(InvalidRequestError, match="unknown wire version") as info:
        decode(json.dumps(body).encode())
    assert info.value.fields["field"] == "v"


def _nested(depth: int) -> bytes:
    return b'{"v": 1, "groups": ' + b"[" * depth + b"]" * depth + b"}"


DEEP_SENDS = {
    "ticket": _raw_get,
    "action": lambda c, b: _raw_action(c, "delete", b),
    "descriptor": _raw_info,
    "criteria": _raw_list,
    "local": lambda c, b: _local_call(c, "shm_open", b),
}


@pytest.mark.parametrize("where", sorted(DEEP_SENDS))
def test_deeply_nested_json_is_refused_before_parsing(where):
    """Regression: 100k-deep nested JSON in tickets and action bodies raised RecursionError."""
    with shm_serving() as (_, client):
        with pytest.raises(InvalidRequestError, match="deeper than") as info:
            DEEP_SENDS[where](client, _nested(100_000))
        assert info.value.fields["field"] == "depth"
        client.put_groups([(KEY, make_group(KEY))])  # and the server serves on


def test_the_depth_bound_counts_nesting_not_brackets_inside_strings():
    shallow = {"v": 1, "groups": [_key(job_id="[" * 1000 + "{")], "columns": ["]" * 40]}
    assert decode_ticket(json.dumps(shallow).encode()).groups[0].key.job_id.startswith("[[")
    deep_enough = b'{"v": 1, "x": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b', "groups": [{}]}'
    with pytest.raises(InvalidRequestError, match="deeper than"):
        decode_ticket(deep_enough)  # MAX_DEPTH lists inside the top object: one level too many
    ok = b'{"v": 1, "x": ' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b', "groups": [{}]}'
    with pytest.raises(InvalidRequestError, match="missing field 'job_id'"):
        decode_ticket(ok)  # deep but within the bound: parsed, then refused for what it lacks


HUGE = "J" * (10 * 2**20)
HUGE_SENDS = {
    "ticket": lambda c: _raw_get(c, _body(groups=[_key(job_id=HUGE)])),
    "delete": lambda c: _raw_action(c, "delete", _body(groups=[_key(job_id=HUGE, generation=1)])),
    "fence": lambda c: _raw_action(c, "fence", _body(job_id=HUGE, min_epoch=1)),
    "criteria": lambda c: _raw_list(c, _body(job_id=HUGE)),
    "action-name": lambda c: _raw_action(c, HUGE, b""),
    "put": lambda c: _raw_put(c, _body(kind="put", **_key(job_id=HUGE), num_rows=8)),
    "column": lambda c: _raw_get(c, _body(groups=[_key()], columns=[HUGE])),
}


@pytest.mark.parametrize("where", sorted(HUGE_SENDS))
def test_a_10mb_name_gets_a_typed_error_that_echoes_at_most_100_characters(where):
    """Regression: a 10 MB job_id was echoed into the error, which gRPC then refused to carry (the
    client saw an untyped RESOURCE_EXHAUSTED)."""
    with serving() as (_, client):
        with pytest.raises(InvalidRequestError) as info:
            HUGE_SENDS[where](client)
        assert info.value.message.count("J") <= ECHO_CHARS
        client.put_groups([(KEY, make_group(KEY))])


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_json_constants_are_refused(constant):
    ticket = b'{"v": 1, "groups": [{"job_id": "j", "epoch": 0, "group_id": 1, "generation": %s}]}'
    with pytest.raises(InvalidRequestError, match="not a trajflight message"):
        decode_ticket(ticket % constant.encode())
    with pytest.raises(InvalidRequestError, match="ttl"):
        decode_action_body("shm_reserve", _body(ttl=1e400, groups=[_key(nbytes=10)]))


def test_path_descriptors_take_canonical_int64_numbers_only():
    for bad in (b"+1", b" 1", b"1_0", "\u0665".encode(), b"01", b"9223372036854775808", b"-0"):
        with pytest.raises(InvalidRequestError, match="path element"):
            decode_descriptor(flight.FlightDescriptor.for_path("j", bad, "1"))
    key = decode_descriptor(flight.FlightDescriptor.for_path("j", str(INT64_MAX), "0"))
    assert key == Partition("j", INT64_MAX, 0)


def test_a_read_refused_for_its_projection_raises_no_generation():
    """Regression: a fenced read raised the group's generation before its projection was checked, so
    a read refused with a SchemaError still fenced out the current holder."""
    with serving() as (_, client):
        client.put_groups([(KEY, make_group(KEY))])
        with pytest.raises(SchemaError, match="no column"):
            client.get([GroupRead(KEY, LeaseToken(9))], columns=["reward", "nope"])
        assert client.get([GroupRead(KEY, LeaseToken(2))], columns=["reward"]).num_rows == 8


def test_advance_generation_checks_every_group_before_raising_any():
    store = GroupStore()
    other = Partition("job-a", 0, 2)
    with pytest.raises(InvalidRequestError, match="needs a generation"):
        store.advance_generation([GroupRead(KEY, LeaseToken(7)), GroupRead(other)])
    store.advance_generation([GroupRead(KEY, LeaseToken(1))])
    store.delete([GroupRead(KEY, LeaseToken(1))])  # generation 7 was never raised: 1 is not stale
    with pytest.raises(StaleFenceError):
        store.delete([GroupRead(KEY, LeaseToken(0))])


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\u00e9', max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=4), inner, max_size=3)
    ),
    max_leaves=60,
)


def _reference_depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_reference_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_reference_depth(v) for v in value.values()), default=0)
    return 0


@given(_JSON, st.integers(0, 40), st.booleans())
def test_the_depth_scan_agrees_with_the_parser(value, wrap, ascii_only):
    """The pre-scan counts nesting as the JSON parser sees it, whatever brackets, quotes and backslashes
    the strings hold (it scans only messages with more openers than the bound)."""
    for _ in range(wrap):
        value = [value]
    data = json.dumps(value, ensure_ascii=ascii_only).encode()
    scanned = _depth(data)
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH:
        assert scanned == _reference_depth(value)
    else:
        assert scanned == 0
