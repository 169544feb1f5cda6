"""Bad-input fuzzing of the controller's Flight endpoint (issue 14: "bad-input fuzzing of every endpoint").

Every action of :class:`~trajflight._control.ControlServer` (``call``, ``many``, ``acquire``,
``checkpoint``, ``restore``, ``info``) and every operation in :data:`~trajflight._control.CALLS` gets
malformed input from a raw ``pyarrow.flight`` client, as any other language would send it: wrong types,
ints outside int64 or below their minimum, floats and bools where ints belong, NaN and infinities, huge
and empty names, deep nesting, unknown and missing fields, records with wrong tags or fields, bodies that
are not JSON. Each case must be answered with an :class:`~trajflight.errors.InvalidRequestError` (or a
subclass) within a deadline and with a short message, and leave the ledger as it was (counts, usage,
servers, live leases, fences, GC list, tokens issued); afterwards a legitimate open, put, lease and
commit still work.

Cases: the explicit table :data:`CASES` (one pytest case each, every operation and action; its size is
asserted), plus two derandomized hypothesis tests drawing further cases from strategies per argument
kind (:data:`HYPOTHESIS_EXAMPLES` each).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow.flight as flight
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trajflight
from trajflight import _rpc
from trajflight._control import CALLS, MAX_REQUEST_BYTES
from trajflight.controller import COMMANDS, Partition, Publication
from trajflight.errors import InvalidRequestError, TrajflightError
from trajflight.flight_server._errors import translate_errors

BIG = 2**63
DEADLINE = 10.0  # seconds: a bound on hangs, never a measurement
HYPOTHESIS_EXAMPLES = 150


# ---------------------------------------------------------------------------------------- the plane


_GROUP = {
    "prompt_ids": [[1, 2]],
    "response_ids": [[3, 4, 5]],
    "response_logprobs": [[-0.1, -0.2, -0.3]],
    "reward": [1.0],
}


@dataclass
class Facts:
    """A running plane with a job in a known state: what valid templates are made of."""

    cluster: trajflight.LocalCluster
    client: trajflight.Client
    location: str
    token: int  # a live lease (long TTL), one group LEASED
    partition: Partition  # a READY, published group
    grant_token: int
    nbytes: int
    rows: int
    tokens: int
    raw: flight.FlightClient = None  # type: ignore[assignment]  # a plain Flight client of the endpoint

    def observed(self) -> tuple[Any, ...]:
        """The ledger as a tuple (in-process queries: no lazy expiry, nothing journaled)."""
        host = self.cluster.controller
        assert host is not None
        ledger = host._core.ledger
        return (
            host.call("counts", {"job_id": "j"}),
            host.call("usage", {"job_id": "j"}),
            host.call("servers"),
            host.call("live_leases"),
            host.call("fence_list"),
            host.call("gc_list"),
            host.call("policy_status", {"job_id": "j"}),
            ledger.last_token,
            ledger.incarnation,
            sorted(ledger._jobs.ids()),
        )


@pytest.fixture(scope="module")
def facts() -> Iterator[Facts]:
    with trajflight.LocalCluster(servers=1, capacity="64MiB", processes=False, timeout=20.0) as cluster:
        client = cluster.client()
        client.open_job("j", 1, {"default_lease_ttl": "600s"})
        writer = client.writer("j", 1, writer_id="w")
        metas = [writer.put(**_GROUP) for _ in range(3)]
        lease = client.controller.acquire("j", "holder", max_groups=1)
        assert lease is not None
        ready = client.controller.group(metas[-1].partition)
        raw = flight.FlightClient(cluster.address)
        try:
            yield Facts(
                cluster,
                client,
                cluster.address,
                lease.token,
                ready.partition,
                ready.generation,
                ready.nbytes,
                ready.rows,
                ready.tokens,
                raw,
            )
        finally:
            raw.close()


def _raw(client: flight.FlightClient, kind: str, body: bytes) -> TrajflightError | None:
    """One action from a plain Flight client; the trajflight error it was answered with (None: success)."""
    try:
        with translate_errors(kind):
            options = flight.FlightCallOptions(timeout=DEADLINE)
            list(client.do_action(flight.Action(kind, body), options=options))
    except TrajflightError as exc:
        return exc
    return None


def _refused(facts: Facts, kind: str, body: bytes) -> None:
    before = facts.observed()
    error = _raw(facts.raw, kind, body)
    assert isinstance(error, InvalidRequestError), f"{kind}: answered {error!r}"
    assert len(str(error)) < 2500, len(str(error))
    assert facts.observed() == before, f"{kind}: the ledger changed"


# ---------------------------------------------------------------------------------------- operations

# Valid kwargs of every operation, as functions of the facts. A case replaces one argument with a bad
# value (every other argument stays valid), adds an unknown one, or leaves a required one out.
TEMPLATES: dict[str, Callable[[Facts], dict[str, Any]]] = {
    "register_server": lambda f: {
        "server_id": "s-new", "node": "n", "location": "grpc://127.0.0.1:1", "capacity_bytes": 10,
        "capacity_groups": 1,
    },
    "open_job": lambda f: {"job_id": "j", "epoch": 1, "config": None, "old_ready": "reoffer"},
    "register_writer": lambda f: {
        "job_id": "j", "epoch": 1, "writer_id": "w", "node": "n", "policy_version": 0,
    },
    "announce_policy": lambda f: {"job_id": "j", "version": 0},
    "ack_policy": lambda f: {"job_id": "j", "epoch": 1, "writer_id": "w", "version": 0},
    "policy_status": lambda f: {"job_id": "j"},
    "allocate": lambda f: {"job_id": "j", "epoch": 1, "writer_id": "w", "nbytes": 100},
    "allocate_many": lambda f: {"job_id": "j", "epoch": 1, "writer_id": "w", "nbytes": [100, 100]},
    "publish": lambda f: {
        "partition": f.partition, "token": f.grant_token, "rows": f.rows, "nbytes": f.nbytes,
        "tokens": f.tokens, "policy_version": 0, "columns": ("prompt_ids",),
    },
    "publish_many": lambda f: {
        "items": [Publication(f.partition, f.grant_token, f.rows, f.nbytes, f.tokens, 0, ("prompt_ids",))]
    },
    "publish_ahead": lambda f: {
        "items": [Publication(f.partition, f.grant_token, f.rows, f.nbytes, f.tokens, 0, ("prompt_ids",))],
        "job_id": "j", "epoch": 1, "writer_id": "w", "ahead": [100],
    },
    "abandon": lambda f: {"partition": f.partition, "token": f.grant_token},
    "group": lambda f: {"partition": f.partition},
    "renew": lambda f: {"token": f.token, "ttl": 5.0},
    "prepare": lambda f: {"token": f.token, "batch_id": "b", "partitions": None},
    "start_training": lambda f: {"token": f.token, "batch_id": "b"},
    "finish_training": lambda f: {"token": f.token, "batch_id": "b"},
    "commit": lambda f: {"token": f.token, "batch_id": "b"},
    "release": lambda f: {"token": f.token, "partitions": None, "columns": ()},
    "resolve": lambda f: {"job_id": "j", "partitions": [f.partition], "action": "drop"},
    "counts": lambda f: {"job_id": "j"},
    "usage": lambda f: {"job_id": "j"},
    "lease_groups": lambda f: {"token": f.token},
    "gc_list": lambda f: {"job_id": "j"},
    "fence_list": lambda f: {},
    "servers": lambda f: {},
    "confirm_checkpoint": lambda f: {"job_id": "j", "seq": 1},
    "report_unusable": lambda f: {"token": f.token, "missing": [], "unreachable": []},
    "lost": lambda f: {"job_id": "j"},
}  # fmt: skip
# The arguments each operation cannot do without: those its declared command has no default for.
REQUIRED: dict[str, tuple[str, ...]] = {
    op: tuple(f.name for f in dataclasses.fields(COMMANDS[op]) if f.default is dataclasses.MISSING)
    for op in CALLS
}

# The kind of every argument, and bad values of each kind (none of them valid for any argument of it).
KINDS: dict[str, str] = {
    "server_id": "name", "node": "name", "location": "name", "job_id": "name", "writer_id": "name",
    "batch_id": "name", "capacity_bytes": "int", "capacity_groups": "int", "epoch": "int",
    "policy_version": "int", "version": "int", "token": "int", "rows": "int", "tokens": "int",
    "nbytes": "int", "config": "config", "old_ready": "choice", "action": "choice", "ttl": "seconds",
    "partition": "partition", "partitions": "partitions", "columns": "columns", "items": "items",
    "seq": "int", "missing": "partitions", "unreachable": "names", "ahead": "int",
}  # fmt: skip
LIST_NBYTES = ([], "100", [0], [1.5], [BIG], [True], [100, -1], {"a": 1})
BAD: dict[str, tuple[Any, ...]] = {
    "name": (5, 1.5, True, "", "n" * 1025, ["j"], b"j", {"a": 1}, "x" * (1 << 20)),
    "int": (1.0, True, "1", -1, BIG, 2**70, [1], {"v": 1}, b"1", -(2**70)),
    "seconds": (float("nan"), float("inf"), -1.0, 0, "5s", True, 10**10, [5.0]),
    "config": (5, "x", {"unknown": 1}, {"capacity_bytes": BIG}, {"grant_ttl": float("nan")}, {"x" * 5000: 1}),
    "choice": ("maybe", 5, "", "x" * 5000, ["drop"]),
    "partition": (
        "j/1/0", ("j", 1.0, 0), ("j", 1, BIG), ("j", 1), 5, ("", 1, 0), ("j", -1, 0), ["j", 1, True],
    ),
    "partitions": ("j/1/0", 5, [("j", -1, 0)], [5], [("j", 1, 0.0)], {"a": 1}, [[["j"]]]),
    "columns": ("prompt_ids", 5, [1], [["a"]], [""], [None], ["c" * 2000]),
    "items": ([], "x", [5], [{"partition": ["j", 1, 0]}], 5),
    "names": ("s", 5, [5], [""], ["x" * 2000], {"a": 1}, [["s"]]),
}  # fmt: skip


def _bad_values(op: str, name: str) -> tuple[Any, ...]:
    if op == "allocate_many" and name == "nbytes":
        return LIST_NBYTES
    if op == "publish_ahead" and name == "ahead":  # [] is valid there: ask for no grant ahead
        return tuple(v for v in LIST_NBYTES if v != [])
    return BAD[KINDS[name]]


def _op_cases() -> list[tuple[str, str, Any]]:
    """(operation, what is wrong, how) for every operation in CALLS."""
    out: list[tuple[str, str, Any]] = []
    for op in sorted(CALLS):
        names = list(TEMPLATES[op](_PLACEHOLDER))
        for name in names:
            if op == "gc_list" and name == "job_id":
                continue  # a filter: gc_list(job_id=...) of an unknown name lists nothing (not an error)
            out.extend((op, name, value) for value in _bad_values(op, name))
        out.append((op, "+unknown", None))
        out.extend((op, f"-{name}", None) for name in REQUIRED[op])
    return out


_PLACEHOLDER = Facts(None, None, "", 1, Partition("j", 1, 0), 1, 1, 1, 1)  # type: ignore[arg-type]


def _op_body(facts: Facts, op: str, what: str, value: Any) -> bytes:
    kwargs = TEMPLATES[op](facts)
    if what == "+unknown":
        kwargs["zz_unknown"] = 1
    elif what.startswith("-"):
        del kwargs[what[1:]]
    else:
        kwargs[what] = value
    return _rpc.dumps({"method": op, "kwargs": kwargs, "timeout": DEADLINE})


# ---------------------------------------------------------------------------------------- actions

DEEP = b"[" * 100_000 + b"]" * 100_000
ACQ = {"job_id": "j", "owner": "t", "max_groups": 1}


def _action_cases(f: Facts) -> list[tuple[str, bytes]]:
    d = _rpc.dumps
    call = b'{"$m":{"method":"counts","kwargs":%s}}'
    return [
        # every action: bodies that are not messages
        *(
            (kind, body)
            for kind in ("call", "many", "acquire", "checkpoint", "restore", "info")
            for body in (
                b"\x00garbage",
                b"[1,2]",
                b'"text"',
                b"null",
                DEEP,
                b"{" * 70 + b"}" * 70,
                b'{"$m":{"timeout":NaN}}',
                b'{"$m":{"timeout":Infinity}}',
                b'{"$m":{"timeout":-1}}',
                b'{"$m":{"timeout":"soon"}}',
                b'{"$m":{"timeout":true}}',
                b'{"$m":{"timeout":1e999}}',
                b'{"$m":{},"x":1}',
                b'{"$q":1}',
                b'{"$m":[1]}',
                b" " * (MAX_REQUEST_BYTES + 1),
            )
        ),
        ("z" * 10_000, d({})),
        ("", d({})),
        # call
        ("call", d({"method": 5})),
        ("call", d({"method": "tick", "kwargs": {}})),
        ("call", d({"method": "take_deletes", "kwargs": {}})),
        ("call", d({"method": "delete_done", "kwargs": {}})),
        ("call", d({"method": "fence_done", "kwargs": {}})),
        ("call", d({"method": "recover", "kwargs": {"incarnation": 99}})),
        ("call", d({"method": "counts", "kwargs": [1]})),
        ("call", d({"method": "counts", "kwargs": "job_id=j"})),
        ("call", d({"method": "counts", "kwargs": {"job_id": "j", "now": 1.0}})),
        ("call", call % b'{"$m":{"job_id":{"$b":"!!"}}}'),
        ("call", call % b'{"$m":{"job_id":{"$b":5}}}'),
        ("call", call % b'{"$m":{"job_id":{"$e":"GroupState"}}}'),
        ("call", call % b'{"$m":{"job_id":{"$e":"GroupState","v":1}}}'),
        ("call", call % b'{"$m":{"job_id":{"$e":"Nope","v":"READY"}}}'),
        ("call", call % b'{"$m":{"job_id":{"$tuple":5}}}'),
        ("call", call % b'{"$m":{"job_id":{"$t":"Partition","v":5}}}'),
        ("call", call % b'{"$m":{"job_id":{"$t":"Partition","v":["j",1]}}}'),
        ("call", call % b'{"$m":{"job_id":{"$d":"Publication","v":{"bogus":1}}}}'),
        ("call", call % b'{"$m":{"job_id":{"$d":"Publication","v":[1]}}}'),
        ("call", call % b'{"$m":{"job_id":{"$d":"Lease","v":{}}}}'),
        ("call", call % b'{"$m":{"job_id":{"$m":{"a":1},"$b":""}}}'),
        ("call", call % b'{"$m":{"job_id":{"$m":{}}}}'),
        ("call", call % (b'{"$m":{"job_id":' + b"9" * 5000 + b"}}")),
        (
            "call",
            b'{"$m":{"method":"group","kwargs":{"$m":{"partition":{"$t":"Partition","v":["j",1.0,0]}}}}}',
        ),
        (
            "call",
            b'{"$m":{"method":"group","kwargs":{"$m":{"partition":{"$t":"Partition","v":["j",1,1e400]}}}}}',
        ),
        # many
        ("many", d({"calls": "counts"})),
        ("many", d({"calls": [["counts"]]})),
        ("many", d({"calls": [["counts", {"job_id": "j"}, 1]]})),
        ("many", d({"calls": [["counts", [1]]]})),
        ("many", d({"calls": [[5, {}]]})),
        ("many", d({"calls": [["tick", {}]]})),
        ("many", d({"calls": [["counts", {"job_id": "j"}], ["renew", {"token": "x"}]]})),
        ("many", d({"calls": [["start_training", {"token": f.token, "batch_id": ["b"]}]]})),
        # acquire
        *(("acquire", d({"kwargs": ACQ, "wait": w})) for w in (-1, "1", True, [1], {"s": 1})),
        ("acquire", b'{"$m":{"kwargs":{"$m":{"job_id":"j","owner":"t","max_groups":1}},"wait":NaN}}'),
        ("acquire", b'{"$m":{"kwargs":{"$m":{"job_id":"j","owner":"t","max_groups":1}},"wait":1e999}}'),
        ("acquire", d({"kwargs": [1]})),
        ("acquire", d({"kwargs": {**ACQ, "max_groups": 0}})),
        ("acquire", d({"kwargs": {**ACQ, "max_groups": BIG}})),
        ("acquire", d({"kwargs": {**ACQ, "max_groups": 1.0}})),
        ("acquire", d({"kwargs": {**ACQ, "owner": ""}})),
        ("acquire", d({"kwargs": {**ACQ, "job_id": 7}})),
        ("acquire", d({"kwargs": {**ACQ, "ttl": 0}})),
        ("acquire", d({"kwargs": {**ACQ, "ttl": 10**6}})),
        ("acquire", d({"kwargs": {**ACQ, "max_tokens": 0}})),
        ("acquire", d({"kwargs": {**ACQ, "max_staleness": -1}})),
        ("acquire", d({"kwargs": {**ACQ, "require": "reward"}})),
        ("acquire", d({"kwargs": {**ACQ, "lack": [["x"]]}})),
        ("acquire", d({"kwargs": {**ACQ, "zz": 1}})),
        ("acquire", d({"kwargs": {"owner": "t", "max_groups": 1}})),
        # checkpoint
        ("checkpoint", d({})),
        ("checkpoint", d({"job_id": 5})),
        ("checkpoint", d({"job_id": "x" * 5000})),
        ("checkpoint", d({"job_id": "j", "path": 5})),
        # restore
        ("restore", d({})),
        ("restore", d({"source": 5})),
        (
            "restore",
            d({"source": b"not a checkpoint", "kwargs": {"job_id": "k", "epoch": 2, "config": None}}),
        ),
        ("restore", d({"source": b"", "kwargs": {"job_id": "k", "epoch": 2, "config": None}})),
        ("restore", d({"source": b"x", "kwargs": {"data": b"y"}})),
        ("restore", d({"source": b"x", "kwargs": [1]})),
        # info
        ("info", d({"timeout": "x"})),
    ]


# ---------------------------------------------------------------------------------------- the tests

OP_CASES = _op_cases()


@pytest.mark.parametrize(
    ("op", "what", "value"), OP_CASES, ids=[f"{o}-{w}-{i}" for i, (o, w, _) in enumerate(OP_CASES)]
)
def test_every_operation_refuses_malformed_arguments(facts, op, what, value):
    _refused(facts, "call", _op_body(facts, op, what, value))


ACTION_CASES = len(_action_cases(_PLACEHOLDER))


@pytest.fixture(scope="module")
def action_cases(facts: Facts) -> list[tuple[str, bytes]]:
    return _action_cases(facts)


@pytest.mark.parametrize("index", range(ACTION_CASES))
def test_every_action_refuses_malformed_requests(facts, action_cases, index):
    kind, body = action_cases[index]
    _refused(facts, kind, body)


def test_the_tables_cover_every_operation_and_action_with_enough_cases():
    """Derived from the declared commands: a new operation, or a new argument of one, fails here until
    the tables give it valid values and a kind of bad ones."""
    assert set(TEMPLATES) == CALLS == {op for op, _, _ in OP_CASES}
    for op in CALLS:
        assert set(TEMPLATES[op](_PLACEHOLDER)) == set(COMMANDS[op].argument_names), op
        assert set(COMMANDS[op].argument_names) <= set(KINDS), op
    kinds = {kind for kind, _ in _action_cases(_PLACEHOLDER)}
    assert {"call", "many", "acquire", "checkpoint", "restore", "info"} <= kinds
    assert len(OP_CASES) + ACTION_CASES >= 300


# Strategies for bad values by kind: drawn, so that each run (derandomized: the same in CI) goes beyond
# the tables.
_not_int = st.one_of(
    st.integers(min_value=BIG),
    st.integers(max_value=-1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.binary(max_size=4),
)
_not_name = st.one_of(
    st.integers(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.just(""),
    st.text(min_size=1025, max_size=1300),
    st.lists(st.text(max_size=3), max_size=3),
    st.binary(max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_not_seconds = st.one_of(
    st.floats().filter(lambda x: not 0 < x <= 600),
    st.text(max_size=5),
    st.booleans(),
    st.lists(st.floats(allow_nan=False), max_size=2),
)
_not_partition = st.one_of(
    st.tuples(st.just("j"), _not_int, st.integers(0, 9)),
    st.tuples(st.just("j"), st.integers(0, 9), _not_int),
    st.tuples(_not_name, st.just(1), st.just(0)),
    st.lists(st.integers(0, 3), max_size=2),
    st.text(max_size=8),
    st.integers(),
)
_STRATEGIES = {
    "name": _not_name,
    "int": _not_int,
    "seconds": _not_seconds,
    "partition": _not_partition,
    "partitions": st.one_of(
        st.lists(_not_partition, min_size=1, max_size=3), st.text(max_size=4), st.integers()
    ),
    "columns": st.one_of(
        st.text(min_size=1, max_size=5), st.integers(), st.lists(_not_name, min_size=1, max_size=3)
    ),
    "config": st.one_of(
        st.dictionaries(
            st.text(min_size=1, max_size=6).filter(lambda k: k not in _CONFIG_FIELDS),
            st.integers(),
            min_size=1,
            max_size=2,
        ),
        st.fixed_dictionaries(
            {"max_group_bytes": st.one_of(st.integers(max_value=0), st.integers(min_value=BIG), st.floats())}
        ),
        st.integers(),
    ),
    "choice": st.one_of(
        st.text(max_size=6).filter(lambda t: t not in ("drop", "requeue", "reoffer")), st.integers()
    ),
    "items": st.one_of(st.just([]), st.lists(st.integers(), min_size=1, max_size=2), st.text(max_size=3)),
    "names": st.one_of(
        st.text(min_size=1, max_size=4), st.integers(), st.lists(_not_name, min_size=1, max_size=3)
    ),
}
_CONFIG_FIELDS = {
    "capacity_bytes", "capacity_groups", "max_group_bytes", "grant_ttl", "default_lease_ttl", "max_lease_ttl",
    "max_groups_per_lease", "strict_on_policy", "max_staleness", "delete_retry_initial", "delete_retry_max",
    "delete_timeout", "capacity_retry_after", "server_retry_initial", "server_retry_max",
}  # fmt: skip
_ARGUMENTS = sorted(
    (op, name)
    for op in CALLS
    for name in TEMPLATES[op](_PLACEHOLDER)
    if not (op == "gc_list" and name == "job_id")
    and not (op == "allocate_many" and name == "nbytes")
    and not (op == "publish_ahead" and name == "ahead")  # a list of sizes: cased in _bad_values
)
FUZZ_SETTINGS = settings(
    max_examples=HYPOTHESIS_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ_SETTINGS
@given(data=st.data())
def test_drawn_malformed_arguments_are_refused(facts, data):
    op, name = data.draw(st.sampled_from(_ARGUMENTS), label="argument")
    value = data.draw(_STRATEGIES[KINDS[name]], label="value")
    _refused(facts, "call", _op_body(facts, op, name, value))


_JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=6)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


@FUZZ_SETTINGS
@given(
    kind=st.sampled_from(["call", "many", "acquire", "checkpoint", "restore", "info"]),
    junk=_JSONISH,
    prefix=st.sampled_from([b"", b"{", b"[", b'{"$m":', b'{"$d":"Lease","v":']),
)
def test_drawn_junk_bodies_are_refused(facts, kind, junk, prefix):
    """Raw JSON the typed encoding never produces (untagged objects, bare values) or cut short."""
    body = prefix + json.dumps(junk).encode()
    try:
        decoded = _rpc.loads(body)
    except InvalidRequestError:
        decoded = None
    if kind == "info" and isinstance(decoded, dict):
        return  # a valid info request: it takes no arguments and ignores unknown ones
    _refused(facts, kind, body)


def test_a_legitimate_open_put_lease_commit_still_works_afterwards(facts):
    before = facts.observed()
    client = trajflight.connect(facts.location, timeout=20.0)
    try:
        client.open_job("after", 1)
        meta = client.writer("after", 1).put(**_GROUP)
        with client.trainer("after").lease(1, wait=5) as batch:
            assert batch.partitions == (meta.partition,)
            assert batch.fetch_table(["reward"]).num_rows == 1
        assert facts.cluster.wait_idle("after") == (0, 0)
    finally:
        client.close()
    assert facts.observed()[:7] == before[:7]  # job "j" untouched (tokens and jobs grew, as they must)
