"""Wire records round-trip through their JSON form, and decoding never accepts what it cannot mean."""

from __future__ import annotations

import contextlib
import json

import pyarrow.flight as flight
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajflight.codec import GroupKey
from trajflight.errors import InvalidRequestError
from trajflight.flight_server import GetTicket, GroupRead, LeaseToken, PutDescriptor, TokenSigner
from trajflight.flight_server._wire import (
    AppendDescriptor,
    DeleteRequest,
    FenceRequest,
    PutManyDescriptor,
    decode_action_body,
    decode_descriptor,
    decode_ticket,
    encode,
)

keys = st.builds(GroupKey, st.text(min_size=1, max_size=20), st.integers(0, 2**62), st.integers(0, 2**62))
tokens = st.none() | st.builds(LeaseToken, st.integers(0, 2**62), st.none() | st.text(max_size=64))
reads = st.builds(GroupRead, keys, tokens)


@given(st.lists(reads, min_size=1, max_size=20), st.none() | st.lists(st.text(max_size=10), unique=True))
def test_tickets_round_trip(groups, columns):
    ticket = GetTicket(tuple(groups), None if columns is None else tuple(columns))
    assert decode_ticket(encode(ticket)) == ticket


@given(keys, st.text(max_size=10), st.none() | st.integers(0, 2**40), st.none() | st.integers(0, 2**20))
def test_put_descriptors_round_trip(key, writer, nbytes, num_rows):
    put = PutDescriptor(key, writer, nbytes, num_rows, None)
    assert decode_descriptor(flight.FlightDescriptor.for_command(encode(put))) == put


@given(st.lists(keys, min_size=1, max_size=10, unique=True), st.integers(1, 100))
def test_put_many_descriptors_round_trip(group_keys, rows):
    many = PutManyDescriptor(tuple(PutDescriptor(k, "w", num_rows=rows) for k in group_keys), "w")
    assert decode_descriptor(flight.FlightDescriptor.for_command(encode(many))) == many


@given(keys, st.builds(LeaseToken, st.integers(0, 2**62), st.none() | st.text(max_size=8)))
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
    reads = tuple(GroupRead(GroupKey("j", 2, g), LeaseToken(n)) for g, n in pairs)
    ticket = GetTicket(reads, ("reward",))
    assert set(json.loads(encode(ticket))) == {"v", "batch", "columns"}
    assert decode_ticket(encode(ticket)) == ticket
    assert decode_action_body("delete", encode(DeleteRequest(reads))) == DeleteRequest(reads)
    # Reads that do not fit the compact form (signed, tokenless, another epoch) keep the full one.
    for odd in (GroupRead(reads[0].key, LeaseToken(1, "sig")), GroupRead(reads[0].key, None)):
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


def test_fence_round_trips():
    fence = FenceRequest("job", 3, True, "ab")
    assert decode_action_body("fence", encode(fence)) == fence


@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_invalid_request(data):
    for decode in (decode_ticket, lambda d: decode_action_body("delete", d)):
        with contextlib.suppress(InvalidRequestError):
            decode(data)


def test_unknown_fields_are_ignored_within_a_version():
    body = {"v": 1, "groups": [{"job_id": "j", "epoch": 0, "group_id": 1, "hint": "x"}], "future": 1}
    assert decode_ticket(json.dumps(body).encode()).groups[0].key == GroupKey("j", 0, 1)


def test_signatures_bind_every_field():
    signer = TokenSigner(b"s" * 32)
    key = GroupKey("j", 1, 2)
    sigs = {
        signer.sign_put(key),
        signer.sign_lease(key, 5),
        signer.sign_lease(key, 6),
        signer.sign_lease(GroupKey("j", 1, 3), 5),
        signer.sign_fence("j", 1),
    }
    assert len(sigs) == 5
    assert TokenSigner.verify(signer.sign_put(key), signer.sign_put(key))
    assert not TokenSigner.verify(signer.sign_put(key), None)
    with pytest.raises(InvalidRequestError, match="16 bytes"):
        TokenSigner(b"short")
