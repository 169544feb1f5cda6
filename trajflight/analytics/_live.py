"""Reading live groups from a running data plane for analysis: no lease taken, no state changed.

The controller names the storage servers; each server lists the job's groups (``list_flights``) and
streams them (``do_get``) projected on the server. Every read is a *tokenless* ticket, which a storage
server serves without fencing: it neither checks nor raises any lease generation, touches no lease and
no capacity (only its ``groups_read``/``bytes_read`` statistics count it). The controller is asked only
for its servers (a query), never to acquire, renew or release.

What it does not guarantee: a consistent snapshot. Each chunk of groups is read as it is stored when the
chunk is read; a group committed (deleted) between the listing and its read is skipped, and a group put
after the listing is not seen.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from trajflight._storage import env_credential, env_tls
from trajflight.errors import (
    DeadlineExceededError,
    NotFoundError,
    TrajflightError,
    UnavailableError,
    brief,
)
from trajflight.flight_server import GroupListing, StorageClient
from trajflight.keys import Partition

__all__ = ["LiveSource"]

# Groups read per do_get: bounds one stream's memory, and one vanished group costs one re-read of this many.
CHUNK_GROUPS = 256
CHUNK_BYTES = 256 << 20
_RETRIES = 3


@dataclass(frozen=True, slots=True)
class _Server:
    location: str
    groups: tuple[GroupListing, ...]


def _chunks(groups: Sequence[GroupListing]) -> Iterator[list[GroupListing]]:
    chunk: list[GroupListing] = []
    size = 0
    for g in groups:
        # One job per stream: a server refuses to join groups of jobs whose column types differ.
        full = len(chunk) >= CHUNK_GROUPS or size + g.nbytes > CHUNK_BYTES
        if chunk and (full or g.key.job_id != chunk[0].key.job_id):
            yield chunk
            chunk, size = [], 0
        chunk.append(g)
        size += g.nbytes
    if chunk:
        yield chunk


class LiveSource:
    """The live groups of a data plane at ``address`` (``grpc://`` or ``ray://``), read without a lease.

    Args:
        address: What ``trajflight.connect`` takes.
        job: Only this job's groups (None: every job).
        epochs: Only these epochs (None: every epoch).
        timeout: Deadline of each call, seconds.
    """

    def __init__(
        self, address: str, *, job: str | None, epochs: frozenset[int] | None, timeout: float
    ) -> None:
        self.address = address
        self.job = job
        self.epochs = epochs
        self.timeout = timeout
        self._servers: list[_Server] | None = None
        self.read_keys: set[Partition] = set()  # the groups the last ``tables`` read (for archive dedup)

    def refresh(self) -> None:
        """Forget the listing: the next read lists the servers again."""
        self._servers = None

    def _unreachable(self, exc: TrajflightError) -> UnavailableError:
        return UnavailableError(
            f"the data plane at {brief(self.address)} could not be reached ({type(exc).__name__}: "
            f"{str(exc)[:200]}); check that it runs (`trajflight up` prints its address) and the address"
        )

    def _storage(self, location: str) -> StorageClient:
        # A plane with a secret: this process's own credential (a reader's, TRAJFLIGHT_TOKEN) and TLS
        # files (TRAJFLIGHT_TLS_*), as trajflight.fetch does in a process that was handed a handle.
        tls = env_tls() if location.startswith("grpc+tls://") else None
        return StorageClient(location, timeout=self.timeout, tls=tls, credential=env_credential())

    def servers(self) -> list[_Server]:
        """List the matching groups on every storage server (once per source; sorted by key)."""
        if self._servers is not None:
            return self._servers
        import trajflight

        try:
            with trajflight.connect(self.address, timeout=self.timeout, transport="flight") as client:
                servers = client.controller.servers()
        except (UnavailableError, DeadlineExceededError) as exc:
            raise self._unreachable(exc) from exc
        out = []
        for server in servers:
            try:
                with self._storage(server.location) as storage:
                    listed = storage.list_groups(self.job)
            except (UnavailableError, DeadlineExceededError) as exc:
                raise UnavailableError(
                    f"storage server {brief(server.server_id)} at {server.location} could not be listed "
                    f"({type(exc).__name__}); the scan needs every server of the data plane"
                ) from exc
            groups = tuple(g for g in listed if self.epochs is None or g.key.epoch in self.epochs)
            out.append(_Server(server.location, groups))
        self._servers = out
        return out

    def schema(self) -> pa.Schema:
        """The stored columns of the matching groups, unified (a column some groups lack is nullable)."""
        schemas: list[pa.Schema] = []
        for server in self.servers():
            for g in server.groups:
                if not any(g.schema.equals(s) for s in schemas):
                    schemas.append(g.schema)
        if not schemas:
            return pa.schema([])
        return pa.unify_schemas([s.remove_metadata() for s in schemas], promote_options="permissive")

    def tables(self, columns: Sequence[str] | None) -> Iterator[pa.Table]:
        """The matching groups' rows, projected to ``columns`` on the servers (None: every column), one
        table per chunk of groups; a group lacking a projected column reads it as null (the table lacks
        it), and a group deleted since the listing is skipped.

        Raises:
            UnavailableError, DeadlineExceededError: a server broke off; TrajflightError: it refused.
        """
        self.read_keys = set()
        for server in self.servers():
            if not server.groups:
                continue
            with self._storage(server.location) as storage:
                for chunk in _chunks(server.groups):
                    # Groups with appended columns differ: read each projection's groups together.
                    by_projection: dict[tuple[str, ...] | None, list[Partition]] = {}
                    for g in chunk:
                        names = g.schema.names
                        have = None if columns is None else tuple(c for c in columns if c in names)
                        if have == ():
                            have = ("group_id",)  # only the row count is needed
                        by_projection.setdefault(have, []).append(g.key)
                    for projection, keys in by_projection.items():
                        table = self._read(storage, keys, projection)
                        if table is not None and table.num_rows:
                            yield table

    def _read(
        self, storage: StorageClient, keys: list[Partition], columns: tuple[str, ...] | None
    ) -> pa.Table | None:
        """Read ``keys`` in one stream; on ``not_found`` (a group committed meanwhile) re-list and read
        the ones still stored."""
        wanted: list[Partition] = list(keys)
        for attempt in range(_RETRIES + 1):
            try:
                table = storage.get(wanted, columns=columns)
            except NotFoundError:
                if attempt == _RETRIES:
                    raise
                still = {g.key for g in storage.list_groups(wanted[0].job_id)}
                wanted = [k for k in wanted if k in still]
                if not wanted:
                    return None
                continue
            self.read_keys.update(wanted)
            return table
        return None
