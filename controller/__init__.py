"""trajflight.controller: the ledger of partitions and fenced leases, and the hosts that run it.

* :class:`Ledger` — the sans-IO state machine (time passed in as ``now``): jobs and epochs, placement and
  capacity, put grants, fenced leases ``READY -> LEASED -> PREPARED -> TRAINING -> TRAINED ->
  COMMITTED`` (+ ``UNKNOWN``), pipeline stages, policy versions, the GC and fence lists, checkpoints.
* :class:`LocalController` — hosts it in this process (thread-safe, sweeper thread, optional journal).
* :func:`start_ray_controller` / :func:`connect_ray` — host it in a named async Ray actor.
* :class:`ControllerClient` — the same operations for both hosts, every call under a deadline.
* :data:`COMMANDS` — every operation declared once, as a frozen dataclass tagged with its :class:`Kind`
  (mutating, timed, query) and :class:`Route` (client call, own host method, host only): the hosts'
  dispatch and journal, the client, the Ray actor and the Flight allowlist (:data:`CALLS`) derive from it.
* :func:`encode_message` / :func:`decode_message` — the typed JSON of controller values (never pickle),
  what the journal records and the Flight control plane carries.

Ray is imported only when a Ray host or client is used.
"""

from __future__ import annotations

from ._checkpoint import checkpoint_seq
from ._client import ControllerClient, connect_ray, start_ray_controller
from ._commands import CALLS, COMMANDS, ROLES, Command, Kind, Route, client_call
from ._durable import BatchDeleter, DeleteOutcome, GroupDeletes, delete_failure, run_deletes
from ._entries import check_seconds
from ._files import read_file as read_checkpoint
from ._files import write_atomic as write_checkpoint
from ._host import LocalController, check_timeout
from ._ledger import Ledger
from ._metrics import ControllerMetrics
from ._ray_host import DEFAULT_NAME, import_ray, start_ray_actor
from ._records import (
    DeleteWork,
    FenceWork,
    GroupInfo,
    GroupState,
    HeldGroup,
    JobConfig,
    Lease,
    LostGroup,
    OldReady,
    Partition,
    PolicyStatus,
    Publication,
    Published,
    PutGrant,
    ResolveAction,
    ServerInfo,
)
from ._transports import LocalTransport, RayTransport
from ._values import dumps as encode_message
from ._values import loads as decode_message

__all__ = [
    "CALLS",
    "COMMANDS",
    "DEFAULT_NAME",
    "ROLES",
    "BatchDeleter",
    "Command",
    "ControllerClient",
    "ControllerMetrics",
    "DeleteOutcome",
    "DeleteWork",
    "FenceWork",
    "GroupDeletes",
    "GroupInfo",
    "GroupState",
    "HeldGroup",
    "JobConfig",
    "Kind",
    "Lease",
    "Ledger",
    "LocalController",
    "LocalTransport",
    "LostGroup",
    "OldReady",
    "Partition",
    "PolicyStatus",
    "Publication",
    "Published",
    "PutGrant",
    "RayTransport",
    "ResolveAction",
    "Route",
    "ServerInfo",
    "check_seconds",
    "check_timeout",
    "checkpoint_seq",
    "client_call",
    "connect_ray",
    "decode_message",
    "delete_failure",
    "encode_message",
    "import_ray",
    "read_checkpoint",
    "run_deletes",
    "start_ray_actor",
    "start_ray_controller",
    "write_checkpoint",
]
