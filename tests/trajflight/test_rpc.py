"""The control plane's typed JSON: records round-trip, nothing else is accepted."""

from __future__ import annotations

import pytest

from trajflight import (
    _control,  # noqa: F401 - registers the controller's records
    _rpc,
)
from trajflight.controller import GroupInfo, GroupState, Lease, Partition
from trajflight.errors import InvalidRequestError


def _info() -> GroupInfo:
    return GroupInfo(
        Partition("j", 1, 2),
        GroupState.LEASED,
        "s0",
        "grpc://127.0.0.1:1",
        7,
        8,
        100,
        50,
        3,
        ("a", "b"),
        None,
    )


def test_records_enums_bytes_and_containers_round_trip():
    value = {
        "lease": Lease(7, "j", "me", 12.5, (_info(),)),
        "raw": b"\x00\xff",
        "pair": (1, "x"),
        "list": [None, True, 2.5],
        "state": GroupState.READY,
    }
    back = _rpc.loads(_rpc.dumps(value))
    assert back == value
    assert isinstance(back["lease"].groups[0].partition, Partition)
    assert back["state"] is GroupState.READY


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "not JSON"),
        (b'{"$d": "os.system", "v": {}}', "unknown record type"),
        (b'{"$d": "Partition", "v": {"nope": 1}}', "malformed"),
        (b'{"surprise": 1}', "untagged object"),
        (b'{"$b": "***"}', "malformed"),
    ],
)
def test_garbage_and_unknown_records_are_refused(data, message):
    with pytest.raises(InvalidRequestError, match=message):
        _rpc.loads(data)


def test_unsendable_values_are_refused():
    with pytest.raises(InvalidRequestError, match="cannot send a object"):
        _rpc.dumps(object())
    with pytest.raises(InvalidRequestError, match="non-string keys"):
        _rpc.dumps({1: 2})
