"""trajflight.controller: the ledger of partitions and fenced leases, and the hosts that run it.

The :class:`Ledger` is a sans-IO state machine (time passed in as ``now``); :class:`LocalController`
hosts it in-process with a sweeper thread, :func:`start_ray_controller` inside a named Ray actor; a
:class:`ControllerClient` talks to either with the same methods, each under a deadline.

Ray is imported only when a Ray host or client is used.
"""

from __future__ import annotations

from ._checkpoint import read_file as read_checkpoint
from ._checkpoint import write_atomic as write_checkpoint
from ._ledger import Ledger
from ._records import (
    DeleteWork,
    GroupInfo,
    GroupState,
    JobConfig,
    Lease,
    OldReady,
    Partition,
    PolicyStatus,
    PutGrant,
    ResolveAction,
    ServerInfo,
)

__all__ = [
    "DeleteWork",
    "GroupInfo",
    "GroupState",
    "JobConfig",
    "Lease",
    "Ledger",
    "OldReady",
    "Partition",
    "PolicyStatus",
    "PutGrant",
    "ResolveAction",
    "ServerInfo",
    "read_checkpoint",
    "write_checkpoint",
]
