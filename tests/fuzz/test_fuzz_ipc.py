"""Tampered Arrow IPC against one stocked server: over a raw Flight ``do_put`` (puts and column appends),
and over the same-host path (a segment of its own, a batch's shared segment, and an inline ``shm_put``
over the Unix socket). Each case is refused with a typed error, nothing hangs, nothing is kept, and the
server ends the run healthy and unchanged.

Cases: the hand-written tables of ``ipc_cases`` (each tampering, on every path it applies to), plus
hypothesis (``derandomize=True``) over offsets, truncation points, flipped bytes and corrupted message
lengths. Every case is logged by its exact bytes; the last test counts the distinct ones.
"""

from __future__ import annotations

import itertools
import json

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_testkit import make_group
from fuzz_kit import (
    DEADLINE,
    EPOCH,
    FRESH,
    JOB,
    assert_consistent,
    assert_generations_read_back,
    assert_serves,
    assert_unchanged,
    refused,
    send_local,
    send_put,
    snapshot,
    stocked_server,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ipc_cases import (
    BATCH_TAMPERS,
    SCHEMA_SWAPS,
    bad_offset_values,
    flip,
    joined,
    regions,
    stream_of,
    with_int32,
    with_list_offset,
)

from trajflight.errors import (
    AlreadyExistsError,
    InvalidRequestError,
    SchemaError,
    StaleFenceError,
)
from trajflight.flight_server import LeaseToken, PutDescriptor
from trajflight.flight_server._wire import AppendDescriptor, encode
from trajflight.keys import Partition

FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MINIMUM_CASES = 200
_IDS = itertools.count(FRESH + 100)


@pytest.fixture(scope="module")
def fuzz():
    with stocked_server() as f:
        yield f


def _fresh() -> Partition:
    """A key nothing was ever put under: a tampered put of it must be refused, never stored."""
    return Partition(JOB, EPOCH, next(_IDS))


def _flight_put(fuzz, key: Partition, batch: pa.RecordBatch) -> None:
    descriptor = flight.FlightDescriptor.for_command(
        encode(PutDescriptor(key, "fuzz", num_rows=batch.num_rows))
    )
    send_put(fuzz, descriptor, [batch])


def _check(err) -> None:
    assert isinstance(err, SchemaError | InvalidRequestError), f"{type(err).__name__}: {err.message}"


# ------------------------------------------------------------------------------------ over Flight


@pytest.mark.parametrize("name", sorted(BATCH_TAMPERS))
def test_a_tampered_batch_over_flight_is_refused(fuzz, name):
    key = _fresh()
    batch = BATCH_TAMPERS[name](make_group(key))
    fuzz.log.add("flight-batch", name)
    _check(refused(lambda: _flight_put(fuzz, key, batch)))


@settings(FUZZ, max_examples=40)
@given(
    column=st.sampled_from(["prompt_ids", "response_ids", "response_logprobs", "loss_mask"]),
    slot=st.integers(0, 8),
    pick=st.integers(0, 10),
)
def test_list_offsets_out_of_range_over_flight_are_refused(fuzz, column, slot, pick):
    key = _fresh()
    group = make_group(key)
    values = bad_offset_values(group, column, slot)
    value = values[pick % len(values)]
    fuzz.log.add("flight-offsets", column, slot, value)
    _check(refused(lambda: _flight_put(fuzz, key, with_list_offset(group, column, slot, value))))


def _append(fuzz, key: Partition, batch: pa.RecordBatch, generation: int = 2) -> None:
    descriptor = flight.FlightDescriptor.for_command(encode(AppendDescriptor(key, LeaseToken(generation))))
    send_put(fuzz, descriptor, [batch])


def _column(name: str, values: pa.Array) -> pa.RecordBatch:
    return pa.record_batch({name: values})


APPENDED = Partition(JOB, EPOCH, 1)  # the baseline's group with an appended column, at generation 2
APPEND_TAMPERS = {
    "too-few-rows": (lambda: _column("extra", pa.array([1.0] * 7, pa.float32())), 2, SchemaError),
    "too-many-rows": (lambda: _column("extra", pa.array([1.0] * 9, pa.float32())), 2, SchemaError),
    "a-key-column": (lambda: _column("group_id", pa.array([1] * 8, pa.int64())), 2, SchemaError),
    "an-existing-column": (
        lambda: _column("reward", pa.array([1.0] * 8, pa.float32())),
        2,
        AlreadyExistsError,
    ),
    "the-appended-column-again": (
        lambda: _column("score", pa.array([1.0] * 8, pa.float32())),
        2,
        AlreadyExistsError,
    ),
    "a-stale-generation": (lambda: _column("extra", pa.array([1.0] * 8, pa.float32())), 1, StaleFenceError),
    "bad-offsets": (
        lambda: _column(
            "extra_ids",
            pa.Array.from_buffers(
                pa.list_(pa.int32()),
                8,
                [None, pa.py_buffer(bytes(pa.array([0, 1, 9, 2, 3, 4, 5, 6, 8], pa.int32()).buffers()[1]))],
                children=[pa.array(range(8), pa.int32())],
            ),
        ),
        2,
        SchemaError | InvalidRequestError,
    ),
    "invalid-utf8": (
        lambda: _column(
            "note",
            pa.Array.from_buffers(
                pa.string(),
                8,
                [
                    None,
                    pa.array([0, 1, 2, 3, 4, 5, 6, 7, 8], pa.int32()).buffers()[1],
                    pa.py_buffer(b"\xff" * 8),
                ],
            ),
        ),
        2,
        SchemaError | InvalidRequestError,
    ),
    "group-not-stored": (lambda: _column("extra", pa.array([1.0] * 8, pa.float32())), 2, None),
}


@pytest.mark.parametrize("name", sorted(APPEND_TAMPERS))
def test_a_tampered_column_append_is_refused(fuzz, name):
    make, generation, expected = APPEND_TAMPERS[name]
    key = _fresh() if name == "group-not-stored" else APPENDED
    fuzz.log.add("flight-append", name)
    err = refused(lambda: _append(fuzz, key, make(), generation))
    if expected is not None:
        assert isinstance(err, expected), f"{type(err).__name__}: {err.message}"


# ----------------------------------------------------------------------------------- same host


def _reserve_segment(fuzz, key: Partition, nbytes: int) -> dict:
    body = {
        "v": 1,
        "batch_bytes": nbytes,
        "groups": [{"job_id": key.job_id, "epoch": key.epoch, "group_id": key.group_id, "num_rows": 8}],
    }
    return fuzz.client._action("shm_reserve", json.dumps(body).encode(), DEADLINE)["segments"][0]


def _segment_put(fuzz, key: Partition, data: bytes, size: int) -> None:
    segment = _reserve_segment(fuzz, key, max(len(data), 1))
    with open(segment["path"], "r+b") as f:
        f.write(data)
    body = {"v": 1, "groups": [{"reservation": segment["reservation"], "size": size}]}
    fuzz.client._action("shm_publish", json.dumps(body).encode(), DEADLINE)


def _batch_put(fuzz, keys: list[Partition], data: bytes, size: int) -> None:
    batch = {"job_id": JOB, "epoch": EPOCH, "group_ids": [k.group_id for k in keys], "rows": [8] * len(keys)}
    body = {"v": 1, "batch_bytes": max(len(data), 1), "batch": batch}
    reply = fuzz.client._action("shm_reserve", json.dumps(body).encode(), DEADLINE)["batch"]
    with open(reply["path"], "r+b") as f:
        f.write(data)
    body = {"v": 1, "batch": {"reservation": reply["reservation"], "size": size}}
    fuzz.client._action("shm_publish", json.dumps(body).encode(), DEADLINE)


def _inline_put(fuzz, key: Partition, data: bytes, size: int) -> None:
    payload = data[:size]
    body = {
        "v": 1,
        "groups": [
            {
                "job_id": key.job_id,
                "epoch": key.epoch,
                "group_id": key.group_id,
                "nbytes": len(payload),
                "num_rows": 8,
            }
        ],
    }
    send_local(fuzz, "shm_put", json.dumps(body).encode(), payload)


PATHS = {"segment": _segment_put, "inline": _inline_put, "batch": None}


def _send(fuzz, path: str, build, log: tuple) -> None:
    """Put a tampered stream on ``path``; ``build(keys) -> (bytes, size)`` makes it for the keys."""
    keys = [_fresh(), _fresh()] if path == "batch" else [_fresh()]
    data, size = build(keys)
    fuzz.log.add(f"shm-{path}", *log, data, size)
    if path == "batch":
        _check(refused(lambda: _batch_put(fuzz, keys, data, size)))
    else:
        _check(refused(lambda: PATHS[path](fuzz, keys[0], data, size)))


def _group(keys: list[Partition]) -> pa.RecordBatch:
    return joined(keys) if len(keys) > 1 else make_group(keys[0])


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("name", sorted(BATCH_TAMPERS))
def test_a_tampered_batch_over_the_same_host_path_is_refused(fuzz, path, name):
    def build(keys):
        stream = stream_of(BATCH_TAMPERS[name](_group(keys)))
        return stream.data, len(stream.data)

    _send(fuzz, path, build, (name,))


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("name", sorted(SCHEMA_SWAPS))
def test_a_schema_message_that_does_not_match_its_batch_is_refused(fuzz, path, name):
    def build(keys):
        batch = _group(keys)
        stream = stream_of(batch, SCHEMA_SWAPS[name](batch.schema))
        return stream.data, len(stream.data)

    _send(fuzz, path, build, (name,))


@pytest.mark.parametrize(
    ("path", "how"),
    [
        (path, how)
        for path in sorted(PATHS)
        for how in ("zero", "beyond-the-segment", "empty-stream", "schema-only", "garbage")
        if path != "inline" or how != "beyond-the-segment"  # an inline payload's size is the payload's
    ],
)
def test_sizes_and_streams_that_hold_no_group_are_refused(fuzz, path, how):

    def build(keys):
        stream = stream_of(_group(keys))
        if how == "zero":
            return stream.data, 0
        if how == "beyond-the-segment":
            return stream.data, len(stream.data) + 4096 * 1024
        if how == "empty-stream":
            return b"\xff\xff\xff\xff\x00\x00\x00\x00", 8
        if how == "schema-only":
            return stream.data[
                : stream.schema_end
            ] + b"\xff\xff\xff\xff\x00\x00\x00\x00", stream.schema_end + 8
        return b"ARROW1\x00\x00" + bytes(range(256)) * 4, 8 + 1024

    _send(fuzz, path, build, (how,))


@settings(FUZZ, max_examples=50)
@given(path=st.sampled_from(sorted(PATHS)), cut=st.floats(0.0, 1.0, exclude_max=True))
def test_a_truncated_stream_is_refused(fuzz, path, cut):
    def build(keys):
        stream = stream_of(_group(keys))
        size = 1 + int(cut * (stream.batch_end - 1))  # strictly before the batch's end: never whole
        return stream.data, size

    _send(fuzz, path, build, ("cut", cut))


@settings(FUZZ, max_examples=60)
@given(
    path=st.sampled_from(sorted(PATHS)),
    region=st.sampled_from(["group_id", "epoch", "job_id-data", "job_id-offsets", "response_ids-offsets"]),
    where=st.floats(0.0, 1.0, exclude_max=True),
    xor=st.integers(1, 255),
)
def test_a_flipped_byte_in_a_key_or_offsets_buffer_is_refused(fuzz, path, region, where, xor):
    def build(keys):
        batch = _group(keys)
        stream = stream_of(batch)
        start, end = regions(batch, stream)[region]
        data = flip(stream.data, start + int(where * (end - start)), xor)
        return data, len(data)

    _send(fuzz, path, build, (region, where, xor))


@settings(FUZZ, max_examples=30)
@given(
    path=st.sampled_from(sorted(PATHS)),
    message=st.sampled_from(["schema", "batch"]),
    value=st.sampled_from([-8, -1, 2**31 - 1, 2**20, 0x7FFF0000]),
)
def test_a_corrupted_message_length_is_refused(fuzz, path, message, value):
    def build(keys):
        stream = stream_of(_group(keys))
        at = (0 if message == "schema" else stream.schema_end) + 4  # after the continuation marker
        data = with_int32(stream.data, at, value)
        return data, len(data)

    _send(fuzz, path, build, (message, value))


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_stream_of_a_stored_group_under_a_fresh_key_is_refused(fuzz, path):
    def build(keys):
        data = stream_of(_group([Partition(JOB, EPOCH, 0)] * len(keys))).data  # the rows name group 0
        return data, len(data)

    _send(fuzz, path, build, ("stored-key",))


def test_the_server_is_healthy_and_unchanged_after_the_run(fuzz):
    """The run changed nothing: same groups, bytes, content, generations, board and counts, and no
    segment or reservation was left behind."""
    assert_unchanged(fuzz.baseline, snapshot(fuzz.server, fuzz.client))
    assert_consistent(fuzz.client)
    assert_generations_read_back(fuzz)
    assert fuzz.client.health(timeout=DEADLINE)["status"] == "ok"
    assert_serves(fuzz.client)
    counts = fuzz.log.counts()
    print(f"distinct IPC cases: {fuzz.log.total()} {counts}")
    assert fuzz.log.total() >= MINIMUM_CASES, counts
