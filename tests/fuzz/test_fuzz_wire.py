"""Bad tickets, descriptors, list criteria and action bodies (every action the server lists, over Flight
and over the same-host channel) against one stocked server: each is refused with a typed error naming
what is wrong, nothing hangs, and the server ends the run healthy and unchanged.

Cases: hypothesis (``derandomize=True``: the same cases every run) draws each from a valid template broken
by one mutation (``wire_cases``), plus the hand-written table of the inputs a black-box run found
(issue 14, item 11). Every case sent is logged by its exact bytes; the last test counts the distinct ones.
"""

from __future__ import annotations

import json

import pyarrow.flight as flight
import pytest
from flight_testkit import make_group
from fuzz_kit import (
    DEADLINE,
    EPOCH,
    FRESH,
    JOB,
    OPTIONS,
    assert_consistent,
    assert_generations_read_back,
    assert_serves,
    assert_unchanged,
    refused,
    send_action,
    send_local,
    send_put,
    send_ticket,
    snapshot,
    stocked_server,
)
from hypothesis import HealthCheck, given, settings
from wire_cases import (
    ACTIONS,
    ALL,
    CRITERIA,
    DESCRIPTORS,
    GROUP,
    SHM_PUT,
    TICKETS,
    bad_messages,
    bad_paths,
)

from trajflight.errors import InvalidRequestError
from trajflight.flight_server import ACTIONS as SERVER_ACTIONS
from trajflight.flight_server._wire import (
    decode_action_body,
    decode_criteria,
    decode_descriptor,
    decode_shm_put,
    decode_ticket,
)
from trajflight.keys import Partition

FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MINIMUM_CASES = 300


@pytest.fixture(scope="module")
def fuzz():
    with stocked_server() as f:
        yield f


def _check(err, expected: set[str] | None) -> None:
    assert isinstance(err, InvalidRequestError), f"{type(err).__name__}: {err.message}"
    if expected is not None:
        assert err.fields.get("field") in expected, (err.fields, expected, err.message)
    assert "J" * 101 not in err.message  # echoes cut
    assert "x" * 101 not in err.message


def test_every_template_is_valid_and_every_listed_action_has_one():
    """The mutations alone make the cases bad: unbroken, every template decodes."""
    for t in ALL:
        data = json.dumps(t.body).encode()
        if t.target == "ticket":
            decode_ticket(data)
        elif t.target == "criteria":
            decode_criteria(data)
        elif t.target == "descriptor":
            decode_descriptor(flight.FlightDescriptor.for_command(data))
        else:
            decode_shm_put(data) if t.target == "shm_put" else decode_action_body(t.target, data)
    assert {t.target for t in (*ACTIONS, SHM_PUT)} == set(SERVER_ACTIONS)


@settings(FUZZ, max_examples=70)
@given(case=bad_messages(TICKETS))
def test_bad_tickets_are_refused(fuzz, case):
    _, _, data, fields = case
    fuzz.log.add("ticket", data)
    _check(refused(lambda: send_ticket(fuzz, data)), fields)


@settings(FUZZ, max_examples=25)
@given(case=bad_messages((CRITERIA,)))
def test_bad_list_criteria_are_refused(fuzz, case):
    _, _, data, fields = case
    fuzz.log.add("criteria", data)
    _check(refused(lambda: list(fuzz.raw.list_flights(data, options=OPTIONS))), fields)


@settings(FUZZ, max_examples=80)
@given(case=bad_messages(DESCRIPTORS))
def test_bad_command_descriptors_are_refused_by_put_info_and_schema(fuzz, case):
    t, _, data, fields = case
    descriptor = flight.FlightDescriptor.for_command(data)
    fuzz.log.add("descriptor", data)
    _check(refused(lambda: fuzz.raw.get_flight_info(descriptor, options=OPTIONS)), None)
    _check(refused(lambda: fuzz.raw.get_schema(descriptor, options=OPTIONS)), None)
    key = Partition(JOB, EPOCH, FRESH + 1)
    if t is not GROUP:
        _check(refused(lambda: send_put(fuzz, descriptor, [make_group(key)])), fields)


@settings(FUZZ, max_examples=40)
@given(parts=bad_paths(put=False))
def test_bad_path_descriptors_name_no_group(fuzz, parts):
    descriptor = flight.FlightDescriptor.for_path(*parts)
    fuzz.log.add("path", tuple(parts))
    _check(refused(lambda: fuzz.raw.get_flight_info(descriptor, options=OPTIONS)), None)


@settings(FUZZ, max_examples=40)
@given(parts=bad_paths(put=True))
def test_bad_path_puts_are_refused(fuzz, parts):
    descriptor = flight.FlightDescriptor.for_path(*parts)
    fuzz.log.add("path-put", tuple(parts))
    _check(refused(lambda: send_put(fuzz, descriptor, [make_group(Partition(JOB, EPOCH, FRESH + 8))])), None)


@settings(FUZZ, max_examples=140)
@given(case=bad_messages(ACTIONS))
def test_bad_action_bodies_are_refused_over_flight(fuzz, case):
    t, _, data, fields = case
    fuzz.log.add(f"action:{t.target}", data)
    _check(refused(lambda: send_action(fuzz, t.target, data)), fields)


@settings(FUZZ, max_examples=100)
@given(case=bad_messages((*ACTIONS, SHM_PUT)))
def test_bad_action_bodies_are_refused_over_the_same_host_channel(fuzz, case):
    t, _, data, fields = case
    fuzz.log.add(f"local:{t.target}", data)
    payload = b"x" if t.target == "shm_put" else b""
    _check(refused(lambda: send_local(fuzz, t.target, data, payload)), fields)


def _body(**fields: object) -> bytes:
    return json.dumps({"v": 1, **fields}).encode()


def _key(group_id: int = 0, **more: object) -> dict[str, object]:
    return {"job_id": JOB, "epoch": EPOCH, "group_id": group_id, **more}


HUGE = "J" * (10 * 2**20)
TABLE = {
    # issue 14, item 4: a generation beyond int64 poisoned the group
    "do_get-generation-2**70": ("ticket", _body(groups=[_key(0, generation=2**70)]), "generation"),
    "advance-generation-2**70": (
        "advance_generation",
        _body(groups=[_key(0, generation=2**70)]),
        "generation",
    ),
    "advance-generation-2**63": (
        "advance_generation",
        _body(groups=[_key(0, generation=2**63)]),
        "generation",
    ),
    "shm_open-generation-2**64": ("shm_open", _body(groups=[_key(4, generation=2**64)]), "generation"),
    "delete-generation-2**70": ("delete", _body(groups=[_key(0, generation=2**70)]), "generation"),
    "batch-generation-2**63": (
        "ticket",
        _body(batch={"job_id": JOB, "epoch": EPOCH, "group_ids": [0], "generations": [2**63]}),
        "generations",
    ),
    # issue 14, item 11
    "ticket-v-1.0": ("ticket", json.dumps({"v": 1.0, "groups": [_key(0)]}).encode(), "v"),
    "delete-v-1.0": ("delete", json.dumps({"v": 1.0, "groups": [_key(0, generation=9)]}).encode(), "v"),
    "stats-v-true": ("stats", b'{"v": true}', "v"),
    "ticket-100k-deep": ("ticket", b'{"v": 1, "groups": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "depth"),
    "delete-100k-deep": ("delete", b'{"v": 1, "groups": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "depth"),
    "fence-100k-deep-object": (
        "fence",
        b'{"v": 1, "x": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}",
        "depth",
    ),
    "ticket-10mb-job": ("ticket", _body(groups=[{**_key(0), "job_id": HUGE}]), "job_id"),
    "fence-10mb-job": ("fence", _body(job_id=HUGE, min_epoch=1), "job_id"),
    "delete-10mb-job": ("delete", _body(groups=[{**_key(0, generation=1), "job_id": HUGE}]), "job_id"),
    "fence-min_epoch-2**63": ("fence", _body(job_id=JOB, min_epoch=2**63), "min_epoch"),
    "fence-min_epoch-2**70": ("fence", _body(job_id=JOB, min_epoch=2**70), "min_epoch"),
    "fence-min_epoch-1.0": ("fence", _body(job_id=JOB, min_epoch=1.0), "min_epoch"),
    "fence-min_epoch-true": ("fence", _body(job_id=JOB, min_epoch=True), "min_epoch"),
    "criteria-epoch-2**63": ("criteria", _body(job_id=JOB, epoch=2**63), "epoch"),
    "ticket-columns-10mb": ("ticket", _body(groups=[_key(0)], columns=[HUGE]), "columns"),
    "reserve-ttl-nan": (
        "shm_reserve",
        b'{"v": 1, "ttl": NaN, "groups": [{"job_id": "fuzz", "epoch": 1, "group_id": 1001, "nbytes": 9}]}',
        None,
    ),
    "reserve-size-2**63": (
        "shm_reserve",
        _body(batch_bytes=2**63, groups=[_key(FRESH, num_rows=8)]),
        "batch_bytes",
    ),
    "publish-size-2**64": ("shm_publish", _body(groups=[{"reservation": "r", "size": 2**64}]), "size"),
    "abort-10mb-id": ("shm_abort", _body(reservations=[HUGE]), "reservations"),
    "oversized-message": ("delete", b'{"v": 1, "pad": "' + b"x" * (16 * 2**20) + b'"}', "size"),
}
FLIGHT_ONLY = {"oversized-message"}  # over the same-host channel, a frame over 16 MiB (test_fuzz_local)


def _send(fuzz, target: str, data: bytes) -> None:
    if target == "ticket":
        send_ticket(fuzz, data)
    elif target == "criteria":
        list(fuzz.raw.list_flights(data, options=OPTIONS))
    else:
        send_action(fuzz, target, data)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_the_inputs_a_black_box_run_found_are_refused_by_name(fuzz, name):
    """Regression table: each of these once answered an internal error, a RecursionError, an untyped
    RESOURCE_EXHAUSTED, or was accepted."""
    target, data, field = TABLE[name]
    fuzz.log.add(f"table:{target}", data)
    _check(refused(lambda: _send(fuzz, target, data)), None if field is None else {field})
    if target not in ("ticket", "criteria") and name not in FLIGHT_ONLY:
        fuzz.log.add(f"table-local:{target}", data)
        _check(refused(lambda: send_local(fuzz, target, data)), None if field is None else {field})


PUT_TABLE = {
    "put-group_id-2**70": ({"kind": "put", **_key(2**70), "num_rows": 8}, "group_id"),
    "put-epoch-2**63": ({"kind": "put", **_key(FRESH), "epoch": 2**63, "num_rows": 8}, "epoch"),
    "put-without-num_rows": ({"kind": "put", **_key(FRESH)}, "num_rows"),
    "put-num_rows-1.0": ({"kind": "put", **_key(FRESH), "num_rows": 8.0}, "num_rows"),
    "put-10mb-job": ({"kind": "put", **_key(FRESH), "job_id": HUGE, "num_rows": 8}, "job_id"),
    "append-generation-2**70": ({"kind": "append", **_key(1), "generation": 2**70}, "generation"),
    "put_many-group_id-2**64": ({"kind": "put_many", "groups": [_key(2**64, num_rows=8)]}, "group_id"),
}


@pytest.mark.parametrize("name", sorted(PUT_TABLE))
def test_bad_put_descriptors_from_the_black_box_run_are_refused(fuzz, name):
    body, field = PUT_TABLE[name]
    data = _body(**body)
    fuzz.log.add("table:put", data)
    descriptor = flight.FlightDescriptor.for_command(data)
    _check(refused(lambda: send_put(fuzz, descriptor, [make_group(Partition(JOB, EPOCH, FRESH))])), {field})


def test_unknown_and_oversized_action_names_are_refused(fuzz):
    for name in ("launch", "", "DELETE", "delete ", "shm_put", "\x00", "é" * 50, HUGE):
        fuzz.log.add("action-name", name)
        err = refused(lambda: send_action(fuzz, name, b""))  # noqa: B023
        assert isinstance(err, InvalidRequestError)
        assert err.message.count("J") <= 100


def test_the_server_is_healthy_and_unchanged_after_the_run(fuzz):
    """The run changed nothing: same groups, bytes, content, generations, board and counts."""
    assert_unchanged(fuzz.baseline, snapshot(fuzz.server, fuzz.client))
    assert_consistent(fuzz.client)
    assert_generations_read_back(fuzz)
    assert_unchanged(fuzz.baseline, snapshot(fuzz.server, fuzz.client))  # the read-back changed nothing
    assert fuzz.client.health(timeout=DEADLINE)["status"] == "ok"
    assert_serves(fuzz.client)
    counts = fuzz.log.counts()
    print(f"distinct wire cases: {fuzz.log.total()} {counts}")
    assert fuzz.log.total() >= MINIMUM_CASES, counts
