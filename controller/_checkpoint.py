"""Checkpoints and snapshots of the ledger: the byte format, atomic files, and export/import of state.

Two kinds share one framing:

* a **job checkpoint** (:func:`export_job_checkpoint`) is the quiescent cursor of one job (no group
  LEASED..TRAINED) plus its groups, policy version, GC list, lost groups and the newest token, under the
  job's next checkpoint sequence number (also in the header: :func:`checkpoint_seq`); a job restarts
  from it with a larger epoch;
* a **ledger snapshot** (:func:`export_snapshot`) is the whole ledger, live leases included; hosts write
  it to recover after a crash (together with their journal).

Framing: ``MAGIC``, one JSON header line ``{"format", "kind", "length", "sha256"}`` (plus ``"seq"`` for a
job checkpoint), then ``length`` bytes of JSON; fields added since format 1 came out are optional.
:func:`decode` refuses a wrong magic, a truncated body, a checksum mismatch, another kind or another
format version, each with a :class:`~trajflight.errors.CheckpointError` that says what to do.
Files are written atomically (temp file in the same directory, fsync, rename, fsync of the directory).

It does not guarantee durability on file systems that ignore fsync, nor protect against a malicious
file (the checksum catches accidents, not forgery).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from trajflight.errors import CheckpointError, InvalidStateError, NotFoundError

from ._entries import ALLOCATED, READY, _Group, _Job, _Lease, _Server, _Writer
from ._records import LIVE_STATES, GroupState, JobConfig, Partition

if TYPE_CHECKING:
    from ._core import LedgerCore

__all__ = [
    "FORMAT_VERSION",
    "KIND_JOB",
    "KIND_SNAPSHOT",
    "MAGIC",
    "checkpoint_seq",
    "decode",
    "encode",
    "export_job_checkpoint",
    "export_snapshot",
    "import_snapshot",
    "install_job_checkpoint",
    "parse_job_checkpoint",
    "read_file",
    "write_atomic",
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


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file in the same directory, fsync, rename, dir fsync.

    Raises:
        CheckpointError: the file could not be written (the old file, if any, is untouched).
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(
            f"could not write {target}: {exc}; check that the directory exists and is writable",
            path=str(target),
        ) from exc


def read_file(path: str | os.PathLike[str]) -> bytes:
    """Read a checkpoint file.

    Raises:
        NotFoundError: no such file.
        CheckpointError: it could not be read.
    """
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise NotFoundError(f"no checkpoint at {path}") from None
    except OSError as exc:
        raise CheckpointError(f"could not read {path}: {exc}", path=str(path)) from exc


# ---------------------------------------------------------------------- export / import
def _key(key: Partition) -> list[Any]:
    return [key.job_id, key.epoch, key.group_id]


def _export_group(g: _Group) -> list[Any]:
    return [
        _key(g.key), g.state.value, g.server_id, g.generation, g.grant_token, g.nbytes, g.rows, g.tokens,
        g.policy_version, list(g.columns), g.batch_id, g.lease, g.expires_at, g.ready_seq,
    ]  # fmt: skip


def _import_group(row: list[Any]) -> _Group:
    (key, state, server_id, generation, grant_token, nbytes, rows, tokens, pv, columns, batch_id, lease,
     expires_at, ready_seq) = row  # fmt: skip
    g = _Group(Partition(*key), server_id, grant_token, nbytes, expires_at)
    g.state = GroupState(state)
    g.generation, g.rows, g.tokens, g.policy_version = generation, rows, tokens, pv
    g.colset = frozenset(columns)
    g.columns = tuple(sorted(g.colset))
    g.batch_id, g.lease, g.ready_seq = batch_id, lease, ready_seq
    return g


def _export_job(ledger: LedgerCore, job: _Job) -> dict[str, Any]:
    groups = ledger._groups
    return {
        "job_id": job.job_id,
        "epoch": job.epoch,
        "config": job.config.to_mapping(),
        "next_group_id": job.next_group_id,
        "policy_version": job.policy_version,
        "writers": {w: [writer.node, writer.acked] for w, writer in job.writers.items()},
        "committed": job.committed,
        "deleted": job.deleted,
        "groups": [_export_group(groups[k]) for k in job.groups],
        "gc": [[_key(e.key), e.attempts, e.last_error] for e in job.gc],
        "checkpoints": job.checkpoints,
        "durable": job.durable,
        "kept": [[_key(k), seq] for k, seq in job.kept.items()],
        "lost": [[_key(k), reason] for k, reason in job.lost.items()],
        "purged": job.purged,
    }


def _export_servers(ledger: LedgerCore, only: set[str] | None = None) -> list[list[Any]]:
    return [
        [s.server_id, s.node, s.location, s.capacity_bytes, s.capacity_groups]
        for s in ledger._servers.values()
        if only is None or s.server_id in only
    ]


def _import_servers(ledger: LedgerCore, rows: list[list[Any]]) -> None:
    for server_id, node, location, cap_b, cap_g in rows:
        if server_id not in ledger._servers:
            ledger._servers[server_id] = _Server(server_id, node, location, cap_b, cap_g)


def export_job_checkpoint(ledger: LedgerCore, job_id: str, now: float) -> bytes:
    """The job checkpoint of ``job_id`` as bytes (see the module docstring).

    Raises:
        NotFoundError: the job is not open.
        InvalidStateError: some group is LEASED..TRAINED (the cursor is not quiescent).
    """
    ledger._advance(now)
    job = ledger._job(job_id)
    live = sum(job.counts[s] for s in LIVE_STATES)
    if live:
        raise InvalidStateError(
            f"checkpoint of job {job_id!r} refused: {live} groups are LEASED..TRAINED; commit or release "
            "them (or let their leases expire) and checkpoint between training steps",
            live=live,
        )
    seq = job.checkpoints + 1
    payload = _export_job(ledger, job)
    # This checkpoint covers every commit kept so far: a restore from it deletes them.
    payload["gc"] += [[_key(k), 0, None] for k in job.kept]
    payload["kept"] = []
    payload["checkpoints"] = payload["durable"] = seq
    payload["last_token"] = ledger.last_token
    payload["servers"] = _export_servers(ledger, {ledger._groups[k].server_id for k in job.groups})
    payload["taken_at"] = ledger._now
    data = encode(KIND_JOB, payload, seq=seq)
    job.checkpoints = seq
    return data


_Parsed = tuple[dict[str, Any], list[_Group], list[tuple[Partition, int, Any]]]


class JobImport(NamedTuple):
    """A job checkpoint's payload, parsed and checked, ready for :func:`install_job_checkpoint`."""

    parsed: _Parsed
    servers: list[tuple[str, str, str, int, int]]
    last_token: int

    @property
    def server_ids(self) -> set[str]:
        """The storage servers the checkpoint lists."""
        return {row[0] for row in self.servers}


def parse_job_checkpoint(ledger: LedgerCore, payload: dict[str, Any]) -> JobImport:
    """Parse and check the payload of a decoded job checkpoint; the ledger is not changed.

    Raises:
        CheckpointError: the payload is malformed (or not quiescent).
    """
    try:
        parsed = _parse_job(payload)
        servers = [(str(a), str(b), str(c), int(d), int(e)) for a, b, c, d, e in payload["servers"]]
        last_token = int(payload["last_token"])
        known = {row[0] for row in servers} | set(ledger._servers)
        if any(g.server_id not in known for g in parsed[1]):
            raise ValueError("a group is placed on a server the checkpoint does not list")
        if any(g.state in LIVE_STATES for g in parsed[1]):
            raise ValueError("a group is LEASED..TRAINED in a job checkpoint")
    except (KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"checkpoint payload is malformed ({exc!r}); restore an older copy") from None
    return JobImport(parsed, servers, last_token)


def install_job_checkpoint(
    ledger: LedgerCore, imp: JobImport, epoch: int, config: JobConfig, now: float, *, min_token: int = 0
) -> list[_Group]:
    """Install a parsed job checkpoint at ``epoch`` and return its groups (not yet indexed).

    The caller has checked job, configuration and epoch. The returned groups are in the ledger with
    their checkpointed states, capacity is counted for each of them, and tokens issued from now on are
    larger than every token the checkpoint saw, and than ``min_token``.
    """
    _import_servers(ledger, [list(row) for row in imp.servers])
    floor = max(imp.last_token, min_token)
    if ledger.last_token < floor:
        ledger._incarnation = (floor >> 32) + 1
        ledger._counter = 0
    return _install_job(ledger, imp.parsed, epoch, config, now)


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
    ledger: LedgerCore, parsed: _Parsed, epoch: int, config: JobConfig, now: float
) -> list[_Group]:
    fields, groups, gc = parsed
    job = ledger._new_job(fields["job_id"], epoch, config)
    job.next_group_id = 0 if epoch != fields["epoch"] else fields["next_group_id"]
    job.policy_version = fields["policy_version"]
    job.committed, job.deleted = fields["committed"], fields["deleted"]
    job.checkpoints, job.durable = fields["checkpoints"], fields["durable"]
    job.kept, job.lost, job.purged = fields["kept"], fields["lost"], fields["purged"]
    for w, (node, acked) in fields["writers"].items():
        job.writers[w] = _Writer(node, acked)
    ledger._jobs[job.job_id] = job
    for g in groups:
        ledger._groups[g.key] = g
        job.groups[g.key] = None
        job.counts[g.state] += 1
        server = ledger._servers[g.server_id]
        server.used_bytes += g.nbytes
        server.used_groups += 1
        job.used_bytes += g.nbytes
        job.used_groups += 1
    for key, attempts, last_error in gc:
        job.gc.restore(key, attempts, last_error, now)
    return groups


def export_snapshot(ledger: LedgerCore) -> bytes:
    """The whole ledger (live leases included) as bytes, for a host's crash recovery."""
    leases = [
        [lease.token, lease.job_id, lease.owner, lease.ttl, lease.expires_at, [_key(k) for k in lease.keys],
         [_key(k) for k in lease.live], {b: [_key(k) for k in ks] for b, ks in lease.batches.items()},
         {b: s.value for b, s in lease.stage.items()}]
        for lease in ledger._leases.values()
    ]  # fmt: skip
    payload = {
        "incarnation": ledger._incarnation,
        "counter": ledger._counter,
        "now": ledger._now if ledger._now != float("-inf") else None,
        "servers": _export_servers(ledger),
        "jobs": [_export_job(ledger, job) for job in ledger._jobs.values()],
        "leases": leases,
        "reach": ledger._reach.export(),
        "fences": ledger._fences.export(),
    }
    return encode(KIND_SNAPSHOT, payload)


def import_snapshot(ledger: LedgerCore, data: bytes, *, source: str = "snapshot") -> None:
    """Load a snapshot into an empty ledger (every lease live again, every expiry where it was).

    Raises:
        CheckpointError: the snapshot is corrupt, truncated or of another format.
    """
    payload = decode(data, KIND_SNAPSHOT, source=source)
    try:
        ledger._incarnation, ledger._counter = payload["incarnation"], payload["counter"]
        now = payload["now"]
        ledger._now = float("-inf") if now is None else now
        _import_servers(ledger, payload["servers"])
        ledger._reach.load(payload.get("reach", []))
        parked = ledger._reach.parked_keys()  # READY, out of the index: keep their sequence numbers
        for jp in payload["jobs"]:
            cfg = JobConfig(**jp["config"])
            groups = _install_job(ledger, _parse_job(jp), jp["epoch"], cfg, ledger._now)
            job = ledger._jobs[jp["job_id"]]
            ready = (g for g in groups if g.state is READY and g.key not in parked)
            for g in sorted(ready, key=lambda g: g.ready_seq):
                g.ready_seq = job.ready.push(g.key, g.policy_version, g.colset)
            for g in groups:
                if g.state is ALLOCATED:
                    ledger._grant_heap.append((g.expires_at, g.key))
        ledger._grant_heap.sort()
        for token, job_id, owner, ttl, expires_at, keys, live, batches, stage in payload["leases"]:
            lease = _Lease(token, job_id, owner, ttl, expires_at)
            lease.keys = [Partition(*k) for k in keys]
            lease.live = {Partition(*k): None for k in live}
            lease.batches = {b: tuple(Partition(*k) for k in ks) for b, ks in batches.items()}
            lease.stage = {b: GroupState(s) for b, s in stage.items()}
            ledger._leases[token] = lease
            ledger._lease_heap.append((expires_at, token))
        ledger._lease_heap.sort()
        ledger._fences.load(payload.get("fences", []), ledger._now)  # snapshots before fences had none
    except (KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{source}: payload is malformed ({exc!r})", path=source) from None
