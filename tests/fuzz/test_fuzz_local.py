"""Bad requests on the same-host channel (the Unix socket of ``_local``), sent raw: frames over their
bounds, names that are no action (or no UTF-8), payloads where none belongs, ``shm_put`` payloads that
do not match their body, and requests cut short. Each complete request is answered with a typed error
record (never a dropped connection without an answer, never a hang); a request cut short is dropped; and
the server ends the run healthy and unchanged.

Action bodies themselves are fuzzed over this channel by ``test_fuzz_wire``; this module covers what
only the channel has: its framing.
"""

from __future__ import annotations

import json
import socket
import struct

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
    assert_serves,
    assert_unchanged,
    snapshot,
    stocked_server,
    typed,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trajflight.errors import InvalidRequestError, SchemaError
from trajflight.flight_server import ACTIONS
from trajflight.flight_server._errors import from_flight_error
from trajflight.flight_server.shm._local import MAX_FRAME, MAX_NAME_FRAME
from trajflight.keys import Partition

FUZZ = settings(derandomize=True, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
MINIMUM_CASES = 80
_LEN = struct.Struct(">I")


@pytest.fixture(scope="module")
def fuzz():
    with stocked_server() as f:
        yield f


def _frame(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


def _exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the server closed the connection without an answer")
        out += chunk
    return out


def _ask(fuzz, raw: bytes) -> tuple[bytes, bytes]:
    """Send ``raw`` on a fresh connection; the server's ``(status, frame)``."""
    path = fuzz.client.health(timeout=DEADLINE)["shm_socket"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(DEADLINE)  # a hang fails the test
        sock.connect(path)
        sock.sendall(raw)
        status = _exact(sock, 1)
        (n,) = _LEN.unpack(_exact(sock, 4))
        return status, _exact(sock, n)


def _refused(fuzz, raw: bytes, kind: str):
    fuzz.log.add(kind, raw)
    status, record = _ask(fuzz, raw)
    assert status == b"\x01", f"accepted: {record[:200]!r}"
    err = from_flight_error(flight.FlightServerError("local channel error", record))
    return typed(err)


def _request(name: bytes, body: bytes, payload: bytes = b"") -> bytes:
    return _frame(name) + _frame(body) + _frame(payload)


@pytest.mark.parametrize(
    ("which", "length"),
    [
        ("name", MAX_NAME_FRAME + 1),
        ("name", 10**6),
        ("name", 2**32 - 1),
        ("body", MAX_FRAME + 1),
        ("body", 2**32 - 1),
        ("payload", MAX_FRAME + 1),
        ("payload", 2**31),
    ],
)
def test_a_frame_over_its_bound_is_answered_then_the_connection_dropped(fuzz, which, length):
    """Only the length prefix is sent: the server refuses before reading (or allocating) the frame."""
    head = {"name": b"", "body": _frame(b"stats"), "payload": _frame(b"stats") + _frame(b"")}[which]
    err = _refused(fuzz, head + _LEN.pack(length), "frame-bound")
    assert isinstance(err, InvalidRequestError)
    assert err.fields.get("field") == "frame"


NAMES = [
    b"\xff\xfe",
    b"\xc3",
    b"",
    b"DELETE",
    b"shm_put ",
    b"list_flights",
    b"do_get",
    "\u2603".encode() * 60,
]


@pytest.mark.parametrize("name", NAMES, ids=range(len(NAMES)))
def test_a_name_that_is_no_action_is_refused(fuzz, name):
    err = _refused(fuzz, _request(name, b'{"v": 1}'), "name")
    assert isinstance(err, InvalidRequestError)
    assert len(err.message) < 400


@settings(FUZZ, max_examples=30)
@given(name=st.text(max_size=40).filter(lambda n: n not in ACTIONS), body=st.binary(max_size=40))
def test_random_names_are_refused(fuzz, name, body):
    err = _refused(fuzz, _request(name.encode(), body), "name-random")
    assert isinstance(err, InvalidRequestError)


@pytest.mark.parametrize("name", sorted(set(ACTIONS) - {"shm_put"}))
def test_a_payload_on_an_action_that_takes_none_is_refused(fuzz, name):
    err = _refused(fuzz, _request(name.encode(), b'{"v": 1}', b"\x00" * 16), "payload")
    assert isinstance(err, InvalidRequestError)
    assert err.fields.get("field") == "payload"


def _shm_put_body(nbytes: int, groups: int = 1, **more: object) -> bytes:
    entries = [
        {"job_id": JOB, "epoch": EPOCH, "group_id": FRESH + 500 + i, "nbytes": nbytes, "num_rows": 8}
        for i in range(groups)
    ]
    return json.dumps({"v": 1, "groups": entries, **more}).encode()


def _stream() -> bytes:
    group = make_group(Partition(JOB, EPOCH, FRESH + 500))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, group.schema) as writer:
        writer.write_batch(group)
    return sink.getvalue().to_pybytes()


SHM_PUTS = {
    "payload-shorter-than-nbytes": lambda s: (_shm_put_body(len(s) + 1), s),
    "payload-longer-than-nbytes": lambda s: (_shm_put_body(len(s) - 1), s),
    "two-groups": lambda s: (_shm_put_body(len(s), groups=2), s),
    "with-batch_bytes": lambda s: (_shm_put_body(len(s), batch_bytes=len(s)), s),
    "empty-payload": lambda s: (_shm_put_body(0), b""),
    "garbage-payload": lambda s: (_shm_put_body(64), b"\x07" * 64),
    "half-a-stream": lambda s: (_shm_put_body(len(s) // 2), s[: len(s) // 2]),
    "too-large-for-one-call": lambda s: (_shm_put_body(MAX_FRAME // 2 + 1), b"\x00" * (MAX_FRAME // 2 + 1)),
}


@pytest.mark.parametrize("name", sorted(SHM_PUTS))
def test_a_shm_put_whose_payload_does_not_match_its_body_is_refused(fuzz, name):
    body, payload = SHM_PUTS[name](_stream())
    err = _refused(fuzz, _request(b"shm_put", body, payload), "shm_put")
    assert isinstance(err, InvalidRequestError | SchemaError)


@settings(FUZZ, max_examples=30)
@given(cut=st.integers(0, 200), name=st.sampled_from(sorted(ACTIONS)))
def test_a_request_cut_short_is_dropped_and_the_server_serves_on(fuzz, cut, name):
    """A client that dies mid-request gets no answer (there is no one to answer); the server drops the
    connection and serves the next one."""
    raw = _request(name.encode(), b'{"v": 1, "groups": [{"job_id": "fuzz", "epoch": 1, "group_id": 0}]}')
    cut = min(cut, len(raw) - 1)
    fuzz.log.add("cut-short", raw[:cut])
    path = fuzz.client.health(timeout=DEADLINE)["shm_socket"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(DEADLINE)
        sock.connect(path)
        sock.sendall(raw[:cut])
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1) == b""  # dropped, no answer: the request never ended
    status, _ = _ask(fuzz, _request(b"health", b""))
    assert status == b"\x00"


def test_the_server_is_healthy_and_unchanged_after_the_run(fuzz):
    assert_unchanged(fuzz.baseline, snapshot(fuzz.server, fuzz.client))
    assert_consistent(fuzz.client)
    assert fuzz.client.health(timeout=DEADLINE)["status"] == "ok"
    assert_serves(fuzz.client)
    counts = fuzz.log.counts()
    print(f"distinct same-host channel cases: {fuzz.log.total()} {counts}")
    assert fuzz.log.total() >= MINIMUM_CASES, counts
