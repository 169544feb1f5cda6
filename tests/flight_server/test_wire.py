"""Wire records round-trip through their JSON form, and decoding never accepts what it cannot mean."""

from __future__ import annotations

import contextlib
import json

import pyarrow.flight as flight
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajflight.errors import InvalidRequestError
from trajflight.flight_server import GetTicket, GroupRead, LeaseToken, PutDescriptor
from trajflight.flight_server._wire import (
    AppendDescriptor,
    DeleteRequest,
    FenceRequest,
    PutManyDescriptor,
    ShmBatchPublishRequest,
    ShmBatchReserveRequest,
    ShmPublishRequest,
    ShmReserveRequest,
    decode_action_body,
    decode_descriptor,
    decode_ticket,
    encode,
)
from trajflight.keys import Partition

keys = st.builds(Partition, st.text(min_size=1, max_size=20), st.integers(0, 2**62), st.integers(0, 2**62))
tokens = st.none() | st.builds(LeaseToken, st.integers(0, 2**62))
reads = st.builds(GroupRead, keys, tokens)


@given(st.lists(reads, min_size=1, max_size=20), st.none() | st.lists(st.text(max_size=10), unique=True))
def test_tickets_round_trip(groups, columns):
    ticket = GetTicket(tuple(groups), None if columns is None else tuple(columns))
    assert decode_ticket(encode(ticket)) == ticket


@given(keys, st.text(max_size=10), st.none() | st.integers(0, 2**40), st.integers(0, 2**20))
def test_put_descriptors_round_trip(key, writer, nbytes, num_rows):
    put = PutDescriptor(key, writer, nbytes, num_rows)
    assert decode_descriptor(flight.FlightDescriptor.for_command(encode(put))) == put


@given(st.lists(keys, min_size=1, max_size=10, unique=True), st.integers(1, 100))
def test_put_many_descriptors_round_trip(group_keys, rows):
    many = PutManyDescriptor(tuple(PutDescriptor(k, "w", num_rows=rows) for k in group_keys), "w")
    assert decode_descriptor(flight.FlightDescriptor.for_command(encode(many))) == many


@given(keys, st.builds(LeaseToken, st.integers(0, 2**62)))
def test_append_descriptors_and_deletes_round_trip(key, token):
    append = AppendDescriptor(key, token, 10)
    assert decode_descriptor(flight.FlightDescriptor.for_command(encode(append))) == append
    delete = DeleteRequest((GroupRead(key, token),))
    assert decode_action_body("delete", encode(delete)) == delete


@given(
    st.lists(st.integers(0, 2**40), min_size=2, max_size=20, unique=True),
    st.lists(st.integers(0, 2**62), min_size=20, max_size=20),
)
def test_many_reads_of_one_job_and_epoch_travel_compactly_and_round_trip(group_ids, generations):
    pairs = zip(group_ids, generations[: len(group_ids)], strict=True)
    reads = tuple(GroupRead(Partition("j", 2, g), LeaseToken(n)) for g, n in pairs)
    ticket = GetTicket(reads, ("reward",))
    assert set(json.loads(encode(ticket))) == {"v", "batch", "columns"}
    assert decode_ticket(encode(ticket)) == ticket
    assert decode_action_body("delete", encode(DeleteRequest(reads))) == DeleteRequest(reads)
    # Reads that do not fit the compact form (tokenless, another epoch) keep the full one.
    for odd in (GroupRead(reads[0].key, None), GroupRead(Partition("j", 3, 0), LeaseToken(1))):
        mixed = GetTicket((*reads[1:], odd), None)
        assert '"groups"' in encode(mixed).decode()
        assert decode_ticket(encode(mixed)) == mixed


@pytest.mark.parametrize(
    "batch",
    [
        [],
        {"job_id": "", "epoch": 0, "group_ids": [1], "generations": [1]},
        {"job_id": "j", "epoch": 0, "group_ids": [1, 2], "generations": [1]},
        {"job_id": "j", "epoch": 0, "group_ids": [True], "generations": [1]},
        {"job_id": "j", "epoch": 0, "group_ids": [1], "generations": [-1]},
        {"job_id": "j", "epoch": -1, "group_ids": [1], "generations": [1]},
        {"job_id": "j", "epoch": 0, "group_ids": [], "generations": []},
    ],
)
def test_malformed_compact_reads_are_invalid_requests(batch):
    with pytest.raises(InvalidRequestError):
        decode_ticket(json.dumps({"v": 1, "batch": batch}).encode())
    both = {"v": 1, "batch": batch, "groups": [{"job_id": "j", "epoch": 0, "group_id": 1}]}
    with pytest.raises(InvalidRequestError):
        decode_ticket(json.dumps(both).encode())


@given(
    st.lists(st.integers(0, 2**62), min_size=1, max_size=64, unique=True),
    st.data(),
    st.none() | st.floats(0.5, 3600),
)
def test_a_batch_reservation_travels_as_arrays_and_round_trips(group_ids, data, ttl):
    rows = tuple(data.draw(st.lists(st.integers(1, 2**20), min_size=len(group_ids), max_size=len(group_ids))))
    request = ShmBatchReserveRequest("run-7", 2, tuple(group_ids), rows, 9_500_000, "w", ttl)
    body = json.loads(encode(request))
    assert set(body) == {"v", "writer", "batch_bytes", "batch"} | ({"ttl"} if ttl is not None else set())
    assert body["batch"]["group_ids"] == group_ids
    assert decode_action_body("shm_reserve", encode(request)) == request
    publish = ShmBatchPublishRequest("abc", 9_400_000)
    assert json.loads(encode(publish)) == {"v": 1, "batch": {"reservation": "abc", "size": 9_400_000}}
    assert decode_action_body("shm_publish", encode(publish)) == publish


@given(st.lists(keys, min_size=1, max_size=10, unique=True), st.integers(1, 100))
def test_reservations_of_a_group_each_still_round_trip(group_keys, rows):
    """The ``groups`` form (groups of several jobs or epochs) means what it always did: one segment of
    ``batch_bytes`` for the groups, one reservation named per group."""
    puts = tuple(PutDescriptor(k, "w", None, rows) for k in group_keys)
    request = ShmReserveRequest(puts, "w", 5.0, 1 << 20)
    assert decode_action_body("shm_reserve", encode(request)) == request
    publish = ShmPublishRequest(tuple((f"r{i}", 100 + i) for i in range(len(group_keys))))
    assert decode_action_body("shm_publish", encode(publish)) == publish


def test_a_reservation_of_one_segment_per_group_is_no_longer_a_form():
    """Issue 15 removed the ``groups`` form without ``batch_bytes`` (a segment per group): no trajflight
    client sends it (a list of groups is one stream in one segment); it is refused, naming the field."""
    request = ShmReserveRequest((PutDescriptor(Partition("j", 1, 1), "w", 4096, 8),), "w")
    with pytest.raises(InvalidRequestError, match="batch_bytes") as info:
        decode_action_body("shm_reserve", encode(request))
    assert info.value.fields["field"] == "batch_bytes"


_BATCH = {"job_id": "j", "epoch": 1, "group_ids": [1, 2], "rows": [8, 8]}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"batch": [], "batch_bytes": 10}, "batch"),
        ({"batch": {**_BATCH, "job_id": ""}, "batch_bytes": 10}, "batch"),
        ({"batch": {**_BATCH, "job_id": 3}, "batch_bytes": 10}, "job_id"),
        ({"batch": {**_BATCH, "epoch": -1}, "batch_bytes": 10}, "epoch"),
        ({"batch": {**_BATCH, "epoch": True}, "batch_bytes": 10}, "epoch"),
        ({"batch": {**_BATCH, "group_ids": []}, "batch_bytes": 10}, "batch"),
        ({"batch": {**_BATCH, "group_ids": [1]}, "batch_bytes": 10}, "batch"),
        ({"batch": {**_BATCH, "group_ids": "12"}, "batch_bytes": 10}, "group_ids"),
        ({"batch": {**_BATCH, "group_ids": [1, -2]}, "batch_bytes": 10}, "group_ids"),
        ({"batch": {**_BATCH, "group_ids": [1, True]}, "batch_bytes": 10}, "group_ids"),
        ({"batch": {**_BATCH, "group_ids": [1, 1]}, "batch_bytes": 10}, "group_ids"),
        ({"batch": {**_BATCH, "rows": [8, 0]}, "batch_bytes": 10}, "rows"),
        ({"batch": {**_BATCH, "rows": [8, 2.5]}, "batch_bytes": 10}, "rows"),
        ({"batch": _BATCH}, "batch_bytes"),
        ({"batch": _BATCH, "batch_bytes": 0}, "batch_bytes"),
        ({"batch": _BATCH, "batch_bytes": -1}, "batch_bytes"),
        ({"batch": _BATCH, "batch_bytes": 10, "ttl": 0}, "ttl"),
        ({"batch": _BATCH, "batch_bytes": 10, "writer": 5}, "writer"),
        (
            {"batch": _BATCH, "batch_bytes": 10, "groups": [{"job_id": "j", "epoch": 1, "group_id": 1}]},
            "batch",
        ),
    ],
)
def test_malformed_batch_reservations_are_invalid_requests_naming_the_field(body, field):
    with pytest.raises(InvalidRequestError) as caught:
        decode_action_body("shm_reserve", json.dumps({"v": 1, **body}).encode())
    assert caught.value.fields.get("field") == field


@pytest.mark.parametrize(
    "body",
    [
        {"batch": "r"},
        {"batch": {"size": 10}},
        {"batch": {"reservation": 7, "size": 10}},
        {"batch": {"reservation": "r"}},
        {"batch": {"reservation": "r", "size": -1}},
        {"batch": {"reservation": "r", "size": False}},
        {"batch": {"reservation": "r", "size": 10}, "groups": [{"reservation": "r", "size": 10}]},
    ],
)
def test_malformed_batch_publishes_are_invalid_requests(body):
    with pytest.raises(InvalidRequestError):
        decode_action_body("shm_publish", json.dumps({"v": 1, **body}).encode())


def test_fence_round_trips():
    fence = FenceRequest("job", 3, True)
    assert decode_action_body("fence", encode(fence)) == fence


@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_invalid_request(data):
    for decode in (decode_ticket, lambda d: decode_action_body("delete", d)):
        with contextlib.suppress(InvalidRequestError):
            decode(data)


def test_unknown_fields_are_ignored_within_a_version():
    body = {"v": 1, "groups": [{"job_id": "j", "epoch": 0, "group_id": 1, "hint": "x"}], "future": 1}
    assert decode_ticket(json.dumps(body).encode()).groups[0].key == Partition("j", 0, 1)
