"""trajflight.flight_server: the Arrow Flight storage server and its low-level client.

* :class:`StorageServer` keeps trajectory groups as Arrow buffers in memory, publishes each put
  atomically, streams projected groups from C++, enforces epoch fences and lease generations itself, and
  bounds capacity in bytes and groups.
* :class:`StorageClient` puts, appends, reads, deletes and fences, every call with a deadline; one route
  per transport: :meth:`~StorageClient.put_groups` and :meth:`~StorageClient.get` over Flight,
  :meth:`~StorageClient.shm_put_groups` and :meth:`~StorageClient.shm_get` through shared memory.
  :func:`get_parallel` reads from several servers at once (:func:`run_parallel` runs any calls so).
* The same-host wing lives in :mod:`trajflight.flight_server.shm`: :class:`ShmArena` is a server's
  shared-memory arena, whose segments same-host writers fill and same-host readers map with no copy;
  :func:`host_id` is what decides "same host". :class:`LocalChannelServer` and :class:`LocalChannel`
  carry a server's actions over a same-host Unix socket (the controller's endpoint uses them too).
* Authentication (``docs/auth.md``): with a keyring every call needs a bearer token; :data:`ROLES` is
  the role of each operation; :func:`auth_middleware`, :func:`call_claims` and :func:`check_bind` serve
  every Flight endpoint of the plane (the controller's too).
* The wire records (:class:`PutDescriptor`, :class:`GetTicket`, ...) are documented in
  ``docs/wire-format.md``; any plain ``pyarrow.flight`` client can list and read stored groups.

Layers inside: the wire (``_wire*``, ``_errors``) and Arrow IPC streams (``_segments``) at the bottom, the
store's records (``_store_records``) and tombstones above them, then ``shm/``, then the store, the server,
the client and the CLI. It imports only :mod:`trajflight.codec` and the base (``errors``, ``units``,
``keys``).
"""

from __future__ import annotations

from trajflight.flight_server._auth import (
    CredentialSource,
    call_claims,
    call_headers,
    check_bind,
    credential_source,
)
from trajflight.flight_server._auth import server_middleware as auth_middleware
from trajflight.flight_server._client import (
    GroupListing,
    ShmOpened,
    StorageClient,
    get_parallel,
    run_parallel,
)
from trajflight.flight_server._errors import WIRE_ERRORS, server_errors, translate_errors
from trajflight.flight_server._metrics import MetricsEndpoint, ServerMetrics
from trajflight.flight_server._segments import join_batches
from trajflight.flight_server._server import ACTIONS, FLIGHT_METHODS, ROLES, StorageServer
from trajflight.flight_server._store import StoreLimits
from trajflight.flight_server._tls import TlsConfig
from trajflight.flight_server._tls import client_kwargs as tls_client_kwargs
from trajflight.flight_server._tls import scheme as tls_scheme
from trajflight.flight_server._wire import (
    WIRE_VERSION,
    GetTicket,
    GroupRead,
    LeaseToken,
    ListCriteria,
    PutDescriptor,
)
from trajflight.flight_server.shm import (
    LocalChannel,
    LocalChannelServer,
    ShmArena,
    host_id,
    remove_dead_arena,
    sweep_dead_arenas,
)

__all__ = [
    "ACTIONS",
    "FLIGHT_METHODS",
    "ROLES",
    "WIRE_ERRORS",
    "WIRE_VERSION",
    "CredentialSource",
    "GetTicket",
    "GroupListing",
    "GroupRead",
    "LeaseToken",
    "ListCriteria",
    "LocalChannel",
    "LocalChannelServer",
    "MetricsEndpoint",
    "PutDescriptor",
    "ServerMetrics",
    "ShmArena",
    "ShmOpened",
    "StorageClient",
    "StorageServer",
    "StoreLimits",
    "TlsConfig",
    "auth_middleware",
    "call_claims",
    "call_headers",
    "check_bind",
    "credential_source",
    "get_parallel",
    "host_id",
    "join_batches",
    "remove_dead_arena",
    "run_parallel",
    "server_errors",
    "sweep_dead_arenas",
    "tls_client_kwargs",
    "tls_scheme",
    "translate_errors",
]
