"""Data movement of the public client: a pool of storage connections, reads of handles, fences.

Reads of a :class:`~trajflight._handles.BatchHandle` go to every storage server involved at once (one
call per server on its own thread), each group under the lease's token, and come back as one table in the
handle's group order.

Transport, per server: ``"auto"`` (the default) uses the server's shared-memory arena when the server runs
on this host, decided by host identity (the server's ``health`` reports ``host_id`` =
``hostname/boot_id`` and its arena directory; this process must see the same identity and the directory),
never by comparing IP addresses; otherwise Flight. ``"shm"`` forces shared memory (an error where it is
not possible), ``"flight"`` forces Flight. Shared-memory reads alias read-only mappings of the server's
segments (no copy); Flight reads own received buffers.

It does not retry: a failed read raises the server's typed error, and nothing was changed.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import numpy as np
import pyarrow as pa

from trajflight._handles import BatchHandle
from trajflight.codec import default_sample_ids
from trajflight.controller import DeleteWork, FenceWork
from trajflight.errors import ConfigError, DeadlineExceededError, InvalidRequestError, NotFoundError
from trajflight.flight_server import (
    GroupRead,
    LeaseToken,
    ShmOpened,
    StorageClient,
    host_id,
    join_batches,
    run_parallel,
)
from trajflight.keys import Partition

T = TypeVar("T")

__all__ = [
    "TRANSPORTS",
    "StoragePool",
    "Transport",
    "joined_with_keys",
    "read_handle",
    "with_key",
]

Transport = Literal["auto", "shm", "flight"]
TRANSPORTS: tuple[str, ...] = ("auto", "shm", "flight")


class StoragePool:
    """One :class:`StorageClient` per server location, created on first use, shared across threads.

    Args:
        timeout: Default deadline of each storage call.
        transport: ``"auto"`` (shared memory with servers on this host, Flight otherwise), ``"shm"`` or
            ``"flight"`` (forced); see the module docstring.

    Raises:
        ConfigError: an unknown transport.
    """

    def __init__(self, *, timeout: float = 30.0, transport: Transport = "auto") -> None:
        if transport not in TRANSPORTS:
            raise ConfigError(
                f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}", setting="transport"
            )
        self.timeout = timeout
        self.transport: Transport = transport
        self._clients: dict[str, StorageClient] = {}
        self._routes: dict[str, bool] = {}  # location -> uses shared memory
        self._lock = threading.Lock()

    def client(self, location: str) -> StorageClient:
        """The (cached) client of the server at ``location``."""
        with self._lock:
            found = self._clients.get(location)
            if found is None:
                found = self._clients[location] = StorageClient(location, timeout=self.timeout)
            return found

    def uses_shm(self, location: str, *, timeout: float | None = None) -> bool:
        """Whether calls to the server at ``location`` go through shared memory (decided once, cached;
        deciding asks the server's ``health`` under ``timeout``, default the pool's).

        Raises:
            ConfigError: ``transport="shm"`` and the server has no arena or is on another host.
            UnavailableError, DeadlineExceededError: the server did not answer while deciding.
        """
        with self._lock:
            found = self._routes.get(location)
        if found is not None:
            return found
        if self.transport == "flight":
            use = False
        else:
            health = self.client(location).health(timeout=timeout)
            shm_dir = health.get("shm_dir")
            same_host = health.get("host_id") == host_id()
            use = bool(shm_dir) and same_host and os.access(str(shm_dir), os.R_OK | os.X_OK)
            if self.transport == "shm" and not use:
                why = (
                    "it has no shared-memory arena (start it with --shm-dir)"
                    if not shm_dir
                    else "it runs on another host"
                    if not same_host
                    else f"its arena {shm_dir} is not visible from this process"
                )
                raise ConfigError(
                    f"transport='shm' but the storage server at {location} cannot be reached through "
                    f"shared memory: {why}; use transport='auto' or 'flight'",
                    setting="transport",
                )
        if use:
            self.client(location).use_local_channel(health.get("shm_socket"))
        with self._lock:
            self._routes[location] = use
        return use

    def put_group(
        self, location: str, key: Partition, batch: pa.RecordBatch, *, writer: str, timeout: float
    ) -> None:
        """Put one group on the server at ``location`` through shared memory or Flight (see the module
        docstring): a list of one, see :meth:`put_groups`. Raises like :meth:`StorageClient.put_groups`."""
        self._put(location, [(key, batch)], None, writer=writer, timeout=timeout)

    def put_groups(
        self,
        location: str,
        groups: Sequence[tuple[Partition, pa.RecordBatch]],
        *,
        writer: str,
        timeout: float,
        joined: pa.RecordBatch | None = None,
        default_ids: Sequence[bool] = (),
    ) -> None:
        """Put several groups on one server in one call, published together: through shared memory as
        one contiguous segment (read back in order with no copy), or as one Flight stream.

        Each batch's key columns are set to its key here (see :func:`with_key`); on the shared-memory path
        once, on the joined batch, rather than group by group. ``joined`` is the groups' batches already
        joined, rows in order (:class:`~trajflight.codec.EncodedGroups`): the shared-memory path then skips
        its copy to join them. ``default_ids``, per group (none: all ``False``): its sample ids were left
        to the writer, and follow its key (see :func:`with_key`).
        """
        if self.uses_shm(location) and len(groups) > 1:
            # Keyed once on the joined batch the shared-memory put writes as it is; the groups are its rows.
            keys = [key for key, _ in groups]
            data = joined_with_keys(
                [batch for _, batch in groups], keys, joined=joined, default_ids=default_ids
            )
            starts = itertools.accumulate((batch.num_rows for _, batch in groups), initial=0)
            slices = [
                (key, data.slice(at, batch.num_rows))
                for (key, batch), at in zip(groups, starts, strict=False)
            ]
            self._put(location, slices, data, writer=writer, timeout=timeout)
            return
        flags = list(default_ids) or [False] * len(groups)
        keyed = [
            (key, with_key(batch, key, default_ids=d)) for (key, batch), d in zip(groups, flags, strict=True)
        ]
        self._put(location, keyed, None, writer=writer, timeout=timeout)

    def _put(
        self,
        location: str,
        groups: Sequence[tuple[Partition, pa.RecordBatch]],
        joined: pa.RecordBatch | None,
        *,
        writer: str,
        timeout: float,
    ) -> None:
        """The one put of each transport: the groups (keyed; ``joined``: their rows in one batch, for
        shared memory) in one call, published together."""
        client = self.client(location)
        if self.uses_shm(location):
            client.shm_put_groups(
                groups, joined=joined, writer=writer, ttl=max(1.0, timeout), timeout=timeout
            )
        else:
            client.put_groups(groups, writer=writer, timeout=timeout)

    def get(
        self,
        location: str,
        reads: Sequence[GroupRead],
        *,
        columns: Sequence[str] | None,
        timeout: float,
        opened: ShmOpened | None = None,
    ) -> pa.Table:
        """Read groups from one server through shared memory (aliasing the segments) or Flight.

        ``opened`` (from :meth:`advance`) saves the shared-memory read its ``shm_open`` call when it
        covers the reads and columns."""
        client = self.client(location)
        if self.uses_shm(location):
            return client.shm_get(reads, columns=columns, timeout=timeout, opened=opened)
        return client.get(reads, columns=columns, timeout=timeout)

    def close(self) -> None:
        """Close every connection."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()

    def delete(self, work: DeleteWork) -> None:
        """Carry out one delete of the controller's GC list (the controller host's ``deleter``).

        A group the server no longer has counts as deleted. Raises on failure: the controller keeps the
        group on its GC list and retries.
        """
        read = GroupRead(Partition(*work.partition), LeaseToken(work.token))
        self.client(work.location).delete([read])

    def fence_groups(self, work: Sequence[FenceWork]) -> None:
        """Carry out fences of the controller's fence list on one server (the controller host's
        ``fencer``): raise each group's highest generation there, so that the token of the lease that
        ended without its holder is refused for Flight and shared-memory reads, appends and deletes.

        A group the server no longer has, or whose generation is already higher, counts as fenced. Raises
        on failure: the controller keeps the fences on its list and retries.
        """
        if not work:
            return
        reads = [GroupRead(Partition(*w.partition), LeaseToken(w.generation)) for w in work]
        self.client(work[0].location).advance_generation(reads)

    def fence(self, locations: Iterable[str], job_id: str, min_epoch: int) -> None:
        """Tell every server to refuse puts and leases of ``job_id`` under epochs below ``min_epoch``."""
        for location in sorted(set(locations)):
            self.client(location).fence(job_id, min_epoch)

    def advance(self, handle: BatchHandle, *, timeout: float | None = None) -> dict[str, ShmOpened]:
        """Raise the servers' highest generation of the handle's groups to the lease's tokens.

        After this, a zombie holding an older lease on these groups is refused by the servers even for
        reads and appends it makes before the new holder's first read. Servers reached through shared
        memory do it with ``shm_open`` (which fences the same way) and hand over the groups' segments in
        the same call, which the lease maps (and so locks against reuse) at once: its first read needs no
        call and no mapping of its own. Every server is called at once, each under ``timeout`` (default
        the pool's).

        Returns:
            The opened segments per location, for servers reached through shared memory.

        Raises:
            The error of the first server (in the handle's order) that failed, once every call ended.
        """
        opened, failed = self.advance_each(handle, timeout=timeout)
        if failed:
            raise next(iter(failed.values()))
        return opened

    def advance_each(
        self, handle: BatchHandle, *, timeout: float | None = None
    ) -> tuple[dict[str, ShmOpened], dict[str, Exception]]:
        """:meth:`advance`, server by server: a server that fails does not hide what the others did.

        Returns:
            The opened segments per location (servers reached through shared memory), and the error of
            every location whose call failed (``NotFoundError``: it lacks a group; ``UnavailableError``
            or ``DeadlineExceededError``: it did not answer), in the handle's order.
        """
        by_location = _by_location(handle)
        calls = [
            functools.partial(self._advance_one, loc, groups, timeout) for loc, groups in by_location.items()
        ]
        results = _in_parallel_settled(calls, "trajflight-advance")
        opened = {
            loc: got for loc, got in zip(by_location, results, strict=True) if isinstance(got, ShmOpened)
        }
        failed = {
            loc: got for loc, got in zip(by_location, results, strict=True) if isinstance(got, Exception)
        }
        return opened, failed

    def _advance_one(self, location: str, groups: Sequence[Any], timeout: float | None) -> ShmOpened | None:
        client, reads = self.client(location), _lease_reads(groups)
        if self.uses_shm(location, timeout=timeout):
            return _open_and_lock(client, reads, timeout)
        missing = client.advance_generation(reads, timeout=timeout).get("missing") or []
        if missing:  # as shm_open refuses it: a lease of groups this server lost can never be read here
            first = missing[0]
            example = (first.get("job_id"), first.get("epoch"), first.get("group_id"))
            raise NotFoundError(
                f"storage server {location} does not hold {len(missing)} group(s) of the lease, "
                f"e.g. {example!r:.160}"
            )
        return None


def _open_and_lock(client: StorageClient, reads: Sequence[GroupRead], timeout: float | None) -> ShmOpened:
    opened = client.shm_open(reads, timeout=timeout)
    client.shm_lock(opened)  # a read asks the server if the board does not vouch for the groups
    return opened


_KEY_TYPES = (("job_id", pa.string()), ("epoch", pa.int64()), ("group_id", pa.int64()))


def _set_keys(
    batch: pa.RecordBatch, values: Sequence[pa.Array], sample_ids: pa.Array | None
) -> pa.RecordBatch:
    """``batch`` with its key columns replaced by ``values`` (added in front, in key order, where missing),
    and its ``sample_id`` column by ``sample_ids`` where given."""
    for front, ((name, type_), column) in enumerate(zip(_KEY_TYPES, values, strict=True)):
        index = batch.schema.get_field_index(name)
        field = batch.schema.field(index) if index >= 0 else pa.field(name, type_, nullable=False)
        batch = (
            batch.set_column(index, field.with_type(type_), column)
            if index >= 0
            else batch.add_column(front, field, column)
        )
    if sample_ids is not None:
        index = batch.schema.get_field_index("sample_id")
        if index >= 0:
            batch = batch.set_column(index, batch.schema.field(index), sample_ids)
    return batch


def with_key(batch: pa.RecordBatch, key: Partition, *, default_ids: bool = False) -> pa.RecordBatch:
    """The group with its key columns set to ``key`` (a writer builds it before the controller names it).

    Other columns are not copied; the key columns are new arrays (the job's and epoch's are shared by the
    groups of one size, Arrow arrays being immutable). ``default_ids``: the group's sample ids were left
    to the writer (encoded under a placeholder key); they are set to the key's default ids
    ``"{job_id}/{epoch}/{group_id}/{sample_index}"``, so that they stay unique across groups.
    """
    rows = batch.num_rows
    job_col, epoch_col = _constant_keys(key.job_id, key.epoch, rows)
    group_col = pa.repeat(pa.scalar(key.group_id, pa.int64()), rows)
    ids = default_sample_ids(key.job_id, key.epoch, [key.group_id], [rows]) if default_ids else None
    return _set_keys(batch, [job_col, epoch_col, group_col], ids)


@functools.lru_cache(maxsize=64)
def _constant_keys(job_id: str, epoch: int, rows: int) -> tuple[pa.Array, pa.Array]:
    return pa.repeat(pa.scalar(job_id, pa.string()), rows), pa.repeat(pa.scalar(epoch, pa.int64()), rows)


def joined_with_keys(
    batches: Sequence[pa.RecordBatch],
    keys: Sequence[Partition],
    *,
    joined: pa.RecordBatch | None = None,
    default_ids: Sequence[bool] = (),
) -> pa.RecordBatch:
    """The groups as one batch (one copy, to join them), rows in order, key columns set per group.

    The key columns are built once for all groups (vectorised), not group by group. ``joined``: the
    batches already joined (their rows in order), used as it is: no copy. ``default_ids``, per group
    (none: all ``False``): as for :func:`with_key`.

    Raises:
        InvalidRequestError: the batches do not share one schema.
    """
    rows = np.fromiter((b.num_rows for b in batches), dtype=np.int64, count=len(batches))
    total = int(rows.sum())
    if joined is not None and joined.num_rows != total:
        raise InvalidRequestError(f"the joined batch has {joined.num_rows} rows, its groups {total}")
    if joined is None:
        try:
            joined = join_batches(batches)
        except pa.ArrowInvalid as exc:
            raise InvalidRequestError(
                f"the groups of one put_many must share one schema ({exc}); put groups of other schemas apart"
            ) from None
    job_ids = {k.job_id for k in keys}
    epochs = {k.epoch for k in keys}
    if len(job_ids) == 1 and len(epochs) == 1:
        job_col, epoch_col = _constant_keys(keys[0].job_id, keys[0].epoch, total)
    else:
        job_col = pa.array(np.repeat(np.array([k.job_id for k in keys], dtype=object), rows), pa.string())
        epoch_col = pa.array(np.repeat(np.array([k.epoch for k in keys], dtype=np.int64), rows))
    group_col = pa.array(np.repeat(np.array([k.group_id for k in keys], dtype=np.int64), rows))
    ids = None
    if any(default_ids):
        if all(default_ids) and len(job_ids) == 1 and len(epochs) == 1:
            ids = default_sample_ids(keys[0].job_id, keys[0].epoch, [k.group_id for k in keys], rows.tolist())
        else:
            given = joined.column("sample_id")
            starts = np.cumsum(rows) - rows
            ids = pa.concat_arrays(
                [
                    default_sample_ids(key.job_id, key.epoch, [key.group_id], [int(n)])
                    if default
                    else given.slice(int(start), int(n))
                    for key, n, start, default in zip(keys, rows, starts, default_ids, strict=True)
                ]
            )
    return _set_keys(joined, [job_col, epoch_col, group_col], ids)


def _by_location(handle: BatchHandle) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for g in handle.groups:
        out.setdefault(g.location, []).append(g)
    return out


def _lease_reads(groups: Sequence[Any]) -> list[GroupRead]:
    """Reads of leased groups, each under its lease generation."""
    return [GroupRead(Partition(*g.partition), LeaseToken(g.generation)) for g in groups]


def _reads_of(groups: Sequence[Any], opened: ShmOpened | None) -> Sequence[GroupRead]:
    """The reads of ``groups``: the very tuple ``opened`` was opened with when they are the same groups
    under the same generations (the client then skips its per-group checks), else new ones."""
    if opened is not None and len(opened.reads) == len(groups):
        same = all(
            r.key == g.partition and r.token is not None and r.token.generation == g.generation
            for r, g in zip(opened.reads, groups, strict=True)
        )
        if same:
            return opened.reads
    return _lease_reads(groups)


def _in_parallel_settled(calls: Sequence[Callable[[], T]], name: str) -> list[T | Exception]:
    """:func:`~trajflight.flight_server.run_parallel`, with each call's error in its place instead of
    raised."""

    def settle(call: Callable[[], T]) -> T | Exception:
        try:
            return call()
        except Exception as exc:  # handed back to the caller, which decides per server
            return exc

    return run_parallel([functools.partial(settle, call) for call in calls], name=name)


def read_handle(
    pool: StoragePool,
    handle: BatchHandle,
    *,
    timeout: float,
    opened: Mapping[str, ShmOpened] | None = None,
) -> pa.Table:
    """Read the handle's groups (projected to ``handle.columns``) from all their servers in parallel.

    ``opened`` is what :meth:`StoragePool.advance` returned for the lease, if this process made it: reads
    of servers on this host then need no ``shm_open`` call.

    Returns:
        One table, rows in the handle's group order (a handle without groups reads as a table without
        columns). Over Flight it owns its memory (received buffers); over shared memory it aliases
        read-only mappings of the servers' segments.

    Raises:
        StaleFenceError: the lease was superseded (a newer lease holds a group). NotFoundError: a group is
        gone. DeadlineExceededError, UnavailableError: the servers did not answer in time.
    """
    if not handle.groups:  # an empty shard (split into more shards than groups)
        return pa.table({})
    by_location = _by_location(handle)
    deadline = time.monotonic() + timeout

    def _one(location: str, reads: Sequence[GroupRead]) -> pa.Table:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceededError(f"read: deadline of {timeout:g}s passed before {location}")
        return pool.get(
            location,
            reads,
            columns=handle.columns,
            timeout=remaining,
            opened=None if opened is None else opened.get(location),
        )

    calls = [
        functools.partial(_one, loc, _reads_of(groups, None if opened is None else opened.get(loc)))
        for loc, groups in by_location.items()
    ]
    tables = run_parallel(calls, name="trajflight-get")
    if len(tables) == 1:
        return tables[0]
    # Put the groups back in the handle's order: slice each server's table by group.
    pieces: dict[tuple[Any, ...], pa.Table] = {}
    for groups, table in zip(by_location.values(), tables, strict=True):
        offset = 0
        for g in groups:
            pieces[tuple(g.partition)] = table.slice(offset, g.rows)
            offset += g.rows
    return pa.concat_tables([pieces[tuple(g.partition)] for g in handle.groups])
