"""The controller's Flight endpoint bounds what it parses and what it echoes (issue 14 item 11).

The bugs: 100k-deep nested JSON in a controller call raised RecursionError (an internal error); a 10 MB
``job_id`` was echoed into the error, which gRPC then refused as oversized (the client saw an untyped
RESOURCE_EXHAUSTED); ``{"v": 1.0}``-style floats passed where ints are expected; ``open_job(epoch=2**63)``
was accepted. Every answer to bad input must be an InvalidRequestError, quickly, with a short message.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow.flight as flight
import pytest

from trajflight import _rpc
from trajflight._control import MAX_REQUEST_BYTES, ControlServer
from trajflight._control_client import connect_control
from trajflight.controller import LocalController
from trajflight.errors import InvalidRequestError
from trajflight.flight_server._errors import translate_errors


@pytest.fixture(scope="module")
def control() -> Iterator[ControlServer]:
    with LocalController() as controller:
        server = ControlServer(controller)
        client = connect_control(server.location, timeout=10)
        client.register_server("s0", node="n", location="grpc://x", capacity_bytes=10**6, capacity_groups=99)
        client.open_job("j", 1)
        try:
            yield server
        finally:
            server.shutdown()


def _raw(server: ControlServer, kind: str, body: bytes) -> list[bytes]:
    client = flight.FlightClient(server.location)
    try:
        with translate_errors(kind):
            options = flight.FlightCallOptions(timeout=20)
            return [r.body.to_pybytes() for r in client.do_action(flight.Action(kind, body), options=options)]
    finally:
        client.close()


def _call(method: str, **kwargs: object) -> bytes:
    return _rpc.dumps({"method": method, "kwargs": kwargs})


HUGE = "x" * (10 << 20)
DEEP = b'{"$m":{"method":"counts","kwargs":' + b"[" * 100_000 + b"]" * 100_000 + b"}}"


@pytest.mark.parametrize(
    ("kind", "body", "message"),
    [
        ("call", DEEP, "nested deeper"),
        ("many", b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
        ("acquire", b'{"$m":{"kwargs":' + b'{"$m":' * 50_000 + b"{}" + b"}" * 50_001 + b"}", "nested deeper"),
        ("call", _call("counts", job_id=HUGE[: MAX_REQUEST_BYTES // 2]), "job_id must be at most"),
        ("call", b" " * (MAX_REQUEST_BYTES + 1), "exceeds the limit"),
        ("call", b'{"$m":{"method":"counts","kwargs":{"$m":{"job_id":NaN}}}}', "NaN"),
        ("call", b'{"$m":{"method":"counts","kwargs":{"$m":{"job_id":1e999}}}}', "out of range"),
        ("call", b'{"$m":{"method":"counts","kwargs":{"$m":{"job_id":"j"}}},"extra":1}', "keys"),
        ("call", b'{"$m":{"method":"group","kwargs":{"$m":{"partition":{"$e":"GroupState"}}}}}', "keys"),
        ("call", b'{"$m":{"method":"group","kwargs":{"$m":{"partition":{"$b":5}}}}}', "must be a str"),
        ("call", _call("group", partition=("j", 1.0, 0)), "epoch"),
        ("call", _call("open_job", job_id="k", epoch=2**63), "epoch"),
        ("call", _call("open_job", job_id="k", epoch=1.0), "epoch"),
        ("call", _call("renew", token=2**70), "token"),
        ("call", _call("counts", job_id="j", **{"y" * 5000: 1}), "bad arguments"),
        ("call", _rpc.dumps({"method": "counts", "kwargs": {"job_id": "j"}, "timeout": float("nan")}), "NaN"),
        ("call", _rpc.dumps({"method": "counts", "kwargs": {"job_id": "j"}, "timeout": -1}), "timeout"),
        ("call", _rpc.dumps({"method": "z" * 100_000}), "unknown controller operation"),
        ("z" * 10_000, _rpc.dumps({}), "unknown controller action"),
        (
            "acquire",
            _rpc.dumps({"kwargs": {"job_id": "j", "owner": "t", "max_groups": 1}, "wait": -1}),
            "wait",
        ),
        (
            "acquire",
            _rpc.dumps({"kwargs": {"job_id": "j", "owner": "t", "max_groups": 1}, "wait": "1"}),
            "wait",
        ),
        (
            "acquire",
            _rpc.dumps({"kwargs": {"job_id": "j", "owner": "t", "max_groups": 1}, "wait": True}),
            "wait",
        ),
        ("checkpoint", _rpc.dumps({"job_id": "j", "path": 5}), "path"),
        ("restore", _rpc.dumps({"source": b"x", "kwargs": {"data": b"y"}}), "unknown arguments"),
    ],
)
def test_bad_input_is_an_invalid_request_with_a_short_message(control, kind, body, message):
    with pytest.raises(InvalidRequestError, match=message) as err:
        _raw(control, kind, body)
    assert len(str(err.value)) < 2500
    assert all(len(str(v)) <= 200 for v in err.value.fields.values())


def test_a_ten_megabyte_job_id_is_refused_without_being_echoed(control):
    """gRPC refused the error that echoed it whole (RESOURCE_EXHAUSTED, no trajflight class)."""
    client = connect_control(control.location, timeout=20)
    with pytest.raises(InvalidRequestError, match="job_id must be at most") as err:
        client.counts(HUGE)
    assert len(str(err.value)) < 300
    with pytest.raises(InvalidRequestError, match="exceeds the limit"):  # beyond the request bound itself
        client.open_job(HUGE * 2, 1)


def test_nothing_changed_and_the_endpoint_still_serves(control):
    client = connect_control(control.location, timeout=10)
    assert client.counts("j")["READY"] == 0
    assert [s.server_id for s in client.servers()] == ["s0"]
