"""What the objects of one connection share: :class:`Session` (controller, storage pool, renewals, deadline).

A :class:`~trajflight._client.Client` makes one session and hands it to every writer, trainer and lease
it makes, so that they reach the controller and the storage servers without knowing the client (the
client owns the session; nothing below it imports the client).

It holds no state of its own and guarantees nothing once the client is closed: its collaborators are
closed with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from trajflight._renewals import Renewals
from trajflight._storage import StoragePool
from trajflight.controller import ControllerClient

__all__ = ["Session"]


@dataclass(frozen=True, slots=True)
class Session:
    """The collaborators of one connection to a data plane.

    Attributes:
        controller: The controller client (any host).
        storage: The pool of storage-server connections (shared memory or Flight per server).
        renewals: The thread that renews the connection's held leases.
        timeout: Default deadline of every call, seconds.
    """

    controller: ControllerClient
    storage: StoragePool
    renewals: Renewals
    timeout: float
