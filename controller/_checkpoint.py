"""The byte format of checkpoints and snapshots: framing, version and checksum, and each part's state.

Two kinds share one framing:

* a **job checkpoint** (:func:`job_checkpoint`) is the quiescent cursor of one job (no group
  LEASED..TRAINED) plus its groups, policy version, GC list, lost groups and the newest token, under the
  job's next checkpoint sequence number (also in the header: :func:`checkpoint_seq`); a job restarts
  from it with a larger epoch (:func:`parse_job_checkpoint`, :func:`install_job_checkpoint`);
* a **ledger snapshot** (:func:`export_snapshot`, :func:`import_snapshot`) is the whole ledger, live
  leases included; hosts write it to recover after a crash (together with their journal).

Framing: ``MAGIC``, one JSON header line ``{"format", "kind", "length", "sha256"}`` (plus ``"seq"`` for a
job checkpoint), then ``length`` bytes of JSON; fields added since format 1 came out are optional.
:func:`decode` refuses a wrong magic, a truncated body, a checksum mismatch, another kind or another
format version, each with a :class:`~trajflight.errors.CheckpointError` that says what to do.

Bytes in, bytes out: the state is read and installed through the collaborators' own methods
(:class:`~._parts.Parts`), and files are :mod:`._files`' business. It does not protect against a
malicious file (the checksum catches accidents, not forgery).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, NamedTuple

from trajflight.errors import CheckpointError

from ._entries import READY, _Group, _Job, _Lease, _Writer
from ._groups import Groups
from ._parts import Parts
from ._records import LIVE_STATES, GroupState, JobConfig, Partition

__all__ = [
    "FORMAT_VERSION",
    "KIND_JOB",
    "KIND_SNAPSHOT",
    "MAGIC",
    "JobImport",
    "checkpoint_seq",
    "decode",
    "encode",
    "export_snapshot",
    "import_snapshot",
    "install_job_checkpoint",
    "job_checkpoint",
    "parse_job_checkpoint",
]

MAGIC = b"TRAJFLIGHT-LEDGER\n"
FORMAT_VERSION = 1
KIND_JOB = "job-checkpoint"
KIND_SNAPSHOT = "ledger-snapshot"


# ---------------------------------------------------------------------- framing
def encode(kind: str, payload: dict[str, Any], *, seq: int | None = None) -> bytes:
    """Frame ``payload`` (JSON-able) as a checkpoint of ``kind`` with format version and checksum
    (and ``seq``, a job checkpoint's sequence number, in the header)."""
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
    header: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "kind": kind,
        "length": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
    }
    if seq is not None:
        header["seq"] = seq
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + body


def checkpoint_seq(data: bytes) -> int:
    """The sequence number of a job checkpoint, read from its header alone (no checksum of the body).

    It is what ``confirm_checkpoint`` takes once the bytes are durable.

    Raises:
        CheckpointError: not a job checkpoint with a sequence number (another kind, or written by an
            older trajflight).
    """
    if not isinstance(data, bytes | bytearray | memoryview) or not bytes(data[: len(MAGIC)]) == MAGIC:
        raise CheckpointError("not a trajflight job checkpoint (bad magic bytes)")
    end = bytes(data[: len(MAGIC) + 4096]).find(b"\n", len(MAGIC))
    try:
        header = json.loads(bytes(data[len(MAGIC) : end])) if end > 0 else None
        seq = header["seq"] if isinstance(header, dict) and header.get("kind") == KIND_JOB else None
    except ValueError:
        seq = None
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise CheckpointError(
            "not a job checkpoint with a sequence number; pass the bytes that checkpoint returned"
        )
    return seq


def decode(data: bytes, kind: str, *, source: str = "checkpoint") -> dict[str, Any]:
    """Check the framing of ``data`` and return its payload.

    Args:
        data: The bytes of a checkpoint or snapshot.
        kind: The kind expected (``KIND_JOB`` or ``KIND_SNAPSHOT``).
        source: Where the bytes came from (a path), for error messages.

    Raises:
        CheckpointError: bad magic, truncated, corrupt (checksum or JSON), another kind, or another format
            version; nothing is returned in part.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CheckpointError(f"{source}: expected bytes, got {type(data).__name__}", path=source)
    data = bytes(data)
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):
            raise CheckpointError(
                f"{source} is truncated (ends inside its header); restore an older copy", path=source
            )
        raise CheckpointError(
            f"{source} is not a trajflight ledger checkpoint (bad magic bytes)", path=source
        )
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise CheckpointError(
            f"{source} is truncated (ends inside its header); restore an older copy", path=source
        )
    try:
        header = json.loads(data[len(MAGIC) : end])
        fmt, got_kind, length, digest = header["format"], header["kind"], header["length"], header["sha256"]
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"{source} has a corrupt header; restore an older copy", path=source) from None
    if fmt != FORMAT_VERSION:
        age = "older" if isinstance(fmt, int) and fmt < FORMAT_VERSION else "newer"
        raise CheckpointError(
            f"{source} has format version {fmt!r}, {age} than the version {FORMAT_VERSION} this trajflight "
            "reads; "
            + (
                "it cannot be restored by this version: drain the job with the trajflight that wrote it"
                if age == "older"
                else "upgrade trajflight to restore it"
            ),
            path=source,
            format=fmt,
        )
    if got_kind != kind:
        raise CheckpointError(f"{source} is a {got_kind!r}, not a {kind!r}", path=source)
    body = data[end + 1 :]
    if len(body) < length:
        raise CheckpointError(
            f"{source} is truncated ({len(body)} of {length} payload bytes); restore an older copy",
            path=source,
        )
    if len(body) > length:
        raise CheckpointError(
            f"{source} is corrupt ({len(body) - length} bytes of trailing data)", path=source
        )
    if hashlib.sha256(body).hexdigest() != digest:
        raise CheckpointError(f"{source} is corrupt (checksum mismatch); restore an older copy", path=source)
    try:
        payload = json.loads(body)
    except ValueError:
        raise CheckpointError(f"{source} is corrupt (payload is not JSON)", path=source) from None
    if not isinstance(payload, dict):
        raise CheckpointError(f"{source} is corrupt (payload is not an object)", path=source)
    return payload


# ---------------------------------------------------------------------- export / import
def _key(key: Partition) -> list[Any]:
    return [key.job_id, key.epoch, key.group_id]


def _export_group(g: _Group) -> list[Any]:
    return [
        _key(g.key), g.state.value, g.server_id, g.generation, g.grant_token, g.nbytes, g.rows, g.tokens,
        g.policy_version, list(g.columns), g.batch_id, g.lease, g.expires_at, g.ready_seq,
        None if g.trained is None else list(g.trained),
    ]  # fmt: skip


def _import_group(row: list[Any]) -> _Group:
    (key, state, server_id, generation, grant_token, nbytes, rows, tokens, pv, columns, batch_id, lease,
     expires_at, ready_seq) = row[:14]  # fmt: skip
    trained = row[14] if len(row) > 14 else None  # older checkpoints carry no commit facts
    g = _Group(Partition(*key), server_id, grant_token, nbytes, expires_at)
    g.state = GroupState(state)
    g.generation, g.rows, g.tokens, g.policy_version = generation, rows, tokens, pv
    g.colset = frozenset(columns)
    g.columns = tuple(sorted(g.colset))
    g.batch_id, g.lease, g.ready_seq = batch_id, lease, ready_seq
    if trained is not None:
        at, owner, version = trained
        g.trained = (float(at), str(owner), int(version))
    return g


def _export_job(groups: Groups, job: _Job) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "epoch": job.epoch,
        "config": job.config.to_mapping(),
        "next_group_id": job.next_group_id,
        "policy_version": job.policy_version,
        "writers": {w: [writer.node, writer.acked] for w, writer in job.writers.items()},
        "committed": job.committed,
        "deleted": job.deleted,
        "groups": [_export_group(groups.table[k]) for k in job.groups],
        "gc": [[_key(e.key), e.attempts, e.last_error] for e in job.gc],
        "checkpoints": job.checkpoints,
        "durable": job.durable,
        "kept": [[_key(k), seq] for k, seq in job.kept.items()],
        "lost": [[_key(k), reason] for k, reason in job.lost.items()],
        "purged": job.purged,
    }


def job_checkpoint(parts: Parts, job: _Job, seq: int, now: float) -> bytes:
    """The checkpoint ``seq`` of the quiescent ``job`` as bytes (see the module docstring); it covers
    every commit kept so far (a restore from it deletes them). Changes nothing."""
    payload = _export_job(parts.groups, job)
    payload["gc"] += [[_key(k), 0, None] for k in job.kept]
    payload["kept"] = []
    payload["checkpoints"] = payload["durable"] = seq
    payload["last_token"] = parts.tokens.last
    payload["servers"] = parts.servers.export({parts.groups.table[k].server_id for k in job.groups})
    payload["taken_at"] = now
    return encode(KIND_JOB, payload, seq=seq)


_Parsed = tuple[dict[str, Any], list[_Group], list[tuple[Partition, int, Any]]]


class JobImport(NamedTuple):
    """A job checkpoint's payload, parsed and checked, ready for :func:`install_job_checkpoint`."""

    parsed: _Parsed
    servers: list[tuple[str, str, str, int, int]]
    last_token: int

    @property
    def job_id(self) -> str:
        """The job the checkpoint is of."""
        job_id: str = self.parsed[0]["job_id"]
        return job_id

    @property
    def server_ids(self) -> set[str]:
        """The storage servers the checkpoint lists."""
        return {row[0] for row in self.servers}


def parse_job_checkpoint(payload: dict[str, Any], registered: set[str]) -> JobImport:
    """Parse and check the payload of a decoded job checkpoint (``registered``: the servers the ledger
    knows besides those the checkpoint lists); nothing is changed.

    Raises:
        CheckpointError: the payload is malformed (or not quiescent).
    """
    try:
        parsed = _parse_job(payload)
        servers = [(str(a), str(b), str(c), int(d), int(e)) for a, b, c, d, e in payload["servers"]]
        last_token = int(payload["last_token"])
        known = {row[0] for row in servers} | registered
        if any(g.server_id not in known for g in parsed[1]):
            raise ValueError("a group is placed on a server the checkpoint does not list")
        if any(g.state in LIVE_STATES for g in parsed[1]):
            raise ValueError("a group is LEASED..TRAINED in a job checkpoint")
    except (KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"checkpoint payload is malformed ({exc!r}); restore an older copy") from None
    return JobImport(parsed, servers, last_token)


def install_job_checkpoint(
    parts: Parts, imp: JobImport, epoch: int, config: JobConfig, now: float, *, min_token: int = 0
) -> tuple[_Job, list[_Group]]:
    """Install a parsed job checkpoint at ``epoch``; return the job and its groups (not yet indexed).

    The caller has checked job, configuration and epoch. The returned groups are in the ledger with
    their checkpointed states, capacity is counted for each of them, and tokens issued from now on are
    larger than every token the checkpoint saw, and than ``min_token``.
    """
    parts.servers.load(imp.servers)
    parts.tokens.raise_above(max(imp.last_token, min_token))
    return _install_job(parts, imp.parsed, epoch, config, now)


def _parse_job(payload: dict[str, Any]) -> _Parsed:
    fields = {
        "job_id": str(payload["job_id"]),
        "epoch": int(payload["epoch"]),
        "next_group_id": int(payload["next_group_id"]),
        "policy_version": int(payload["policy_version"]),
        "committed": int(payload["committed"]),
        "deleted": int(payload["deleted"]),
        "writers": {str(w): (str(node), int(acked)) for w, (node, acked) in payload["writers"].items()},
        "checkpoints": int(payload.get("checkpoints", 0)),
        "durable": int(payload.get("durable", 0)),
        "kept": {Partition(*key): int(seq) for key, seq in payload.get("kept", [])},
        "lost": {Partition(*key): str(reason) for key, reason in payload.get("lost", [])},
        "purged": int(payload.get("purged", 0)),
    }
    groups = [_import_group(row) for row in payload["groups"]]
    gc = [(Partition(*key), int(attempts), last_error) for key, attempts, last_error in payload["gc"]]
    return fields, groups, gc


def _install_job(
    parts: Parts, parsed: _Parsed, epoch: int, config: JobConfig, now: float
) -> tuple[_Job, list[_Group]]:
    fields, groups, gc = parsed
    job = parts.groups.new_job(fields["job_id"], epoch, config)
    job.next_group_id = 0 if epoch != fields["epoch"] else fields["next_group_id"]
    job.policy_version = fields["policy_version"]
    job.committed, job.deleted = fields["committed"], fields["deleted"]
    job.checkpoints, job.durable = fields["checkpoints"], fields["durable"]
    job.kept, job.lost, job.purged = fields["kept"], fields["lost"], fields["purged"]
    for w, (node, acked) in fields["writers"].items():
        job.writers[w] = _Writer(node, acked)
    parts.jobs.add(job)
    for g in groups:
        parts.groups.add(job, g)
    for key, attempts, last_error in gc:
        job.gc.restore(key, attempts, last_error, now)
    return job, groups


def export_snapshot(parts: Parts, now: float) -> bytes:
    """The whole ledger (live leases included) as bytes, for a host's crash recovery; ``now`` is the
    latest time the ledger has seen."""
    leases = [
        [lease.token, lease.job_id, lease.owner, lease.ttl, lease.expires_at, [_key(k) for k in lease.keys],
         [_key(k) for k in lease.live], {b: [_key(k) for k in ks] for b, ks in lease.batches.items()},
         {b: s.value for b, s in lease.stage.items()}]
        for lease in parts.leases
    ]  # fmt: skip
    payload = {
        "incarnation": parts.tokens.incarnation,
        "counter": parts.tokens.counter,
        "now": now if now != float("-inf") else None,
        "servers": parts.servers.export(),
        "jobs": [_export_job(parts.groups, job) for job in parts.jobs],
        "leases": leases,
        "reach": parts.upkeep.reach.export(),
        "fences": parts.upkeep.fences.export(),
    }
    return encode(KIND_SNAPSHOT, payload)


def import_snapshot(parts: Parts, data: bytes, *, source: str = "snapshot") -> float:
    """Load a snapshot into empty collaborators (every lease live again, every expiry where it was);
    returns the latest time the snapshotted ledger had seen.

    Raises:
        CheckpointError: the snapshot is corrupt, truncated or of another format.
    """
    payload = decode(data, KIND_SNAPSHOT, source=source)
    try:
        parts.tokens.incarnation, parts.tokens.counter = payload["incarnation"], payload["counter"]
        now = float("-inf") if payload["now"] is None else payload["now"]
        parts.servers.load(payload["servers"])
        reach = parts.upkeep.reach
        reach.load(payload.get("reach", []))
        parked = reach.parked_keys()  # READY, out of the index: keep their sequence numbers
        for jp in payload["jobs"]:
            cfg = JobConfig(**jp["config"])
            job, groups = _install_job(parts, _parse_job(jp), jp["epoch"], cfg, now)
            ready = (g for g in groups if g.state is READY and g.key not in parked)
            for g in sorted(ready, key=lambda g: g.ready_seq):
                parts.groups.index_ready(job, g)
            parts.grants.load(groups)
        for token, job_id, owner, ttl, expires_at, keys, live, batches, stage in payload["leases"]:
            lease = _Lease(token, job_id, owner, ttl, expires_at)
            lease.keys = [Partition(*k) for k in keys]
            lease.live = {Partition(*k): None for k in live}
            lease.batches = {b: tuple(Partition(*k) for k in ks) for b, ks in batches.items()}
            lease.stage = {b: GroupState(s) for b, s in stage.items()}
            parts.leases.install(lease)
        parts.leases.loaded()
        parts.upkeep.fences.load(payload.get("fences", []), now)  # snapshots before fences had none
    except (KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{source}: payload is malformed ({exc!r})", path=source) from None
    return float(now)
