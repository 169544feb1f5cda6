"""The storage server's wire: descriptors, tickets, list criteria and action bodies, encoded as JSON.

The records themselves live in :mod:`._wire_records`, their strict decoding in
:mod:`._wire_decode` (both re-exported here); this module encodes them.

Every message trajflight puts on the wire is a UTF-8 JSON object with an integer ``"v"`` field (the wire
version, :data:`WIRE_VERSION`). Decoding is strict: bytes that are not JSON, an unknown version, a missing
field or a field of the wrong type raise :class:`~trajflight.errors.InvalidRequestError` with a message
naming the field, never a crash and never a silent default. Sizes, nesting depth, integer ranges (int64)
and name lengths are bounded before any value is used (:mod:`._wire_bounds`), and messages echo at most
about a hundred characters of the input. ``docs/wire-format.md`` is the reference.

Path descriptors ``[job_id, epoch, group_id]`` (all strings) are accepted too, so a bare Flight client that
knows nothing of trajflight can ask for a group, and ``[job_id, epoch, group_id, num_rows]`` to write one
(every put announces its row count, see ``do_put``).

Who may send a message is not on this wire: a deployment with a secret authenticates every call by its
bearer token (``docs/auth.md``); lease generations fence zombies, they do not authenticate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow.flight as flight

from trajflight.flight_server._wire_decode import (
    decode_action_body,
    decode_criteria,
    decode_descriptor,
    decode_shm_put,
    decode_ticket,
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
    "decode_action_body",
    "decode_criteria",
    "decode_descriptor",
    "decode_shm_put",
    "decode_ticket",
    "encode",
    "encode_json",
    "group_descriptor",
]

# --------------------------------------------------------------------------------------------- encode


def encode_json(body: Mapping[str, Any]) -> bytes:
    """Encode a wire body as compact UTF-8 JSON, adding ``"v": WIRE_VERSION``."""
    return json.dumps({"v": WIRE_VERSION, **body}, separators=(",", ":")).encode()


def _key_dict(key: Partition) -> dict[str, Any]:
    return {"job_id": key.job_id, "epoch": key.epoch, "group_id": key.group_id}


def _read_dict(read: GroupRead) -> dict[str, Any]:
    out = _key_dict(read.key)
    if read.token is not None:
        out["generation"] = read.token.generation
    return out


def _reads_body(reads: Sequence[GroupRead]) -> dict[str, Any]:
    """``{"groups": [...]}``, or the compact ``{"batch": {...}}`` for many reads of one job and epoch
    under tokens (a lease of many groups): a fifth of the bytes and of the decoding time."""
    if len(reads) > 1:
        job_id, epoch = reads[0].key.job_id, reads[0].key.epoch
        generations = [r.token.generation if r.token is not None else -1 for r in reads]
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
    for name in ("nbytes", "num_rows"):
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
        return encode_json({"job_id": record.job_id, "min_epoch": record.min_epoch, "purge": record.purge})
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


def group_descriptor(key: Partition) -> flight.FlightDescriptor:
    """The path descriptor ``[job_id, epoch, group_id]`` under which ``list_flights`` shows a group."""
    return flight.FlightDescriptor.for_path(key.job_id, str(key.epoch), str(key.group_id))
