"""Data movement of the public client: a pool of storage connections, reads of handles, fences.

Reads of a :class:`~trajflight._handles.BatchHandle` go to every storage server involved at once (one
Flight stream per server on its own thread, :func:`trajflight.flight_server.get_parallel`), each group
under the lease's token, and come back as one table in the handle's group order.

It does not retry: a failed read raises the server's typed error, and nothing was changed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from trajflight._handles import BatchHandle
from trajflight.codec import GroupKey
from trajflight.controller import DeleteWork
from trajflight.flight_server import GroupRead, LeaseToken, StorageClient, get_parallel

__all__ = ["StoragePool", "read_handle"]


class StoragePool:
    """One :class:`StorageClient` per server location, created on first use, shared across threads.

    Args:
        timeout: Default deadline of each storage call.
    """

    def __init__(self, *, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._clients: dict[str, StorageClient] = {}
        self._lock = threading.Lock()

    def client(self, location: str) -> StorageClient:
        """The (cached) client of the server at ``location``."""
        with self._lock:
            found = self._clients.get(location)
            if found is None:
                found = self._clients[location] = StorageClient(location, timeout=self.timeout)
            return found

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
        read = GroupRead(GroupKey(*work.partition), LeaseToken(work.token))
        self.client(work.location).delete([read])

    def fence(self, locations: Iterable[str], job_id: str, min_epoch: int) -> None:
        """Tell every server to refuse puts and leases of ``job_id`` under epochs below ``min_epoch``."""
        for location in sorted(set(locations)):
            self.client(location).fence(job_id, min_epoch)

    def advance(self, handle: BatchHandle) -> None:
        """Raise the servers' highest generation of the handle's groups to the lease's tokens.

        After this, a zombie holding an older lease on these groups is refused by the servers even for
        reads and appends it makes before the new holder's first read.
        """
        by_location = _by_location(handle)
        requests = [
            (self.client(loc), [GroupRead(GroupKey(*g.partition), LeaseToken(g.generation)) for g in groups])
            for loc, groups in by_location.items()
        ]
        if len(requests) == 1:
            client, reads = requests[0]
            client.advance_generation(reads)
            return
        with ThreadPoolExecutor(len(requests)) as pool:
            for future in [pool.submit(c.advance_generation, r) for c, r in requests]:
                future.result()


def _by_location(handle: BatchHandle) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for g in handle.groups:
        out.setdefault(g.location, []).append(g)
    return out


def read_handle(pool: StoragePool, handle: BatchHandle, *, timeout: float) -> pa.Table:
    """Read the handle's groups (projected to ``handle.columns``) from all their servers in parallel.

    Returns:
        One table, rows in the handle's group order; it owns its memory (received buffers).

    Raises:
        StaleFenceError: the lease was superseded (a newer lease holds a group). NotFoundError: a group is
        gone. DeadlineExceededError, UnavailableError: the servers did not answer in time.
    """
    by_location = _by_location(handle)
    requests: list[tuple[StorageClient, Sequence[GroupRead]]] = [
        (pool.client(loc), [GroupRead(GroupKey(*g.partition), LeaseToken(g.generation)) for g in groups])
        for loc, groups in by_location.items()
    ]
    tables = get_parallel(requests, columns=handle.columns, timeout=timeout)
    if len(tables) == 1:
        return tables[0]
    # Put the groups back in the handle's order: slice each server's table by group.
    pieces: dict[tuple[Any, ...], pa.Table] = {}
    for groups, table in zip(by_location.values(), tables, strict=True):
        offset = 0
        for g in groups:
            pieces[tuple(g.partition)] = table.slice(offset, g.rows)
            offset += g.rows
    ordered = [pieces[tuple(g.partition)] for g in handle.groups]
    return pa.concat_tables(ordered) if ordered else tables[0].slice(0, 0)
