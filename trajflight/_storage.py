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
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import pyarrow as pa

from trajflight._handles import BatchHandle
from trajflight.auth import Credential
from trajflight.controller import DeleteOutcome, DeleteWork, FenceWork, delete_failure
from trajflight.errors import (
    ConfigError,
    DeadlineExceededError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    StaleFenceError,
)
from trajflight.flight_server import (
    CredentialSource,
    GroupRead,
    LeaseToken,
    ShmOpened,
    StorageClient,
    TlsConfig,
    host_id,
    run_parallel,
)
from trajflight.keys import Partition

T = TypeVar("T")

DELETE_BATCH = 1024
"""Groups named in one ``delete`` call at most (a call's body stays well under the wire's bound)."""
_ITEM_REFUSALS = (StaleFenceError, PermissionDeniedError, InvalidRequestError)
"""Refusals of a ``delete`` that may concern one of its groups only (a stale token, a job outside the
token's scope, a malformed key): the server checked every group before deleting any, so the call is
split to find the groups refused; any other failure (the server down, a deadline) fails the whole call."""

__all__ = [
    "DELETE_BATCH",
    "TRANSPORTS",
    "StoragePool",
    "Transport",
    "check_tls_pair",
    "env_credential",
    "env_tls",
    "read_handle",
]

Transport = Literal["auto", "shm", "flight"]
TRANSPORTS: tuple[str, ...] = ("auto", "shm", "flight")


def check_tls_pair(tls: TlsConfig | None, client_tls: TlsConfig | None) -> None:
    """Refuse a data plane that serves TLS but whose own clients could not reach it.

    Raises:
        ConfigError: ``tls`` without ``client_tls``.
    """
    if tls is not None and client_tls is None:
        raise ConfigError(
            "tls without client_tls: the cluster's own clients need the CA of its servers' certificate "
            "(and a client certificate where tls demands one)",
            setting="client_tls",
        )


def env_tls() -> TlsConfig | None:
    """The client TLS material named by ``TRAJFLIGHT_TLS_CA`` / ``_CERT`` / ``_KEY`` (PEM file paths);
    None when none is set.

    Raises:
        ConfigError: a file cannot be read, or a certificate without its key.
    """
    ca, cert, key = (os.environ.get(f"TRAJFLIGHT_TLS_{n}") or None for n in ("CA", "CERT", "KEY"))
    if ca is None and cert is None:
        return None
    return TlsConfig.from_files(cert, key, ca)


def env_credential(token: Credential | str | None = None) -> Credential | None:
    """``token`` as a credential, else ``TRAJFLIGHT_TOKEN``'s, else None."""
    if isinstance(token, Credential):
        return token
    if token is None:
        token = os.environ.get("TRAJFLIGHT_TOKEN") or None
    return None if token is None else Credential(token)


class StoragePool:
    """One :class:`StorageClient` per server location, created on first use, shared across threads.

    Args:
        timeout: Default deadline of each storage call.
        transport: ``"auto"`` (shared memory with servers on this host, Flight otherwise), ``"shm"`` or
            ``"flight"`` (forced); see the module docstring.
        tls: TLS material for ``grpc+tls://`` servers.
        credential: The storage token of every call (a credential, or a callable asked per call: a
            refreshing token); None for a plane without a deployment secret.

    Raises:
        ConfigError: an unknown transport.
    """

    def __init__(
        self,
        *,
        timeout: float = 30.0,
        transport: Transport = "auto",
        tls: TlsConfig | None = None,
        credential: Credential | CredentialSource | None = None,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ConfigError(
                f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}", setting="transport"
            )
        self.timeout = timeout
        self.transport: Transport = transport
        self.tls = tls
        self.credential = credential
        self._clients: dict[str, StorageClient] = {}
        self._routes: dict[str, bool] = {}  # location -> uses shared memory
        self._lock = threading.Lock()

    def client(self, location: str) -> StorageClient:
        """The (cached) client of the server at ``location``."""
        with self._lock:
            found = self._clients.get(location)
            if found is None:
                found = self._clients[location] = StorageClient(
                    location,
                    timeout=self.timeout,
                    tls=self.tls if location.startswith("grpc+tls://") else None,
                    credential=self.credential,
                )
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

    def put_groups(
        self,
        location: str,
        groups: Sequence[tuple[Partition, pa.RecordBatch]],
        *,
        writer: str,
        timeout: float,
        joined: pa.RecordBatch | None = None,
    ) -> None:
        """Put groups, already keyed under their partitions, on one server in one call, published
        together: through shared memory as one contiguous segment (read back in order with no copy), or
        as one Flight stream. One group is a list of one.

        ``joined``: the groups' rows already joined in one batch, in order (the joined batch of the
        :class:`~trajflight.codec.EncodedGroups` the groups are slices of); the shared-memory path then
        writes it as it is, with no copy to join them.

        Raises:
            Like :meth:`StorageClient.put_groups` and :meth:`StorageClient.shm_put_groups`;
            InvalidRequestError: ``joined`` does not hold the groups' rows.
        """
        if joined is not None:
            rows = sum(batch.num_rows for _, batch in groups)
            if joined.num_rows != rows:
                raise InvalidRequestError(f"the joined batch has {joined.num_rows} rows, its groups {rows}")
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
        self.client(work.location).delete(_delete_reads([work]))

    def delete_groups(self, work: Sequence[DeleteWork]) -> list[DeleteOutcome]:
        """Carry out many deletes of the controller's GC list in as few calls as it can: one ``delete``
        action per server for up to :data:`DELETE_BATCH` groups (the servers called at once); over the
        same-host socket once this pool has chosen shared memory for the server (as every action of its
        clients), else Flight.

        The server checks every group of a call before it deletes any. A refusal that may concern one
        group (a stale token: :data:`_ITEM_REFUSALS`) splits the call in halves, again and again, so
        that only the refused groups fail; a failure of the call itself (the server down, a deadline)
        fails each of its groups. A group the server no longer has counts as deleted.

        Returns:
            ``(work, ok, error)`` per item, in ``work``'s order (``error``: ``"Type: message"`` of a
            failed one, as :func:`~trajflight.controller.run_deletes` reports). Never raises.
        """
        at: dict[str, list[int]] = {}  # location -> positions in work
        for i, w in enumerate(work):
            at.setdefault(w.location, []).append(i)
        slices = [p[i : i + DELETE_BATCH] for p in at.values() for i in range(0, len(p), DELETE_BATCH)]
        calls = [functools.partial(self._delete_split, [work[i] for i in s]) for s in slices]
        out: list[DeleteOutcome] = [(w, False, None) for w in work]  # every position is set below
        for positions, done in zip(slices, run_parallel(calls), strict=True):
            for i, outcome in zip(positions, done, strict=True):
                out[i] = outcome
        return out

    def _delete_split(self, work: Sequence[DeleteWork]) -> list[DeleteOutcome]:
        """Delete ``work`` (one location) in one call, or in halves when the call is refused (see
        :meth:`delete_groups`); never raises."""
        try:
            self.client(work[0].location).delete(_delete_reads(work))
        except _ITEM_REFUSALS as exc:
            if len(work) == 1:
                return [(work[0], False, delete_failure(exc))]
            half = len(work) // 2
            return self._delete_split(work[:half]) + self._delete_split(work[half:])
        except Exception as exc:  # the call failed as a whole: every group stays on the GC list
            text = delete_failure(exc)
            return [(w, False, text) for w in work]
        return [(w, True, None) for w in work]

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
        results = _in_parallel_settled(calls)
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


def _delete_reads(work: Sequence[DeleteWork]) -> list[GroupRead]:
    """The ``delete`` action's reads of GC work items, each under its token."""
    return [GroupRead(Partition(*w.partition), LeaseToken(w.token)) for w in work]


def _open_and_lock(client: StorageClient, reads: Sequence[GroupRead], timeout: float | None) -> ShmOpened:
    opened = client.shm_open(reads, timeout=timeout)
    client.shm_lock(opened)  # a read asks the server if the board does not vouch for the groups
    return opened


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


def _in_parallel_settled(calls: Sequence[Callable[[], T]]) -> list[T | Exception]:
    """:func:`~trajflight.flight_server.run_parallel`, with each call's error in its place instead of
    raised."""

    def settle(call: Callable[[], T]) -> T | Exception:
        try:
            return call()
        except Exception as exc:  # handed back to the caller, which decides per server
            return exc

    return run_parallel([functools.partial(settle, call) for call in calls])


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
    tables = run_parallel(calls)
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
