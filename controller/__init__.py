"""trajflight.controller: the ledger of partitions and fenced leases, and the hosts that run it.

* :class:`Ledger` — the sans-IO state machine (time passed in as ``now``): jobs and epochs, placement and
  capacity, put grants, fenced leases ``READY -> LEASED -> PREPARED -> TRAINING -> TRAINED ->
  COMMITTED`` (+ ``UNKNOWN``), pipeline stages, policy versions, the GC and fence lists, checkpoints.
* :class:`LocalController` — hosts it in this process (thread-safe, sweeper thread, optional journal).
* :func:`start_ray_controller` / :func:`connect_ray` — host it in a named async Ray actor.
* :class:`ControllerClient` — the same operations for both hosts, every call under a deadline.

Ray is imported only when a Ray host or client is used.
"""

from __future__ import annotations

from ._checkpoint import checkpoint_seq
from ._client import (
    ControllerClient,
    LocalTransport,
    RayTransport,
    connect_ray,
    import_ray,
    start_ray_controller,
)
from ._entries import check_seconds
from ._files import read_file as read_checkpoint
from ._files import write_atomic as write_checkpoint
from ._host import LocalController, check_timeout
from ._ledger import Ledger
from ._ray_host import DEFAULT_NAME, start_ray_actor
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
    PutGrant,
    ResolveAction,
    ServerInfo,
)

__all__ = [
    "DEFAULT_NAME",
    "ControllerClient",
    "DeleteWork",
    "FenceWork",
    "GroupInfo",
    "GroupState",
    "HeldGroup",
    "JobConfig",
    "Lease",
    "Ledger",
    "LocalController",
    "LocalTransport",
    "LostGroup",
    "OldReady",
    "Partition",
    "PolicyStatus",
    "Publication",
    "PutGrant",
    "RayTransport",
    "ResolveAction",
    "ServerInfo",
    "check_seconds",
    "check_timeout",
    "checkpoint_seq",
    "connect_ray",
    "import_ray",
    "read_checkpoint",
    "start_ray_actor",
    "start_ray_controller",
    "write_checkpoint",
]
