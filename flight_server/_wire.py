"""Wire records of the storage server: descriptors, tickets, list criteria and action bodies.

The records themselves and :class:`TokenSigner` live in :mod:`._wire_records` (re-exported here); this
module encodes and decodes them.

Every message trajflight puts on the wire is a UTF-8 JSON object with an integer ``"v"`` field (the wire
version, :data:`WIRE_VERSION`). Decoding is strict: bytes that are not JSON, an unknown version, a missing
field or a field of the wrong type raise :class:`~trajflight.errors.InvalidRequestError` with a message
naming the field, never a crash and never a silent default. ``docs/wire-format.md`` is the reference.

Path descriptors ``[job_id, epoch, group_id]`` (all strings) are accepted too, so a bare Flight client that
knows nothing of trajflight can ask for a group or write one (the latter only where no deployment secret
is configured).

Optional signatures: where a deployment secret is shared by the controller and the servers, put
credentials, lease tokens and fences carry an HMAC-SHA256 (:class:`TokenSigner`). This module does not
guarantee confidentiality: signatures stop zombies and strangers from writing, deleting or fencing; they
do not encrypt (use TLS for that) and tokenless reads stay open to analysts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow.flight as flight

from trajflight.codec import GroupKey
from trajflight.errors import InvalidRequestError
from trajflight.flight_server._wire_records import (
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
    TokenSigner,
)

__all__ = [
    "WIRE_VERSION",
    "AppendDescriptor",
    "DeleteRequest",
    "FenceRequest",
    "GenerationRequest",
    "GetTicket",
    "GroupRead",
    "LeaseToken",
    "ListCriteria",
    "PutDescriptor",
    "PutManyDescriptor",
    "ShmAbortRequest",
    "ShmBatchPublishRequest",
    "ShmBatchReserveRequest",
    "ShmPublishRequest",
    "ShmReserveRequest",
    "TokenSigner",
    "decode_action_body",
    "decode_criteria",
    "decode_descriptor",
    "decode_ticket",
    "encode",
    "encode_json",
    "group_descriptor",
]

WIRE_VERSION = 1
"""The only wire version this build speaks; a message with another ``"v"`` is refused."""

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
_MAX_MESSAGE_BYTES = 16 * 2**20  # a ticket naming ~100k groups; anything larger is not a real request


# --------------------------------------------------------------------------------------------- encode


def encode_json(body: Mapping[str, Any]) -> bytes:
    """Encode a wire body as compact UTF-8 JSON, adding ``"v": WIRE_VERSION``."""
    return json.dumps({"v": WIRE_VERSION, **body}, separators=(",", ":")).encode()


def _key_dict(key: GroupKey) -> dict[str, Any]:
    return {"job_id": key.job_id, "epoch": key.epoch, "group_id": key.group_id}


def _read_dict(read: GroupRead) -> dict[str, Any]:
    out = _key_dict(read.key)
    if read.token is not None:
        out["generation"] = read.token.generation
        if read.token.sig is not None:
            out["sig"] = read.token.sig
    return out


def _reads_body(reads: Sequence[GroupRead]) -> dict[str, Any]:
    """``{"groups": [...]}``, or the compact ``{"batch": {...}}`` for many reads of one job and epoch
    under unsigned tokens (a lease of many groups): a fifth of the bytes and of the decoding time."""
    if len(reads) > 1:
        job_id, epoch = reads[0].key.job_id, reads[0].key.epoch
        generations = [
            r.token.generation if r.token is not None and r.token.sig is None else -1 for r in reads
        ]
        if min(generations) >= 0 and all(r.key.job_id == job_id and r.key.epoch == epoch for r in reads):
            group_ids = [r.key.group_id for r in reads]
            return {
                "batch": {
                    "job_id": job_id,
                    "epoch": epoch,
                    "group_ids": group_ids,
                    "generations": generations,
                }
            }
    return {"groups": [_read_dict(r) for r in reads]}


def _put_body(put: PutDescriptor) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "put", **_key_dict(put.key), "writer": put.writer}
    for name in ("nbytes", "num_rows", "sig"):
        if getattr(put, name) is not None:
            body[name] = getattr(put, name)
    return body


def _put_many_body(many: PutManyDescriptor) -> dict[str, Any]:
    groups = []
    for put in many.puts:
        body = _put_body(put)
        del body["kind"], body["writer"]
        groups.append(body)
    return {"kind": "put_many", "writer": many.writer, "groups": groups}


def _append_body(app: AppendDescriptor) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "append", **_read_dict(GroupRead(app.key, app.token))}
    if app.nbytes is not None:
        body["nbytes"] = app.nbytes
    return body


def _encode(record: object) -> bytes:
    if isinstance(record, PutDescriptor):
        return encode_json(_put_body(record))
    if isinstance(record, PutManyDescriptor):
        return encode_json(_put_many_body(record))
    if isinstance(record, AppendDescriptor):
        return encode_json(_append_body(record))
    if isinstance(record, GetTicket):
        body: dict[str, Any] = _reads_body(record.groups)
        if record.columns is not None:
            body["columns"] = list(record.columns)
        return encode_json(body)
    if isinstance(record, ListCriteria):
        return encode_json(
            {k: v for k, v in (("job_id", record.job_id), ("epoch", record.epoch)) if v is not None}
        )
    if isinstance(record, DeleteRequest | GenerationRequest):
        return encode_json(_reads_body(record.groups))
    if isinstance(record, FenceRequest):
        fence = {"job_id": record.job_id, "min_epoch": record.min_epoch, "purge": record.purge}
        return encode_json(fence if record.sig is None else {**fence, "sig": record.sig})
    if isinstance(record, ShmReserveRequest):
        groups = []
        for put in record.puts:
            body = _put_body(put)
            del body["kind"], body["writer"]
            groups.append(body)
        reserve: dict[str, Any] = {"writer": record.writer, "groups": groups}
        if record.ttl is not None:
            reserve["ttl"] = record.ttl
        if record.batch_bytes is not None:
            reserve["batch_bytes"] = record.batch_bytes
        return encode_json(reserve)
    if isinstance(record, ShmBatchReserveRequest):
        batch: dict[str, Any] = {
            "job_id": record.job_id,
            "epoch": record.epoch,
            "group_ids": list(record.group_ids),
            "rows": list(record.rows),
        }
        if record.sigs is not None:
            batch["sigs"] = list(record.sigs)
        compact: dict[str, Any] = {"writer": record.writer, "batch_bytes": record.batch_bytes, "batch": batch}
        if record.ttl is not None:
            compact["ttl"] = record.ttl
        return encode_json(compact)
    if isinstance(record, ShmPublishRequest):
        return encode_json({"groups": [{"reservation": r, "size": n} for r, n in record.items]})
    if isinstance(record, ShmBatchPublishRequest):
        return encode_json({"batch": {"reservation": record.reservation, "size": record.size}})
    if isinstance(record, ShmAbortRequest):
        return encode_json({"reservations": list(record.reservations)})
    raise TypeError(f"not a wire record: {type(record).__name__}")


def encode(record: object) -> bytes:
    """Encode any wire record of this module to its JSON bytes (see ``docs/wire-format.md``)."""
    return _encode(record)


def group_descriptor(key: GroupKey) -> flight.FlightDescriptor:
    """The path descriptor ``[job_id, epoch, group_id]`` under which ``list_flights`` shows a group."""
    return flight.FlightDescriptor.for_path(key.job_id, str(key.epoch), str(key.group_id))


# --------------------------------------------------------------------------------------------- decode


def _load(data: bytes | bytearray, what: str) -> dict[str, Any]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidRequestError(f"{what}: expected bytes, got {type(data).__name__}")
    if len(data) > _MAX_MESSAGE_BYTES:
        raise InvalidRequestError(
            f"{what}: {len(data)} bytes is larger than the {_MAX_MESSAGE_BYTES} allowed"
        )
    try:
        body = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        preview = bytes(data[:32])
        raise InvalidRequestError(
            f"{what}: not a trajflight message (expected UTF-8 JSON with a 'v' field, got {preview!r}...); "
            "build it with trajflight.flight_server or follow docs/wire-format.md"
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequestError(f"{what}: expected a JSON object, got {type(body).__name__}")
    version = body.get("v")
    if version != WIRE_VERSION or isinstance(version, bool):
        raise InvalidRequestError(
            f"{what}: unknown wire version {version!r}; this server speaks v{WIRE_VERSION}. "
            "Upgrade the older side so both speak the same version",
            version=version,
        )
    return body


def _field(
    body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str, *, required: bool = True
) -> Any:
    if name not in body or body[name] is None:
        if required:
            raise InvalidRequestError(f"{what}: missing field {name!r}", field=name)
        return None
    value = body[name]
    # bool is an int subclass in Python; true/false is never a valid number here.
    if isinstance(value, bool) and kind is not bool:
        raise InvalidRequestError(
            f"{what}: field {name!r} must be {_kind_name(kind)}, got a boolean", field=name
        )
    if not isinstance(value, kind):
        raise InvalidRequestError(
            f"{what}: field {name!r} must be {_kind_name(kind)}, got {type(value).__name__} {value!r}"[:300],
            field=name,
        )
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", str: "a string", bool: "a boolean", list: "a list"}
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)


def _nonneg(body: Mapping[str, Any], name: str, what: str, *, required: bool = True) -> int | None:
    value = _field(body, name, int, what, required=required)
    if value is not None and value < 0:
        raise InvalidRequestError(f"{what}: field {name!r} must be >= 0, got {value}", field=name)
    return None if value is None else int(value)


def _key(body: Mapping[str, Any], what: str) -> GroupKey:
    job_id = _field(body, "job_id", str, what)
    if not job_id:
        raise InvalidRequestError(f"{what}: job_id must not be empty", field="job_id")
    epoch = _nonneg(body, "epoch", what)
    group_id = _nonneg(body, "group_id", what)
    return GroupKey(job_id, int(epoch), int(group_id))  # type: ignore[arg-type]


def _token(body: Mapping[str, Any], what: str) -> LeaseToken | None:
    generation = _nonneg(body, "generation", what, required=False)
    sig = _field(body, "sig", str, what, required=False)
    if generation is None:
        if sig is not None:
            raise InvalidRequestError(f"{what}: 'sig' given without 'generation'", field="generation")
        return None
    return LeaseToken(generation, sig)


def _batch_head(batch: object, what: str) -> tuple[dict[str, Any], str, Any, list[Any]]:
    """What every compact ``"batch"`` form holds: the object itself, its job_id, epoch and group_ids."""
    if not isinstance(batch, dict):
        raise InvalidRequestError(f"{what}: 'batch' must be an object", field="batch")
    return (
        batch,
        _field(batch, "job_id", str, what),
        _nonneg(batch, "epoch", what),
        _field(batch, "group_ids", list, what),
    )


def _batch_reads(batch: object, what: str) -> tuple[GroupRead, ...]:
    """The compact form ``{"job_id", "epoch", "group_ids": [int], "generations": [int]}`` (see
    ``_reads_body``): every read of one job and epoch, each under an unsigned generation."""
    batch, job_id, epoch, group_ids = _batch_head(batch, what)
    generations = _field(batch, "generations", list, what)
    if not job_id or not group_ids or len(group_ids) != len(generations):
        raise InvalidRequestError(
            f"{what}: 'batch' needs a job_id and as many group_ids as generations (at least one)",
            field="batch",
        )
    for name, values in (("group_ids", group_ids), ("generations", generations)):
        if not all(type(v) is int and v >= 0 for v in values):  # type() refuses booleans, as _field does
            raise InvalidRequestError(f"{what}: batch {name!r} must be integers >= 0", field=name)
    return tuple(
        GroupRead(GroupKey(job_id, epoch, g), LeaseToken(n))
        for g, n in zip(group_ids, generations, strict=True)
    )


def _reads(body: Mapping[str, Any], what: str) -> tuple[GroupRead, ...]:
    if "batch" in body:
        if "groups" in body:
            raise InvalidRequestError(f"{what}: give 'groups' or 'batch', not both", field="batch")
        return _batch_reads(body["batch"], what)
    out = []
    for i, entry in enumerate(_objects(body, "groups", what, noun="group")):
        # Fast path for well-formed entries (a lease of many groups on the same-host path); anything
        # else takes the checked path below, which names the offending field. ``type(x) is int``
        # refuses booleans, as _field does.
        job_id, epoch, group_id = entry.get("job_id"), entry.get("epoch"), entry.get("group_id")
        generation, sig = entry.get("generation"), entry.get("sig")
        if (
            type(job_id) is str
            and job_id
            and type(epoch) is int
            and epoch >= 0
            and type(group_id) is int
            and group_id >= 0
            and (
                (generation is None and sig is None)
                or (type(generation) is int and generation >= 0 and (sig is None or type(sig) is str))
            )
        ):
            token = None if generation is None else LeaseToken(generation, sig)
            out.append(GroupRead(GroupKey(job_id, epoch, group_id), token))
            continue
        out.append(GroupRead(_key(entry, f"{what} groups[{i}]"), _token(entry, f"{what} groups[{i}]")))
    return tuple(out)


def _path_key(path: Iterable[bytes], what: str) -> GroupKey:
    parts = list(path)
    if len(parts) != 3:
        raise InvalidRequestError(
            f"{what}: a path descriptor is [job_id, epoch, group_id], got {len(parts)} parts", field="path"
        )
    try:
        job_id = parts[0].decode("utf-8")
        epoch, group_id = int(parts[1]), int(parts[2])
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequestError(
            f"{what}: path {parts!r} is not [job_id, epoch, group_id] with integer epoch and group_id"[:300]
        ) from None
    if not job_id or epoch < 0 or group_id < 0:
        raise InvalidRequestError(f"{what}: path {parts!r} needs a job_id and epoch, group_id >= 0"[:300])
    return GroupKey(job_id, epoch, group_id)


def _decode_put(body: Mapping[str, Any], what: str, writer: str | None = None) -> PutDescriptor:
    return PutDescriptor(
        _key(body, what),
        writer=writer if writer is not None else _field(body, "writer", str, what, required=False) or "",
        nbytes=_nonneg(body, "nbytes", what, required=False),
        num_rows=_nonneg(body, "num_rows", what, required=writer is not None),
        sig=_field(body, "sig", str, what, required=False),
    )


def decode_descriptor(
    descriptor: flight.FlightDescriptor,
) -> PutDescriptor | PutManyDescriptor | AppendDescriptor | GroupKey:
    """Decode a Flight descriptor.

    Returns:
        A :class:`PutDescriptor`, :class:`PutManyDescriptor` or :class:`AppendDescriptor` for command
        descriptors of kind ``put`` / ``put_many`` / ``append``; a :class:`GroupKey` for kind ``group``
        or a path descriptor ``[job_id, epoch, group_id]`` (a bare put, or a ``get_flight_info``).

    Raises:
        InvalidRequestError: the descriptor is not one of the above.
    """
    what = "descriptor"
    if descriptor.descriptor_type == flight.DescriptorType.PATH:
        return _path_key(descriptor.path or [], what)
    body = _load(descriptor.command or b"", what)
    kind = _field(body, "kind", str, what)
    if kind == "put":
        return _decode_put(body, what)
    if kind == "put_many":
        writer = _field(body, "writer", str, what, required=False) or ""
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
        return AppendDescriptor(_key(body, what), token, _nonneg(body, "nbytes", what, required=False))
    if kind == "group":
        return _key(body, what)
    raise InvalidRequestError(
        f"{what}: unknown kind {kind!r}; expected 'put', 'put_many', 'append' or 'group'", field="kind"
    )


def decode_ticket(data: bytes) -> GetTicket:
    """Decode a ``do_get`` ticket; raises :class:`InvalidRequestError` when malformed."""
    return _ticket_from(_load(data, "ticket"), "ticket")


def _ticket_from(body: Mapping[str, Any], what: str) -> GetTicket:
    columns = _field(body, "columns", list, what, required=False)
    if columns is not None:
        if not all(isinstance(c, str) for c in columns):
            raise InvalidRequestError(f"{what}: 'columns' must be a list of column names", field="columns")
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
        _field(body, "job_id", str, "criteria", required=False),
        _nonneg(body, "epoch", "criteria", required=False),
    )


def _objects(body: Mapping[str, Any], name: str, what: str, *, noun: str = "entry") -> list[dict[str, Any]]:
    """The non-empty list of objects ``body[name]``; a typed error names the field or entry otherwise."""
    entries: list[Any] = _field(body, name, list, what)
    if not entries:
        raise InvalidRequestError(f"{what}: {name!r} must name at least one {noun}", field=name)
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InvalidRequestError(f"{what}: {name}[{i}] must be an object, got {type(entry).__name__}")
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
        writer = _field(body, "writer", str, what, required=False) or ""
        ttl = _field(body, "ttl", (int, float), what, required=False)
        if ttl is not None and not 0 < ttl <= 3600:
            raise InvalidRequestError(f"{what}: 'ttl' must be in (0, 3600] seconds, got {ttl}", field="ttl")
        batch_bytes = _nonneg(body, "batch_bytes", what, required=False)
        if "batch" in body:
            return _batch_reserve(body, what, writer, None if ttl is None else float(ttl), batch_bytes)
        puts = []
        for i, entry in enumerate(_objects(body, "groups", what)):
            put = _decode_put(entry, f"{what} groups[{i}]")
            if batch_bytes is None and not put.nbytes:
                raise InvalidRequestError(f"{what} groups[{i}]: 'nbytes' (> 0) is required", field="nbytes")
            if batch_bytes is not None and not put.num_rows:
                raise InvalidRequestError(
                    f"{what} groups[{i}]: 'num_rows' (> 0) is required with 'batch_bytes'", field="num_rows"
                )
            puts.append(PutDescriptor(put.key, writer, put.nbytes, put.num_rows, put.sig))
        if len({p.key for p in puts}) != len(puts):
            raise InvalidRequestError(f"{what}: a group is named twice", field="groups")
        if batch_bytes is not None and batch_bytes <= 0:
            raise InvalidRequestError(f"{what}: 'batch_bytes' must be > 0", field="batch_bytes")
        return ShmReserveRequest(tuple(puts), writer, None if ttl is None else float(ttl), batch_bytes)
    if action == "shm_publish":
        if "batch" in body:
            if "groups" in body:
                raise InvalidRequestError(f"{what}: give 'groups' or 'batch', not both", field="batch")
            batch = body["batch"]
            if not isinstance(batch, dict):
                raise InvalidRequestError(f"{what}: 'batch' must be an object", field="batch")
            reservation = _field(batch, "reservation", str, f"{what} batch")
            return ShmBatchPublishRequest(reservation, int(_nonneg(batch, "size", f"{what} batch")))  # type: ignore[arg-type]
        items = []
        for i, entry in enumerate(_objects(body, "groups", what)):
            reservation = _field(entry, "reservation", str, f"{what} groups[{i}]")
            items.append((reservation, int(_nonneg(entry, "size", f"{what} groups[{i}]"))))  # type: ignore[arg-type]
        return ShmPublishRequest(tuple(items))
    if action == "shm_abort":
        ids = _field(body, "reservations", list, what)
        if not all(isinstance(i, str) for i in ids):
            raise InvalidRequestError(
                f"{what}: 'reservations' must be a list of strings", field="reservations"
            )
        return ShmAbortRequest(tuple(ids))
    return _ticket_from(body, what)


def _batch_reserve(
    body: Mapping[str, Any], what: str, writer: str, ttl: float | None, batch_bytes: int | None
) -> ShmBatchReserveRequest:
    """The compact form ``{"batch": {"job_id", "epoch", "group_ids": [int], "rows": [int], "sigs"?: [str]},
    "batch_bytes"}`` of a ``shm_reserve`` of one shared segment: every check the ``groups`` form makes of
    the groups it abbreviates (each named once, rows > 0, ``batch_bytes`` > 0)."""
    if "groups" in body:
        raise InvalidRequestError(f"{what}: give 'groups' or 'batch', not both", field="batch")
    batch, job_id, epoch, group_ids = _batch_head(body["batch"], what)
    rows = _field(batch, "rows", list, what)
    sigs = _field(batch, "sigs", list, what, required=False)
    if (
        not job_id
        or not group_ids
        or len(group_ids) != len(rows)
        or (sigs is not None and len(sigs) != len(group_ids))
    ):
        raise InvalidRequestError(
            f"{what}: 'batch' needs a job_id and as many group_ids as rows (and sigs, when given), at "
            "least one",
            field="batch",
        )
    if not all(type(v) is int and v >= 0 for v in group_ids):  # type() refuses booleans, as _field does
        raise InvalidRequestError(f"{what}: batch 'group_ids' must be integers >= 0", field="group_ids")
    if not all(type(v) is int and v > 0 for v in rows):
        raise InvalidRequestError(
            f"{what}: batch 'rows' must be integers > 0 (each group's num_rows, required with a batch)",
            field="rows",
        )
    if sigs is not None and not all(type(v) is str for v in sigs):
        raise InvalidRequestError(f"{what}: batch 'sigs' must be strings", field="sigs")
    if len(set(group_ids)) != len(group_ids):
        raise InvalidRequestError(f"{what}: a group is named twice", field="group_ids")
    if batch_bytes is None:
        raise InvalidRequestError(
            f"{what}: a 'batch' needs 'batch_bytes', the size of the stream the groups are written as",
            field="batch_bytes",
        )
    if batch_bytes <= 0:
        raise InvalidRequestError(f"{what}: 'batch_bytes' must be > 0", field="batch_bytes")
    return ShmBatchReserveRequest(
        job_id,
        int(epoch),
        tuple(group_ids),
        tuple(rows),
        batch_bytes,
        None if sigs is None else tuple(sigs),
        writer,
        ttl,
    )


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
        InvalidRequestError: the body is malformed.
    """
    what = f"action {action!r}"
    if action not in _ACTION_NAMES:
        raise InvalidRequestError(
            f"unknown action {action!r}; list_actions names the supported ones", action=str(action)[:100]
        )
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
            raise InvalidRequestError(f"{what}: groups{missing} carry no 'generation'", field="generation")
        return GenerationRequest(reads)
    if action == "fence":
        job_id = _field(body, "job_id", str, what)
        min_epoch = _nonneg(body, "min_epoch", what)
        purge = _field(body, "purge", bool, what, required=False) or False
        return FenceRequest(job_id, int(min_epoch), purge, _field(body, "sig", str, what, required=False))  # type: ignore[arg-type]
    raise InvalidRequestError(
        f"unknown action {action!r}; list_actions names the supported ones", action=action
    )
