"""Strict decoding of the storage server's wire: descriptors, tickets, list criteria and action bodies.

What the server receives passes here before any value is used: bytes that are not JSON, an unknown
version, a missing field or a field of the wrong type raise :class:`~trajflight.errors.InvalidRequestError`
with a message naming the field, never a crash and never a silent default; sizes, nesting depth, integer
ranges (int64) and name lengths are bounded first (:mod:`._wire_bounds`). Path descriptors
``[job_id, epoch, group_id]`` name a group for a bare Flight client, ``[..., num_rows]`` puts one. The
encoders are :mod:`._wire`'s (which re-exports these); ``docs/wire-format.md`` is the reference.

This module does no I/O and checks no credential (the server does).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

import pyarrow.flight as flight

from trajflight.errors import InvalidRequestError
from trajflight.flight_server._wire_bounds import (
    ECHO_CHARS,
    INT64_MAX,
    MAX_NAME_CHARS,
    echo,
    field,
    int_field,
    int_list,
    load_message,
    name_field,
    req_int,
    req_name,
    ttl_field,
)
from trajflight.flight_server._wire_records import (
    WIRE_VERSION,
    AppendDescriptor,
    DeleteRequest,
    FenceRequest,
    GenerationRequest,
    GetTicket,
    GroupRead,
    LeaseToken,
    ListCriteria,
    PutDescriptor,
    PutManyDescriptor,
    ShmAbortRequest,
    ShmBatchPublishRequest,
    ShmBatchReserveRequest,
    ShmPublishRequest,
    ShmReserveRequest,
)
from trajflight.keys import Partition

__all__ = [
    "decode_action_body",
    "decode_criteria",
    "decode_descriptor",
    "decode_shm_put",
    "decode_ticket",
]

_ACTION_NAMES = frozenset(
    {
        "delete",
        "fence",
        "advance_generation",
        "stats",
        "health",
        "shm_reserve",
        "shm_publish",
        "shm_abort",
        "shm_open",
    }
)


def _load(data: bytes | bytearray, what: str) -> dict[str, Any]:
    body: dict[str, Any] = load_message(data, what, WIRE_VERSION)
    return body


def _key(body: Mapping[str, Any], what: str) -> Partition:
    return Partition(
        req_name(body, "job_id", what), req_int(body, "epoch", what), req_int(body, "group_id", what)
    )


def _token(body: Mapping[str, Any], what: str) -> LeaseToken | None:
    generation = int_field(body, "generation", what, required=False)
    return None if generation is None else LeaseToken(generation)


def _batch_head(batch: object, what: str) -> tuple[dict[str, Any], str, int, list[int]]:
    """What every compact ``"batch"`` form holds: the object itself, its job_id, epoch and group_ids."""
    if not isinstance(batch, dict):
        raise InvalidRequestError(f"{what}: 'batch' must be an object", field="batch")
    job_id = req_name(batch, "job_id", what, empty=True)
    epoch = req_int(batch, "epoch", what)
    group_ids = int_list(field(batch, "group_ids", list, what), "group_ids", what)
    if not job_id or not group_ids:
        raise InvalidRequestError(
            f"{what}: 'batch' needs a job_id and at least one of its group_ids", field="batch"
        )
    return batch, job_id, epoch, group_ids


def _batch_reads(batch: object, what: str) -> tuple[GroupRead, ...]:
    """The compact form ``{"job_id", "epoch", "group_ids": [int], "generations": [int]}`` (see
    ``_reads_body``): every read of one job and epoch, each under its generation."""
    batch, job_id, epoch, group_ids = _batch_head(batch, what)
    generations = int_list(field(batch, "generations", list, what), "generations", what)
    if len(group_ids) != len(generations):
        raise InvalidRequestError(
            f"{what}: 'batch' needs as many group_ids as generations (at least one)", field="batch"
        )
    return tuple(
        GroupRead(Partition(job_id, epoch, g), LeaseToken(n))
        for g, n in zip(group_ids, generations, strict=True)
    )


def _fits(value: object) -> TypeGuard[int]:
    """An int (not a bool) in ``[0, INT64_MAX]``: the fast path's test of a key or generation."""
    return type(value) is int and 0 <= value <= INT64_MAX


def _reads(body: Mapping[str, Any], what: str) -> tuple[GroupRead, ...]:
    if "batch" in body:
        if "groups" in body:
            raise InvalidRequestError(f"{what}: give 'groups' or 'batch', not both", field="batch")
        return _batch_reads(body["batch"], what)
    out = []
    for i, entry in enumerate(_objects(body, "groups", what, noun="group")):
        # Fast path for well-formed entries (a lease of many groups on the same-host path); anything
        # else takes the checked path below, which names the offending field.
        job_id, epoch, group_id = entry.get("job_id"), entry.get("epoch"), entry.get("group_id")
        generation = entry.get("generation")
        if (
            type(job_id) is str
            and 0 < len(job_id) <= MAX_NAME_CHARS
            and _fits(epoch)
            and _fits(group_id)
            and (generation is None or _fits(generation))
        ):
            token = None if generation is None else LeaseToken(generation)
            out.append(GroupRead(Partition(job_id, epoch, group_id), token))
            continue
        out.append(GroupRead(_key(entry, f"{what} groups[{i}]"), _token(entry, f"{what} groups[{i}]")))
    return tuple(out)


_CANONICAL_INT = re.compile(rb"0|[1-9][0-9]{0,18}")  # str(n) of an int64 >= 0, nothing else


def _path_int(part: bytes, name: str, what: str) -> int:
    value = int(part) if _CANONICAL_INT.fullmatch(part) else -1
    if not 0 <= value <= INT64_MAX:
        raise InvalidRequestError(
            f"{what}: path element {name} must be a decimal integer in [0, 2**63-1], got {echo(part)}",
            field=name,
        )
    return value


def _path(path: Iterable[bytes], what: str) -> Partition | PutDescriptor:
    """``[job_id, epoch, group_id]`` (a group), or ``[job_id, epoch, group_id, num_rows]`` (a bare put)."""
    parts = list(path)
    if len(parts) not in (3, 4):
        raise InvalidRequestError(
            f"{what}: a path descriptor is [job_id, epoch, group_id] (or, to put a group, "
            f"[job_id, epoch, group_id, num_rows]), got {len(parts)} parts",
            field="path",
        )
    try:
        job_id = parts[0].decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequestError(
            f"{what}: path job_id is not UTF-8: {echo(parts[0])}", field="job_id"
        ) from None
    if not 0 < len(job_id) <= MAX_NAME_CHARS:
        raise InvalidRequestError(
            f"{what}: path job_id must have 1 to {MAX_NAME_CHARS} characters, got {len(job_id)}",
            field="job_id",
        )
    key = Partition(job_id, _path_int(parts[1], "epoch", what), _path_int(parts[2], "group_id", what))
    if len(parts) == 3:
        return key
    return PutDescriptor(key, writer="bare", num_rows=_path_int(parts[3], "num_rows", what))


def _decode_put(
    body: Mapping[str, Any], what: str, writer: str | None = None, *, rows: bool = False
) -> PutDescriptor:
    """A put's fields; ``num_rows`` is required in a stream of several groups (``writer`` given) and
    where ``rows`` says so (a Flight put: its stream's end alone does not prove it complete)."""
    return PutDescriptor(
        _key(body, what),
        writer=writer
        if writer is not None
        else name_field(body, "writer", what, required=False, empty=True) or "",
        nbytes=int_field(body, "nbytes", what, required=False),
        num_rows=int_field(body, "num_rows", what, required=rows or writer is not None),
    )


def decode_descriptor(
    descriptor: flight.FlightDescriptor,
) -> PutDescriptor | PutManyDescriptor | AppendDescriptor | Partition:
    """Decode a Flight descriptor.

    Returns:
        A :class:`PutDescriptor`, :class:`PutManyDescriptor` or :class:`AppendDescriptor` for command
        descriptors of kind ``put`` / ``put_many`` / ``append``, and a :class:`PutDescriptor` (writer
        ``"bare"``) for a path ``[job_id, epoch, group_id, num_rows]``; a :class:`Partition` for kind
        ``group`` or a path ``[job_id, epoch, group_id]`` (a ``get_flight_info``).

    Raises:
        InvalidRequestError: the descriptor is not one of the above, or a number is out of range.
    """
    what = "descriptor"
    if descriptor.descriptor_type == flight.DescriptorType.PATH:
        return _path(descriptor.path or [], what)
    body = _load(descriptor.command or b"", what)
    kind = field(body, "kind", str, what)
    if kind == "put":
        return _decode_put(body, what, rows=True)
    if kind == "put_many":
        writer = name_field(body, "writer", what, required=False, empty=True) or ""
        puts = []
        for i, entry in enumerate(_objects(body, "groups", what, noun="group")):
            puts.append(_decode_put(entry, f"{what} groups[{i}]", writer))
        if len({p.key for p in puts}) != len(puts):
            raise InvalidRequestError(f"{what}: a group is named twice", field="groups")
        return PutManyDescriptor(tuple(puts), writer)
    if kind == "append":
        token = _token(body, what)
        if token is None:
            raise InvalidRequestError(
                f"{what}: an append needs the holder's lease 'generation'", field="generation"
            )
        return AppendDescriptor(_key(body, what), token, int_field(body, "nbytes", what, required=False))
    if kind == "group":
        return _key(body, what)
    raise InvalidRequestError(
        f"{what}: unknown kind {echo(kind)}; expected 'put', 'put_many', 'append' or 'group'", field="kind"
    )


def decode_ticket(data: bytes) -> GetTicket:
    """Decode a ``do_get`` ticket; raises :class:`InvalidRequestError` when malformed."""
    return _ticket_from(_load(data, "ticket"), "ticket")


def _names(values: list[Any], name: str, what: str) -> list[str]:
    """``values`` if every item is a string of at most :data:`MAX_NAME_CHARS` characters (Arrow allows
    an empty column name)."""
    for v in values:
        if type(v) is not str or len(v) > MAX_NAME_CHARS:
            raise InvalidRequestError(
                f"{what}: {name!r} must be a list of names (strings of at most {MAX_NAME_CHARS} characters), "
                f"got {echo(v)}",
                field=name,
            )
    return values


def _ticket_from(body: Mapping[str, Any], what: str) -> GetTicket:
    columns = field(body, "columns", list, what, required=False)
    if columns is not None:
        _names(columns, "columns", what)
        if len(set(columns)) != len(columns):
            raise InvalidRequestError(f"{what}: 'columns' names a column twice", field="columns")
        columns = tuple(columns)
    return GetTicket(_reads(body, what), columns)


def decode_criteria(data: bytes) -> ListCriteria:
    """Decode ``list_flights`` criteria; empty bytes match everything."""
    if not data:
        return ListCriteria()
    body = _load(data, "criteria")
    return ListCriteria(
        name_field(body, "job_id", "criteria", required=False),
        int_field(body, "epoch", "criteria", required=False),
    )


def _objects(body: Mapping[str, Any], name: str, what: str, *, noun: str = "entry") -> list[dict[str, Any]]:
    """The non-empty list of objects ``body[name]``; a typed error names the field or entry otherwise."""
    entries: list[Any] = field(body, name, list, what)
    if not entries:
        raise InvalidRequestError(f"{what}: {name!r} must name at least one {noun}", field=name)
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InvalidRequestError(
                f"{what}: {name}[{i}] must be an object, got {type(entry).__name__}", field=name
            )
    return entries


def _decode_shm(
    action: str, body: Mapping[str, Any], what: str
) -> (
    ShmReserveRequest
    | ShmBatchReserveRequest
    | ShmPublishRequest
    | ShmBatchPublishRequest
    | ShmAbortRequest
    | GetTicket
):
    if action == "shm_reserve":
        writer = name_field(body, "writer", what, required=False, empty=True) or ""
        ttl = ttl_field(body, what)
        batch_bytes = int_field(body, "batch_bytes", what, minimum=1, required=False)
        if "batch" in body:
            return _batch_reserve(body, what, writer, ttl, batch_bytes)
        if batch_bytes is None:
            raise InvalidRequestError(
                f"{what}: 'batch_bytes' (> 0) is required: the size of the one stream the groups are "
                "written as, into one segment",
                field="batch_bytes",
            )
        puts = []
        for i, entry in enumerate(_objects(body, "groups", what)):
            put = _decode_put(entry, f"{what} groups[{i}]")
            if not put.num_rows:
                raise InvalidRequestError(
                    f"{what} groups[{i}]: 'num_rows' (> 0) is required with 'batch_bytes'", field="num_rows"
                )
            puts.append(PutDescriptor(put.key, writer, put.nbytes, put.num_rows))
        if len({p.key for p in puts}) != len(puts):
            raise InvalidRequestError(f"{what}: a group is named twice", field="groups")
        return ShmReserveRequest(tuple(puts), writer, ttl, batch_bytes)
    if action == "shm_publish":
        if "batch" in body:
            if "groups" in body:
                raise InvalidRequestError(f"{what}: give 'groups' or 'batch', not both", field="batch")
            batch = body["batch"]
            if not isinstance(batch, dict):
                raise InvalidRequestError(f"{what}: 'batch' must be an object", field="batch")
            return ShmBatchPublishRequest(
                req_name(batch, "reservation", f"{what} batch"), req_int(batch, "size", f"{what} batch")
            )
        items = []
        for i, entry in enumerate(_objects(body, "groups", what)):
            at = f"{what} groups[{i}]"
            items.append((req_name(entry, "reservation", at), req_int(entry, "size", at)))
        return ShmPublishRequest(tuple(items))
    if action == "shm_abort":
        ids = _names(field(body, "reservations", list, what), "reservations", what)
        return ShmAbortRequest(tuple(ids))
    return _ticket_from(body, what)


def _batch_reserve(
    body: Mapping[str, Any], what: str, writer: str, ttl: float | None, batch_bytes: int | None
) -> ShmBatchReserveRequest:
    """The compact form ``{"batch": {"job_id", "epoch", "group_ids": [int], "rows": [int]},
    "batch_bytes"}`` of a ``shm_reserve`` of one shared segment: every check the ``groups`` form makes of
    the groups it abbreviates (each named once, rows > 0, ``batch_bytes`` > 0)."""
    if "groups" in body:
        raise InvalidRequestError(f"{what}: give 'groups' or 'batch', not both", field="batch")
    batch, job_id, epoch, group_ids = _batch_head(body["batch"], what)
    rows = field(batch, "rows", list, what)
    if len(group_ids) != len(rows):
        raise InvalidRequestError(
            f"{what}: 'batch' needs as many group_ids as rows, at least one",
            field="batch",
        )
    int_list(rows, "rows", what, minimum=1)  # each group's num_rows, required with a batch
    if len(set(group_ids)) != len(group_ids):
        raise InvalidRequestError(f"{what}: a group is named twice", field="group_ids")
    if batch_bytes is None:
        raise InvalidRequestError(
            f"{what}: a 'batch' needs 'batch_bytes', the size of the stream the groups are written as",
            field="batch_bytes",
        )
    return ShmBatchReserveRequest(
        job_id,
        epoch,
        tuple(group_ids),
        tuple(rows),
        batch_bytes,
        writer,
        ttl,
    )


def decode_shm_put(data: bytes | bytearray) -> ShmReserveRequest:
    """Decode the body of ``shm_put`` (the same-host channel's one-call put of one small group): a
    ``shm_reserve`` body naming exactly one group, whose ``nbytes`` (> 0) is its payload's size, without
    ``batch_bytes``.

    Raises:
        InvalidRequestError: the body is malformed or names another number of groups.
    """
    what = "action 'shm_put'"
    body = _load(data, what)
    writer = name_field(body, "writer", what, required=False, empty=True) or ""
    ttl = ttl_field(body, what)
    entries = _objects(body, "groups", what)
    puts = [_decode_put(entry, f"{what} groups[{i}]") for i, entry in enumerate(entries)]
    for i, put in enumerate(puts):
        if not put.nbytes:
            raise InvalidRequestError(f"{what} groups[{i}]: 'nbytes' (> 0) is required", field="nbytes")
    if len({p.key for p in puts}) != len(puts):
        raise InvalidRequestError(f"{what}: a group is named twice", field="groups")
    if len(puts) != 1 or "batch_bytes" in body or "batch" in body:
        raise InvalidRequestError("shm_put carries exactly one group; reserve segments for more")
    (put,) = puts
    return ShmReserveRequest((PutDescriptor(put.key, writer, put.nbytes, put.num_rows),), writer, ttl)


def decode_action_body(
    action: str, data: bytes | bytearray
) -> (
    DeleteRequest
    | FenceRequest
    | GenerationRequest
    | ShmReserveRequest
    | ShmBatchReserveRequest
    | ShmPublishRequest
    | ShmBatchPublishRequest
    | ShmAbortRequest
    | GetTicket
    | None
):
    """Decode the body of action ``action``; actions without a body (stats, health) return None.

    Raises:
        InvalidRequestError: the action is unknown or the body is malformed.
    """
    if action not in _ACTION_NAMES:
        raise InvalidRequestError(
            f"unknown action {echo(action)}; list_actions names the supported ones",
            action=str(action)[:ECHO_CHARS],
        )
    what = f"action {action!r}"
    if action in ("stats", "health"):
        if data:
            _load(data, what)  # an empty body or {"v": 1}; garbage is still refused
        return None
    body = _load(data, what)
    if action.startswith("shm_"):
        return _decode_shm(action, body, what)
    if action == "delete":
        return DeleteRequest(_reads(body, what))
    if action == "advance_generation":
        reads = _reads(body, what)
        missing = [i for i, r in enumerate(reads) if r.token is None]
        if missing:
            raise InvalidRequestError(
                f"{what}: groups{echo(missing)} carry no 'generation'", field="generation"
            )
        return GenerationRequest(reads)
    job_id = req_name(body, "job_id", what)  # the fence
    min_epoch = req_int(body, "min_epoch", what)
    purge = field(body, "purge", bool, what, required=False) or False
    return FenceRequest(job_id, min_epoch, purge)
