"""The archive of trained groups: committed groups written as Parquet before their data is deleted.

The controller host hands its sweeper's deletes to :class:`Archive` (a ``batch deleter``, see
``LocalController``). Deletes of groups that were not committed (dropped, abandoned, purged) go
straight to the storage servers, unless ``archive_dropped`` asks to keep those too. Committed groups
are held until ``max_groups`` of them wait or the oldest waited ``flush_after`` seconds, then read
from their servers (tokenless reads, which touch no lease or generation), written under the
archive's root as ``job_id=<job>/epoch=<n>/part-<batch>.parquet`` (zstd, many groups per file, up to
about ``max_bytes`` of Arrow data each) with the lease facts analysts need as extra columns, and only
once that file is durable deleted from their servers:

* ``trained_by`` (string): the owner of the lease that committed the group;
* ``committed_at`` (timestamp, UTC): when it was committed;
* ``trained_version`` (int64): the job's announced policy version at the commit;
* ``staleness`` (int64): ``trained_version - policy_version`` of each sample;
* ``outcome`` (string): ``"committed"``, or ``"dropped"`` for a dropped group (archived only with
  ``archive_dropped``; its lease facts are null).

Every stored column is kept as stored (nested ``top_p_*``, dictionaries, structs, user columns), and
``trajflight.analytics.scan`` reads the dataset back.

**Nothing is deleted unarchived.** A failed read or write reports every delete of the batch as failed: the
groups stay on their servers and on the GC list, handed out again after the GC list's back-off. The
failure is logged and kept as a typed :class:`~trajflight.errors.ArchiveError` in :meth:`Archive.status`
(which ``trajflight stats`` shows).

**Nothing is archived twice.** Before a batch's file is written, its membership (every group's
partition, server, token and commit facts) is written durably to ``_manifests/<batch>.json`` under the
root, and the batch is named from that membership (a digest of its sorted partitions). Each group belongs
to at most one manifest: a group handed out again (a failed delete, a delete never reported, a controller
restart between the file's rename and the deletes) is looked up in the manifests first (loaded when the
archive opens), and its batch's file is written again, under the same name with the same members, only
when it does not exist yet; otherwise the group is only deleted. A manifest is removed once every one of
its groups' deletes succeeded; a group that is then handed out again (its delete was confirmed to the
servers but not to the controller) is no longer on its server, so it is not read, only "deleted" again
(a delete of a missing group succeeds). Data files are written to a ``.tmp-`` name and renamed, so a
reader never sees a partial file; names starting with ``.`` or ``_`` are ignored by ``pyarrow.dataset``.

What it does not guarantee: files of about ``max_bytes`` exactly (a batch is cut between groups); an
archive shared by two controllers (each would write its own batches); the removal of a manifest whose
last deletes completed in a process that then died (it is kept, harmless, and loaded again).

**Threads.** Calls are synchronous and one at a time: ``LocalCluster`` runs them on an
:class:`~trajflight._archive_worker.ArchiveWorker` thread, off the controller's sweeper. Within a call,
files are written on a small pool (:data:`WORKERS` threads; Parquet and zstd release the GIL) while the
next file's groups are read, and a durable file's groups are deleted in one batched call per server
(``delete_groups``: a stale token on one group fails that group only). Parquet is written with
zstd level :data:`ZSTD_LEVEL` and dictionary encoding for string columns only (the profile and the
figures are in BENCHMARKS.md, "The archive").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from trajflight.controller import DeleteOutcome, DeleteWork, GroupDeletes
from trajflight.errors import ArchiveError, NotFoundError, brief
from trajflight.keys import Partition

__all__ = ["FACT_COLUMNS", "TIMELINE_KEY", "Archive", "open_filesystem", "parquet_options"]

log = logging.getLogger("trajflight.archive")

FACT_COLUMNS: tuple[str, ...] = ("trained_by", "committed_at", "trained_version", "staleness", "outcome")
"""The lease-fact columns the archive adds to every row."""

_MANIFESTS = "_manifests"
TIMELINE_KEY = b"trajflight.timeline"
"""The Parquet footer key of each data file's copy of the controller's timeline (JSON: ``v``, ``run``,
``samples``), as it was when the file was written."""
FILES_IN_FLIGHT = 2
"""Files of one flush written at once while the next file's groups are read."""
WORKERS = FILES_IN_FLIGHT
"""Threads of the archive's pool: files being written (Parquet and zstd release the GIL)."""
READ_GROUPS = 64
"""Groups read from a server in one stream (bounds the memory of a read beyond one file's groups)."""
ZSTD_LEVEL = 1
"""The archive's zstd level: level 1 writes the standard workload's token columns about as small as the
default level 3 (BENCHMARKS.md, "The archive"), in less time."""
_WRITE_HINT = "make the archive writable (space, permissions, credentials)"
_READ_HINT = "bring the storage server back, or restore the job so that its lost groups are accounted for"


def open_filesystem(
    location: str | os.PathLike[str], filesystem: pafs.FileSystem | None = None
) -> tuple[pafs.FileSystem, str]:
    """The filesystem and root path of an archive ``location`` (a local path or a ``pyarrow.fs`` URI).

    Raises:
        ArchiveError: the URI names a filesystem pyarrow does not know, or cannot be reached.
    """
    text = os.fspath(location)
    if filesystem is not None:
        return filesystem, text.rstrip("/")
    if "://" not in text:
        return pafs.LocalFileSystem(), os.path.abspath(text)
    try:
        fs, path = pafs.FileSystem.from_uri(text)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise ArchiveError(
            f"cannot open the archive location {brief(text)}: {str(exc)[:200]}; give a local path or a "
            "pyarrow.fs URI (s3://bucket/prefix, gs://, hdfs://)",
            location=text[:200],
        ) from exc
    return fs, path.rstrip("/")


def _key(work: DeleteWork) -> Partition:
    return Partition(*work.partition)


def batch_name(members: Iterable[Partition]) -> str:
    """The name of the batch of ``members``: a digest of its sorted partitions (the same for a retry)."""
    text = json.dumps(sorted([k.job_id, k.epoch, k.group_id] for k in members))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class _Batch:
    """One archive file's membership, as its manifest records it."""

    name: str
    job_id: str
    epoch: int
    members: list[DeleteWork]
    deleted: set[Partition] = field(default_factory=set)

    def manifest(self) -> bytes:
        rows = [{**asdict(w), "partition": list(w.partition)} for w in self.members]
        body = {"v": 1, "name": self.name, "job_id": self.job_id, "epoch": self.epoch, "members": rows}
        return json.dumps(body).encode()

    @classmethod
    def parse(cls, data: bytes) -> _Batch:
        body = json.loads(data)
        if body.get("v") != 1:
            raise ValueError(f"unknown manifest version {brief(body.get('v'))}")
        members = [
            DeleteWork(**{**row, "partition": Partition(*row["partition"])}) for row in body["members"]
        ]
        return cls(str(body["name"]), str(body["job_id"]), int(body["epoch"]), members)


class Archive:
    """Writes committed groups to a Parquet archive, then deletes them (the controller host's batch
    deleter; see the module docstring for what it guarantees).

    Args:
        location: The archive's root: a local directory or a ``pyarrow.fs`` URI.
        read: Reads groups tokenlessly from the server at a location: ``read(location, partitions)``
            returns their rows in one table, raising :class:`~trajflight.errors.NotFoundError` when one
            is missing.
        delete_groups: Deletes many groups from their servers in as few calls as it can
            (``StoragePool.delete_groups``): returns each item's ``(work, ok, error)`` in order (a
            group its server no longer has is deleted: ok); raising fails every item of the call.
        filesystem: The filesystem ``location`` is a path on (an ``S3FileSystem`` with an
            ``endpoint_override``, say); None resolves it from ``location``.
        max_groups: Groups per file at most; this many waiting groups are written at once.
        max_bytes: Arrow bytes per file, about (a file is cut between groups).
        flush_after: Longest a committed group waits for its file (seconds); keep it well below the
            job's ``delete_timeout``, after which an unreported delete is handed out again.
        clock: Monotonic seconds.
        archive_dropped: Archive dropped groups too (an operator's ``resolve(..., "drop")`` of
            ``UNKNOWN`` groups, a new epoch's dropped READY groups, a restore's purges), marked
            ``outcome = "dropped"`` and without lease facts; by default they are deleted unarchived.
        pressure: A count that rises whenever a writer is refused for capacity (the controller's
            capacity refusals); a rise since the last pass writes the held groups at once rather than
            at ``flush_after``, since their deletes free what the writers wait for. None: timer and
            count only.

    Attributes:
        clock: The ``clock`` it was given (a host that queues deletes for it reads the time there).
        timeline: The controller's timeline of job counts (``LocalController.timeline``), set by the
            host once the controller exists; every data file carries it as it was when the file was
            written, in its Parquet footer under :data:`TIMELINE_KEY` (a report over the archive alone
            draws it). None writes no timeline.

    Raises:
        ArchiveError: the location cannot be opened, or its manifests cannot be read.
    """

    def __init__(
        self,
        location: str | os.PathLike[str],
        *,
        read: Callable[[str, list[Partition]], pa.Table],
        delete_groups: Callable[[Sequence[DeleteWork]], list[DeleteOutcome]],
        filesystem: pafs.FileSystem | None = None,
        max_groups: int = 1024,
        max_bytes: int = 64 << 20,
        flush_after: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        archive_dropped: bool = False,
        pressure: Callable[[], int] | None = None,
    ) -> None:
        self.location = os.fspath(location)
        self.fs, self.root = open_filesystem(location, filesystem)
        self._read = read
        self._delete_groups = delete_groups
        self.max_groups = max_groups
        self.max_bytes = max_bytes
        self.flush_after = flush_after
        self.clock = clock
        self.reasons = frozenset({"committed", "dropped"} if archive_dropped else {"committed"})
        self._pressure = pressure
        self._pressed = 0 if pressure is None else pressure()
        self._held: dict[Partition, DeleteWork] = {}
        self._oldest: float | None = None
        self._batches: dict[str, _Batch] = {}
        self._index: dict[Partition, str] = {}
        self._lock = threading.Lock()  # guards the counters and error status() reads from other threads
        self.counters = {"files": 0, "groups": 0, "rows": 0, "bytes": 0, "failures": 0, "rewrites": 0}
        self.last_error: ArchiveError | None = None
        self._local = isinstance(self.fs, pafs.LocalFileSystem)
        self._pool: ThreadPoolExecutor | None = None
        self.timeline: Callable[[], list[dict[str, Any]]] | None = None
        self._run_id = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-{os.urandom(4).hex()}"
        self._load_manifests()

    # ------------------------------------------------------------------ paths
    def _path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def _file(self, batch: _Batch) -> str:
        return self._path(f"job_id={batch.job_id}", f"epoch={batch.epoch}", f"part-{batch.name}.parquet")

    def _manifest(self, batch: _Batch) -> str:
        return self._path(_MANIFESTS, f"{batch.name}.json")

    def _load_manifests(self) -> None:
        selector = pafs.FileSelector(self._path(_MANIFESTS), recursive=False, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(selector)
            for info in infos:
                if info.type != pafs.FileType.File or not info.base_name.endswith(".json"):
                    continue  # a temporary a crash left behind
                with self.fs.open_input_stream(info.path) as f:
                    self._remember(_Batch.parse(f.read()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ArchiveError(
                f"cannot read the archive's manifests under {brief(self.location)}: {str(exc)[:200]}; "
                "check the location and its permissions",
                location=self.location[:200],
            ) from exc

    def _remember(self, batch: _Batch) -> None:
        self._batches[batch.name] = batch
        for w in batch.members:
            self._index[_key(w)] = batch.name

    # ------------------------------------------------------------------ the batch deleter
    @property
    def pending(self) -> int:
        """Groups waiting for their file."""
        return len(self._held)

    def __call__(self, work: list[DeleteWork], *, since: float | None = None) -> list[DeleteOutcome]:
        """Run one sweeper pass's deletes; returns the outcome of every delete finished now (some of an
        earlier pass's, held for their file), never raises. Held deletes are not reported yet.

        ``since``: when the oldest of ``work`` was handed out, on :attr:`clock` (default now): time it
        spent queued for the archive counts towards ``flush_after``, so a group that waited behind a
        file being written is not held for a whole ``flush_after`` more."""
        kept = self.reasons
        out = self._deletes([w for w in work if w.reason not in kept])
        now = self.clock()
        for w in work:
            if w.reason in kept:
                self._held[_key(w)] = w  # a repeat hand-out replaces the older one (its token may be newer)
                if self._oldest is None:
                    self._oldest = now if since is None else min(now, since)
        due = self._oldest is not None and now - self._oldest >= self.flush_after
        if self._held and (due or len(self._held) >= self.max_groups or self._writers_wait()):
            out.extend(self.flush())
        return out

    def _writers_wait(self) -> bool:
        """Whether a writer was refused for capacity since the last look."""
        if self._pressure is None:
            return False
        seen, self._pressed = self._pressed, self._pressure()
        return self._pressed > seen

    def flush(self) -> list[DeleteOutcome]:
        """Archive and delete every held group now; returns their outcomes (never raises)."""
        held, self._held, self._oldest = list(self._held.values()), {}, None
        out: list[DeleteOutcome] = []
        known: dict[str, list[DeleteWork]] = {}
        fresh: dict[tuple[str, int], list[DeleteWork]] = {}
        for w in held:
            name = self._index.get(_key(w))
            if name is not None:
                known.setdefault(name, []).append(w)
            else:
                fresh.setdefault((w.partition[0], w.partition[1]), []).append(w)
        for name, items in known.items():
            out.extend(self._finish(self._batches[name], items))
        for (job_id, epoch), items in fresh.items():
            out.extend(self._archive_new(job_id, epoch, items))
        return out

    def _timeline_metadata(self) -> dict[bytes, bytes]:
        """The footer metadata that carries the controller's timeline (none without one)."""
        samples = None if self.timeline is None else self.timeline()
        if not samples:
            return {}
        body = {"v": 1, "run": self._run_id, "samples": samples}
        return {TIMELINE_KEY: json.dumps(body, separators=(",", ":")).encode()}

    # ------------------------------------------------------------------ writing
    def _archive_new(self, job_id: str, epoch: int, items: list[DeleteWork]) -> list[DeleteOutcome]:
        """Read ``items`` (one job and epoch) a slice at a time, and write a file whenever the groups
        read reach a file's size. Files are written on the archive's pool while the next one's groups
        are read; at most :data:`FILES_IN_FLIGHT` are being written, so at most about that many plus
        one files' groups are held in memory. Each file's deletes start once it is durable."""
        out: list[DeleteOutcome] = []
        chunk: list[tuple[DeleteWork, pa.Table]] = []
        size = 0
        writing: deque[tuple[_Batch, Future[None]]] = deque()

        def begin(chunk: list[tuple[DeleteWork, pa.Table]]) -> None:
            started = self._start_batch(job_id, epoch, chunk)
            if isinstance(started, list):
                out.extend(started)
                return
            writing.append(started)
            while len(writing) >= FILES_IN_FLIGHT:
                out.extend(self._end_batch(*writing.popleft()))

        for location, ws in _by_location(items).items():
            for start in range(0, len(ws), READ_GROUPS):
                part = ws[start : start + READ_GROUPS]
                try:
                    read = self._read_groups(location, part)
                except Exception as exc:  # the server is down or refused: its groups wait for a retry
                    out.extend(self._failed(part, f"reading from {location}", exc, _READ_HINT))
                    continue
                # Not stored any more: deleted after their archiving (a late report), or lost.
                out.extend(self._deletes([w for w, t in read if t is None]))
                for w, t in read:
                    if t is None:
                        continue
                    if chunk and (len(chunk) >= self.max_groups or size + t.nbytes > self.max_bytes):
                        begin(chunk)
                        chunk, size = [], 0
                    chunk.append((w, t))
                    size += t.nbytes
        if chunk:
            begin(chunk)
        while writing:
            out.extend(self._end_batch(*writing.popleft()))
        return out

    def _read_groups(self, location: str, items: list[DeleteWork]) -> list[tuple[DeleteWork, Any]]:
        """Each item with its rows, or None when its server no longer has it."""
        keys = [_key(w) for w in items]
        try:
            table = self._read(location, keys)
        except NotFoundError:  # one is missing: read them one by one to know which
            out: list[tuple[DeleteWork, Any]] = []
            for w, k in zip(items, keys, strict=True):
                try:
                    out.append((w, self._read(location, [k])))
                except NotFoundError:
                    out.append((w, None))
            return out
        return _split_groups(table, items)

    def _start_batch(
        self, job_id: str, epoch: int, chunk: list[tuple[DeleteWork, pa.Table]]
    ) -> tuple[_Batch, Future[None]] | list[DeleteOutcome]:
        """Record a new batch's manifest, then start writing its file on the pool; the failed outcomes
        of its groups when the manifest cannot be written."""
        members = [w for w, _ in chunk]
        batch = _Batch(batch_name(_key(w) for w in members), job_id, epoch, members)
        try:
            self._put(self._manifest(batch), batch.manifest())
        except Exception as exc:  # nothing recorded: the groups form a new batch on their retry
            return self._failed(members, "writing a manifest", exc)
        self._remember(batch)
        return batch, self._executor().submit(self._write_file, batch, [t for _, t in chunk])

    def _end_batch(self, batch: _Batch, writing: Future[None]) -> list[DeleteOutcome]:
        """Wait for a batch's file; once it is durable delete its groups, else report them failed."""
        try:
            writing.result()
        except Exception as exc:  # the manifest stays: the retry writes this same file
            return self._failed(batch.members, "writing a file", exc)
        return self._delete_members(batch, batch.members)

    def _executor(self) -> ThreadPoolExecutor:
        """The pool that writes files (made on first use, ended by :meth:`close`)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="trajflight-archive")
        return self._pool

    def _finish(self, batch: _Batch, items: list[DeleteWork]) -> list[DeleteOutcome]:
        """Groups handed out again whose batch is recorded: write its file if it is missing, then delete."""
        try:
            if not self.fs.get_file_info(self._file(batch)).is_file:
                tables: list[pa.Table] = []
                for location, ws in _by_location(batch.members).items():
                    tables.extend(t for _, t in self._read_groups(location, ws) if t is not None)
                self._write_file(batch, tables)
                with self._lock:
                    self.counters["rewrites"] += 1
        except Exception as exc:  # a server down, or the target unwritable: retried as a whole
            return self._failed(items, "writing a file again", exc)
        return self._delete_members(batch, items)

    def _write_file(self, batch: _Batch, tables: Sequence[pa.Table]) -> None:
        table = pa.concat_tables(tables, promote_options="permissive") if tables else None
        if table is None:
            return  # every member is gone from its server: nothing left to keep
        facts = _facts(table, {_key(w): w for w in batch.members})
        for name, column in facts.items():
            if name in table.column_names:
                table = table.drop_columns([name])
            table = table.append_column(name, column)
        timeline = self._timeline_metadata()
        if timeline:
            table = table.replace_schema_metadata({**(table.schema.metadata or {}), **timeline})
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, **parquet_options(table.schema))
        data = sink.getvalue()
        self._put(self._file(batch), data)
        with self._lock:
            self.counters["files"] += 1
            self.counters["groups"] += len(tables)
            self.counters["rows"] += table.num_rows
            self.counters["bytes"] += data.size
            self.last_error = None

    def _put(self, path: str, data: bytes | pa.Buffer) -> None:
        """Write ``data`` to ``path`` atomically: a ``.tmp-`` name first (fsynced on a local disk), then a
        rename, so a reader sees the whole file or none."""
        parent, base = path.rsplit("/", 1)
        tmp = f"{parent}/.tmp-{base}"
        self.fs.create_dir(parent, recursive=True)
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        if self._local:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self.fs.move(tmp, path)
        if self._local:
            fd = os.open(parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    # ------------------------------------------------------------------ deleting
    def _delete_members(self, batch: _Batch, items: list[DeleteWork]) -> list[DeleteOutcome]:
        out = self._deletes(items)
        batch.deleted.update(_key(w) for w, ok, _ in out if ok)
        if len(batch.deleted) >= len(batch.members):
            with contextlib.suppress(OSError):  # a manifest left behind is harmless (module docstring)
                self.fs.delete_file(self._manifest(batch))
            self._batches.pop(batch.name, None)
            for w in batch.members:
                self._index.pop(_key(w), None)
        return out

    def _deletes(self, items: list[DeleteWork]) -> list[DeleteOutcome]:
        """Delete ``items`` in one batched call (per server); each item's outcome, in order. Never
        raises: a deleter that raises fails every item (they stay on the GC list and are retried)."""
        out: list[DeleteOutcome] = GroupDeletes(self._delete_groups)(items)
        return out

    def _failed(
        self, items: list[DeleteWork], doing: str, exc: Exception, hint: str = _WRITE_HINT
    ) -> list[DeleteOutcome]:
        error = ArchiveError(
            f"the archive at {brief(self.location)} failed {doing} ({type(exc).__name__}: {str(exc)[:200]}); "
            f"{len(items)} groups stay on their storage servers and are retried: {hint}",
            location=self.location[:200],
        )
        log.warning("%s", error)
        with self._lock:
            self.counters["failures"] += 1
            self.last_error = error
        text = f"ArchiveError: {error}"
        return [(w, False, text) for w in items]

    def status(self) -> dict[str, Any]:
        """What the archive did (plain JSON, for ``trajflight stats``): files, groups, rows and bytes
        written, failures, groups waiting, and the last error (``None`` once a file was written since)."""
        with self._lock:
            error = self.last_error
            return {
                "location": self.location[:200],
                **self.counters,
                "pending": len(self._held),
                "error": None if error is None else {"type": type(error).__name__, "message": str(error)},
            }

    def close(self) -> None:
        """Forget held groups without deleting them: they stay on the GC list and are handed out again;
        end the pool (a file being written is finished first)."""
        self._held, self._oldest = {}, None
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def _by_location(items: Iterable[DeleteWork]) -> dict[str, list[DeleteWork]]:
    out: dict[str, list[DeleteWork]] = {}
    for w in items:
        out.setdefault(w.location, []).append(w)
    return out


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """The ``pyarrow.parquet.write_table`` options of an archive file of ``schema`` (measured against
    the alternatives in BENCHMARKS.md, "The archive"):

    * zstd at :data:`ZSTD_LEVEL`, but at level -1 for the values of float lists (log-probabilities:
      level 1 saves about a tenth of their bytes, at most of their write time);
    * byte-stream-split encoding of the values of ``list<int32>`` columns (token ids: their high bytes,
      split apart, compress to almost nothing; smaller files in less time);
    * dictionary encoding for top-level strings only (see :func:`_dictionary_columns`);
    * statistics (min/max) for top-level scalar columns only (the keys and rewards readers filter on;
      nobody filters on a token list's minimum).

    Every such file is read by pyarrow, DuckDB and Polars (``tests/analytics``).
    """
    floats, ints = [], []
    for f in schema:
        if pa.types.is_list(f.type) or pa.types.is_large_list(f.type):
            values = f.type.value_type
            if pa.types.is_floating(values):
                floats.append(f"{f.name}.list.element")
            elif values == pa.int32():
                ints.append(f"{f.name}.list.element")
    return {
        "compression": "zstd",
        # Per column: a column not named gets Arrow's default zstd level, 1 (ZSTD_LEVEL).
        "compression_level": {**{c: ZSTD_LEVEL for c in ints}, **{c: -1 for c in floats}} or ZSTD_LEVEL,
        "use_dictionary": _dictionary_columns(schema),
        "use_byte_stream_split": ints or False,
        "write_statistics": [f.name for f in schema if not pa.types.is_nested(f.type)],
    }


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns worth dictionary-encoding: top-level strings (job, owner, outcome: few values). Token,
    logprob and mask lists are not: Parquet's dictionary attempt on them costs most of a file's write
    time and falls back to plain encoding anyway (BENCHMARKS.md, "The archive")."""
    return [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]


def _split_groups(table: pa.Table, items: list[DeleteWork]) -> list[tuple[DeleteWork, Any]]:
    """``table`` (the rows of ``items``, in order) cut into each item's rows."""
    gid = table.column("group_id").to_numpy()
    out: list[tuple[DeleteWork, Any]] = []
    start = 0
    for w in items:
        end = start
        while end < len(gid) and gid[end] == w.partition[2]:
            end += 1
        out.append((w, table.slice(start, end - start)))
        start = end
    return out


def _facts(table: pa.Table, by_key: dict[Partition, DeleteWork]) -> dict[str, pa.Array]:
    """The lease-fact columns of ``table``'s rows (one job and epoch), from each group's delete."""
    job_id = table.column("job_id")[0].as_py() if table.num_rows else ""
    epoch = table.column("epoch")[0].as_py() if table.num_rows else 0
    rows = [by_key[Partition(job_id, epoch, g)] for g in table.column("group_id").to_pylist()]
    version = pa.array([w.trained_version for w in rows], pa.int64())
    stale = (
        pc.subtract(version, table.column("policy_version").cast(pa.int64()))
        if "policy_version" in table.column_names
        else pa.nulls(table.num_rows, pa.int64())
    )
    micros = [None if w.committed_at is None else round(w.committed_at * 1e6) for w in rows]
    return {
        "trained_by": pa.array([w.trained_by for w in rows], pa.string()),
        "committed_at": pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "trained_version": version,
        "staleness": stale,
        "outcome": pa.array([w.reason for w in rows], pa.string()),
    }
