"""Hypothesis strategies for bad wire messages: valid templates of every message, each broken by one
mutation that alone makes it invalid (so no generated case is ever accepted by design, and any case the
server accepted would show as a changed baseline).

A template is a valid body naming the baseline's groups (``fuzz_kit.JOB``), with the leaves a mutation may
break: ``(path, kind, required, minimum)``. Mutations: the version; a leaf of the wrong kind; an integer
out of range (beyond int64, below its minimum); a required leaf removed; a name too long (or an empty job
id); a leaf nested past the depth bound; ``NaN``/``Infinity``; a body that is no object; bytes that are no
UTF-8 JSON (a strict prefix, an invalid byte); plus structural breaks where the message has them (both
``groups`` and ``batch``, an empty list, a group named twice, arrays of different lengths, an unknown
``kind``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fuzz_kit import EPOCH, FRESH, JOB
from hypothesis import strategies as st

Path = tuple[Any, ...]
Leaf = tuple[Path, str, bool, int]  # path, kind, required, minimum


@dataclass(frozen=True)
class Template:
    """A valid message and the leaves a mutation may break."""

    name: str
    target: str  # "ticket", "criteria", "descriptor", or an action name
    body: dict[str, Any]
    leaves: tuple[Leaf, ...]
    extra: tuple[str, ...] = ()  # structural mutations that apply: "both", "empty", "dup", "lengths", "kind"


def _key(prefix: Path = (), *, generation: bool = False, gen_required: bool = False) -> tuple[Leaf, ...]:
    leaves: list[Leaf] = [
        ((*prefix, "job_id"), "job", True, 0),
        ((*prefix, "epoch"), "int", True, 0),
        ((*prefix, "group_id"), "int", True, 0),
    ]
    if generation:
        leaves.append(((*prefix, "generation"), "int", gen_required, 0))
    return tuple(leaves)


def _k(group_id: int, **more: Any) -> dict[str, Any]:
    return {"job_id": JOB, "epoch": EPOCH, "group_id": group_id, **more}


_G = ("groups", 0)
_B = ("batch",)
TICKET = Template(
    "ticket",
    "ticket",
    {"v": 1, "groups": [_k(0, generation=5)], "columns": ["reward", "response_ids"]},
    (
        (("groups",), "list", True, 0),
        (_G, "obj", True, 0),
        *_key(_G, generation=True),
        (("columns",), "list", False, 0),
        (("columns", 1), "name-elem", True, 0),
    ),
    ("both", "empty"),
)
TICKET_BATCH = Template(
    "ticket-batch",
    "ticket",
    {"v": 1, "batch": {"job_id": JOB, "epoch": EPOCH, "group_ids": [0, 1], "generations": [5, 2]}},
    (
        (_B, "obj", True, 0),
        ((*_B, "job_id"), "job", True, 0),
        ((*_B, "epoch"), "int", True, 0),
        ((*_B, "group_ids"), "list", True, 0),
        ((*_B, "group_ids", 1), "int-elem", True, 0),
        ((*_B, "generations"), "list", True, 0),
        ((*_B, "generations", 0), "int-elem", True, 0),
    ),
    ("lengths", "empty"),
)
CRITERIA = Template(
    "criteria",
    "criteria",
    {"v": 1, "job_id": JOB, "epoch": EPOCH},
    ((("job_id",), "job", False, 0), (("epoch",), "int", False, 0)),
)
PUT = Template(
    "put",
    "descriptor",
    {"v": 1, "kind": "put", **_k(FRESH + 1), "writer": "w", "nbytes": 4096, "num_rows": 8},
    (
        *_key(),
        (("writer",), "name", False, 0),
        (("nbytes",), "int", False, 0),
        (("num_rows",), "int", True, 0),
    ),
    ("kind",),
)
PUT_MANY = Template(
    "put_many",
    "descriptor",
    {
        "v": 1,
        "kind": "put_many",
        "writer": "w",
        "groups": [_k(FRESH + 2, num_rows=8), _k(FRESH + 3, num_rows=8)],
    },
    (
        (("groups",), "list", True, 0),
        (_G, "obj", True, 0),
        *_key(_G),
        ((*_G, "num_rows"), "int", True, 0),
        (("groups", 1, "nbytes"), "int", False, 0),
        (("writer",), "name", False, 0),
    ),
    ("empty", "dup", "kind"),
)
APPEND = Template(
    "append",
    "descriptor",
    {"v": 1, "kind": "append", **_k(1), "generation": 2, "nbytes": 64},
    (*_key(generation=True, gen_required=True), (("nbytes",), "int", False, 0)),
    ("kind",),
)
GROUP = Template("group", "descriptor", {"v": 1, "kind": "group", **_k(0)}, _key(), ("kind",))
DELETE = Template(
    "delete",
    "delete",
    {"v": 1, "groups": [_k(0, generation=5)]},
    ((("groups",), "list", True, 0), (_G, "obj", True, 0), *_key(_G, generation=True)),
    ("both", "empty"),
)
DELETE_BATCH = Template("delete-batch", "delete", TICKET_BATCH.body, TICKET_BATCH.leaves, TICKET_BATCH.extra)
ADVANCE = Template(
    "advance_generation",
    "advance_generation",
    {"v": 1, "groups": [_k(0, generation=5)]},
    ((("groups",), "list", True, 0), (_G, "obj", True, 0), *_key(_G, generation=True, gen_required=True)),
    ("both", "empty"),
)
FENCE = Template(
    "fence",
    "fence",
    {"v": 1, "job_id": JOB, "min_epoch": EPOCH, "purge": False},
    (
        (("job_id",), "job", True, 0),
        (("min_epoch",), "int", True, 0),
        (("purge",), "bool", False, 0),
    ),
)
STATS = Template("stats", "stats", {"v": 1}, ())
HEALTH = Template("health", "health", {"v": 1}, ())
SHM_RESERVE = Template(
    "shm_reserve",
    "shm_reserve",
    {"v": 1, "writer": "w", "ttl": 5, "batch_bytes": 65536, "groups": [_k(FRESH + 4, num_rows=8)]},
    (
        (("groups",), "list", True, 0),
        (_G, "obj", True, 0),
        *_key(_G),
        ((*_G, "num_rows"), "int", True, 1),
        (("batch_bytes",), "int", True, 1),
        (("ttl",), "ttl", False, 0),
        (("writer",), "name", False, 0),
    ),
    ("empty", "dup"),
)
SHM_RESERVE_BATCH = Template(
    "shm_reserve-batch",
    "shm_reserve",
    {
        "v": 1,
        "batch_bytes": 65536,
        "batch": {"job_id": JOB, "epoch": EPOCH, "group_ids": [FRESH + 5, FRESH + 6], "rows": [4, 4]},
    },
    (
        (("batch_bytes",), "int", True, 1),
        (_B, "obj", True, 0),
        ((*_B, "job_id"), "job", True, 0),
        ((*_B, "epoch"), "int", True, 0),
        ((*_B, "group_ids"), "list", True, 0),
        ((*_B, "group_ids", 0), "int-elem", True, 0),
        ((*_B, "rows"), "list", True, 0),
        ((*_B, "rows", 1), "int-elem", True, 1),
    ),
    ("lengths", "dup", "empty"),
)
SHM_PUBLISH = Template(
    "shm_publish",
    "shm_publish",
    {"v": 1, "groups": [{"reservation": "r1", "size": 100}]},
    (
        (("groups",), "list", True, 0),
        (_G, "obj", True, 0),
        ((*_G, "reservation"), "name", True, 0),
        ((*_G, "size"), "int", True, 0),
    ),
    ("empty",),
)
SHM_PUBLISH_BATCH = Template(
    "shm_publish-batch",
    "shm_publish",
    {"v": 1, "batch": {"reservation": "r1", "size": 100}},
    ((_B, "obj", True, 0), ((*_B, "reservation"), "name", True, 0), ((*_B, "size"), "int", True, 0)),
)
SHM_ABORT = Template(
    "shm_abort",
    "shm_abort",
    {"v": 1, "reservations": ["r1", "r2"]},
    ((("reservations",), "list", True, 0), (("reservations", 0), "name-elem", True, 0)),
)
SHM_OPEN = Template("shm_open", "shm_open", TICKET.body, TICKET.leaves, TICKET.extra)
SHM_PUT = Template(
    "shm_put",
    "shm_put",
    {"v": 1, "writer": "w", "groups": [_k(FRESH + 7, nbytes=1, num_rows=8)]},
    (
        (("groups",), "list", True, 0),
        (_G, "obj", True, 0),
        *_key(_G),
        ((*_G, "nbytes"), "int", True, 1),
        ((*_G, "num_rows"), "int", False, 0),
    ),
    ("empty", "dup"),
)

ACTIONS = (
    DELETE,
    DELETE_BATCH,
    ADVANCE,
    FENCE,
    STATS,
    HEALTH,
    SHM_RESERVE,
    SHM_RESERVE_BATCH,
    SHM_PUBLISH,
    SHM_PUBLISH_BATCH,
    SHM_ABORT,
    SHM_OPEN,
)
TICKETS = (TICKET, TICKET_BATCH)
DESCRIPTORS = (PUT, PUT_MANY, APPEND, GROUP)
ALL = (*TICKETS, CRITERIA, *DESCRIPTORS, *ACTIONS, SHM_PUT)

# ------------------------------------------------------------------------------------------- values

_WRONG: dict[str, list[Any]] = {
    "int": ["1", 1.5, True, False, [], {}, 1e20, "0x10"],
    "job": [1, 1.5, True, [], {}, ["fuzz"]],
    "name": [1, 1.5, False, [], {}, ["a"]],
    "bool": ["yes", 1, 0, [], {}, "false"],
    "list": ["x", 1, {}, True, 1.5],
    "obj": ["x", 1, [], True, 2.5],
    "ttl": ["5", True, [], {}, "5s"],
    "int-elem": ["1", 1.5, True, None, [], {}],
    "name-elem": [1, None, True, [], {}, 2.5],
}
_RANGE = [-1, -(2**63), -(2**63) - 1, 2**63, 2**64, 2**70, 10**30]
_TTL_RANGE = [0, -1, 3601, 10**6, 1e300, -0.5]


def _get(body: Any, path: Path) -> Any:
    for p in path:
        body = body[p]
    return body


def _set(body: Any, path: Path, value: Any) -> None:
    _get(body, path[:-1])[path[-1]] = value


def _delete(body: Any, path: Path) -> None:
    del _get(body, path[:-1])[path[-1]]


def _dump(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def expected_fields(path: Path) -> set[str]:
    """The names a refusal of a broken leaf may give: the leaf's own or one of its containers'."""
    return {p for p in path if isinstance(p, str)}


Mutation = Callable[[Any, Template], tuple[str, bytes, set[str] | None]]
"""``(draw, template) -> (mutation name, bytes, fields the refusal may name or None for any)``."""


def _version(draw: Any, t: Template) -> tuple[str, bytes, set[str] | None]:
    body = copy.deepcopy(t.body)
    value = draw(st.sampled_from([1.0, True, "1", 2, 0, -1, [1], {"v": 1}, 2**70, None, "missing"]))
    if value == "missing":
        del body["v"]
    else:
        body["v"] = value
    return "version", _dump(body), {"v"}


def _leaf(draw: Any, t: Template) -> Leaf:
    return draw(st.sampled_from(t.leaves))


def _wrong_kind(draw: Any, t: Template) -> tuple[str, bytes, set[str] | None]:
    path, kind, required, _ = _leaf(draw, t)
    choices = list(_WRONG[kind]) + ([None] if required and not kind.endswith("-elem") else [])
    body = copy.deepcopy(t.body)
    _set(body, path, draw(st.sampled_from(choices)))
    return f"wrong-kind:{kind}", _dump(body), expected_fields(path)


def _out_of_range(draw: Any, t: Template) -> tuple[str, bytes, set[str] | None]:
    ints = [leaf for leaf in t.leaves if leaf[1] in ("int", "int-elem", "ttl")]
    path, kind, _, minimum = draw(st.sampled_from(ints))
    values = _TTL_RANGE if kind == "ttl" else _RANGE + ([0] if minimum == 1 else [])
    body = copy.deepcopy(t.body)
    _set(body, path, draw(st.sampled_from(values)))
    return f"range:{kind}", _dump(body), expected_fields(path)


def _removed(draw: Any, t: Template) -> tuple[str, bytes, set[str] | None]:
    required = [leaf for leaf in t.leaves if leaf[2] and not leaf[1].endswith("-elem") and leaf[1] != "obj"]
    path = draw(st.sampled_from(required))[0]
    body = copy.deepcopy(t.body)
    _delete(body, path)
    return "removed", _dump(body), expected_fields(path)


def _long_name(draw: Any, t: Template) -> tuple[str, bytes, set[str] | None]:
    names = [leaf for leaf in t.leaves if leaf[1] in ("job", "name", "name-elem")]
    path, kind, _, _ = draw(st.sampled_from(names))
    size = draw(st.integers(1025, 4096))
    char = draw(st.sampled_from(["x", "é", "\u2603", "\U0001f600", "'"]))
    values = [char * size] + ([""] if kind == "job" else [])
    body = copy.deepcopy(t.body)
    _set(body, path, draw(st.sampled_from(values)))
    return f"long:{kind}", _dump(body), expected_fields(path)


def _deep(draw: Any, t: Template) -> tuple[str, bytes, set[str] | None]:
    depth = draw(st.integers(33, 400))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    body = copy.deepcopy(t.body)
    path = draw(st.sampled_from([leaf[0] for leaf in t.leaves])) if t.leaves else ("deep",)
    _set(body, path, "__DEEP__")
    data = _dump(body).replace(b'"__DEEP__"', (opener * depth + "0" + closer * depth).encode())
    return "deep", data, {"depth"}


def _constant(draw: Any, t: Template) -> tuple[str, bytes, set[str] | None]:
    ints = [leaf for leaf in t.leaves if leaf[1] in ("int", "int-elem", "ttl")]
    body = copy.deepcopy(t.body)
    if ints:
        _set(body, draw(st.sampled_from(ints))[0], "__C__")
    else:
        body["v"] = "__C__"
    constant = draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity"]))
    return "constant", _dump(body).replace(b'"__C__"', constant), None


def _not_object(draw: Any, t: Template) -> tuple[str, bytes, set[str] | None]:
    value = draw(st.sampled_from([[t.body], "v1", 1, None, True, [], 1.0]))
    return "not-object", _dump(value), None


def _bad_bytes(draw: Any, t: Template) -> tuple[str, bytes, set[str] | None]:
    data = _dump(t.body)
    how = draw(st.sampled_from(["prefix", "invalid-utf8", "nul", "bom", "garbage"]))
    if how == "prefix":
        data = data[: draw(st.integers(1, len(data) - 1))]  # a strict prefix of an object is not JSON
    elif how == "invalid-utf8":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\x80"])) + data[at:]
    elif how == "nul":
        data = data[:1] + b"\x00" + data[1:]
    elif how == "bom":
        data = b"\xef\xbb\xbf" + data
    else:
        data = draw(st.binary(min_size=1, max_size=64).filter(lambda b: not _is_v1_object(b)))
    return f"bytes:{how}", data, None


def _is_v1_object(data: bytes) -> bool:
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(body, dict) and type(body.get("v")) is int and body.get("v") == 1


def _structural(draw: Any, t: Template) -> tuple[str, bytes, set[str] | None]:
    how = draw(st.sampled_from(t.extra))
    body = copy.deepcopy(t.body)
    if how == "both":
        body["batch"] = copy.deepcopy(TICKET_BATCH.body["batch"])
        return how, _dump(body), {"batch"}
    if how == "empty":
        target = ("groups",) if "groups" in body else ("batch", "group_ids")
        _set(body, target, [])
        return how, _dump(body), {"groups", "batch", "group_ids"}
    if how == "dup":
        if "groups" in body:
            body["groups"] = [body["groups"][0], copy.deepcopy(body["groups"][0])]
        else:
            body["batch"]["group_ids"] = [body["batch"]["group_ids"][0]] * 2
        return how, _dump(body), {"groups", "group_ids"}
    if how == "lengths":
        arrays = [k for k in ("generations", "rows") if k in body["batch"]]
        body["batch"][arrays[0]] = body["batch"][arrays[0]] + [1]
        return how, _dump(body), {"batch"}
    body["kind"] = draw(st.sampled_from(["upsert", "", "PUT", 1, None, ["put"], "group "]))
    return how, _dump(body), {"kind"}


def mutations(t: Template) -> list[Mutation]:
    """The mutations that apply to ``t``."""
    out: list[Mutation] = [_version, _deep, _constant, _not_object, _bad_bytes]
    if t.leaves:
        out += [_wrong_kind, _out_of_range, _removed, _long_name]
        if not any(leaf[1] in ("int", "int-elem", "ttl") for leaf in t.leaves):
            out.remove(_out_of_range)
        if not any(
            leaf[2] and leaf[1] not in ("obj",) and not leaf[1].endswith("-elem") for leaf in t.leaves
        ):
            out.remove(_removed)
        if not any(leaf[1] in ("job", "name", "name-elem") for leaf in t.leaves):
            out.remove(_long_name)
    if t.extra:
        out.append(_structural)
    return out


class Case:
    """``(template, mutation, bytes, fields)`` (unpack it), with a short repr: cases reach 10 MB."""

    __slots__ = ("parts",)

    def __init__(self, *parts: Any) -> None:
        self.parts = parts

    def __iter__(self) -> Any:
        return iter(self.parts)

    def __repr__(self) -> str:
        t, mutation, data, _ = self.parts
        return f"Case({t.name}, {mutation}, {len(data)} bytes: {bytes(data[:80])!r})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # what hypothesis prints
        printer.text(repr(self))


@st.composite
def bad_messages(draw: Any, templates: tuple[Template, ...]) -> Case:
    """A template broken by one of its mutations: ``(template, mutation, bytes, fields)``."""
    t = draw(st.sampled_from(templates))
    mutation = draw(st.sampled_from(mutations(t)))
    name, data, fields = mutation(draw, t)
    return Case(t, name, data, fields)


# Path elements are protobuf strings: bytes that are not UTF-8 never reach a handler (gRPC refuses the
# request while parsing it, an untyped INTERNAL), so they are left out here.
_NUMBER_PARTS = [b"", b"-1", b"+1", b"01", b" 1", b"1 ", b"1_0", "\u0665".encode(), b"9223372036854775808",
                 b"1e3", b"0x1", b"1.0", "\u00bd".encode(), b"99999999999999999999999", b"\x00"]  # fmt: skip


@st.composite
def bad_paths(draw: Any, *, put: bool) -> list[bytes]:
    """Path descriptor parts that name no group (``put``: no group to put either)."""
    parts = [JOB.encode(), str(EPOCH).encode(), (str(FRESH + 8) if put else "0").encode()]
    if put:
        parts.append(b"8")
    how = draw(st.sampled_from(["number", "job", "count"] + (["no-rows"] if put else [])))
    if how == "number":
        parts[draw(st.integers(1, len(parts) - 1))] = draw(st.sampled_from(_NUMBER_PARTS))
    elif how == "job":
        parts[0] = draw(st.sampled_from([b"", b"x" * 1025, "\u00e9".encode() * 1025]))
    elif how == "no-rows":
        parts = parts[:3]  # a put must name its row count
    else:
        n = draw(st.sampled_from([0, 1, 2, 5, 6] if put else [0, 1, 2, 4, 5]))
        parts = (parts * 2)[:n] if n <= 6 else parts
        if put and n == 4:
            parts = parts[:3]
    return parts
