"""trajflight.flight_server.shm: the same-host wing of the storage server (shared memory, a Unix socket).

* ``_segment``: a segment file (one Arrow IPC stream at offset 0, on tmpfs), its mappings and writes.
* ``_arena``: the server's arena of pre-faulted, size-classed, reused segments and slabs
  (:class:`ShmArena`); ``_sweep`` removes the arenas killed servers left behind.
* ``_fences``: the fence board, the lease generations readers check without a call.
* ``_store``: the group store's collaborator that places parts in the arena and admits, validates and
  publishes same-host puts (:class:`ShmStore`).
* ``_local``: the Unix-socket channel for actions (and small puts) between same-host clients and server.
* ``_writer``, ``_reader``, ``_client``: the client's side: writing segments, the mappings of opened
  groups (:class:`ShmOpened`), and the put and read routes (:class:`ShmClient`).

Above the wire records and the store's records, below the store, server and client that compose it. It
guarantees nothing across machines: "same host" is :func:`host_id` and a visible arena directory.
"""

from __future__ import annotations

from trajflight.flight_server.shm._arena import ShmArena, host_id
from trajflight.flight_server.shm._client import INLINE_PUT_BYTES, ShmClient
from trajflight.flight_server.shm._local import LocalChannel, LocalChannelServer
from trajflight.flight_server.shm._reader import ShmOpened
from trajflight.flight_server.shm._store import ShmStore
from trajflight.flight_server.shm._sweep import remove_dead_arena, sweep_dead_arenas

__all__ = [
    "INLINE_PUT_BYTES",
    "LocalChannel",
    "LocalChannelServer",
    "ShmArena",
    "ShmClient",
    "ShmOpened",
    "ShmStore",
    "host_id",
    "remove_dead_arena",
    "sweep_dead_arenas",
]
