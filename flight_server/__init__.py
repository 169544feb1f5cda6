"""trajflight.flight_server: the Arrow Flight storage server and its low-level client.

* :class:`StorageServer` keeps trajectory groups as Arrow buffers in memory, publishes each put
  atomically, streams projected groups from C++, enforces epoch fences and lease generations itself, and
  bounds capacity in bytes and groups.
* :class:`StorageClient` puts, appends, reads, deletes and fences, every call with a deadline;
  :func:`get_parallel` reads from several servers at once.
* :class:`ShmArena` is a server's shared-memory arena: same-node writers write groups straight into its
  segments (:meth:`StorageClient.shm_put_groups`) and same-node readers map them with no copy
  (:meth:`StorageClient.shm_get`); :func:`host_id` is what decides "same node".
* The wire records (:class:`PutDescriptor`, :class:`GetTicket`, ...) are documented in
  ``docs/wire-format.md``; any plain ``pyarrow.flight`` client can list and read stored groups.
"""

from __future__ import annotations

from trajflight.flight_server._client import GroupInfo, ShmOpened, StorageClient, get_parallel
from trajflight.flight_server._errors import WIRE_ERRORS, server_errors, translate_errors
from trajflight.flight_server._segments import join_batches
from trajflight.flight_server._server import ACTIONS, StorageServer
from trajflight.flight_server._store import StoreLimits
from trajflight.flight_server._wire import (
    WIRE_VERSION,
    GetTicket,
    GroupRead,
    LeaseToken,
    ListCriteria,
    PutDescriptor,
    TokenSigner,
)
from trajflight.flight_server.shm._arena import ShmArena, host_id
from trajflight.flight_server.shm._sweep import sweep_dead_arenas

__all__ = [
    "ACTIONS",
    "WIRE_ERRORS",
    "WIRE_VERSION",
    "GetTicket",
    "GroupInfo",
    "GroupRead",
    "LeaseToken",
    "ListCriteria",
    "PutDescriptor",
    "ShmArena",
    "ShmOpened",
    "StorageClient",
    "StorageServer",
    "StoreLimits",
    "TokenSigner",
    "get_parallel",
    "host_id",
    "join_batches",
    "server_errors",
    "sweep_dead_arenas",
    "translate_errors",
]
