"""trajflight: RL post-training trajectories as Arrow, over Flight, under fenced leases.

``import trajflight`` starts nothing and imports no optional dependency: the public names below are
resolved lazily on first use, so the subpackages (``trajflight.codec``, ``trajflight.controller``,
``trajflight.flight_server``) can be imported alone.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> module that defines it
_LAZY = {
    "STANDARD_SCHEMA": "trajflight.codec",
    "TrajectorySchema": "trajflight.codec",
    "encode_group": "trajflight.codec",
    "decode": "trajflight.codec",
    "decode_numpy": "trajflight.codec",
    "validate_group": "trajflight.codec",
    "TrajflightError": "trajflight.errors",
    "connect": "trajflight._client",
    "Client": "trajflight._client",
    "Writer": "trajflight._writer",
    "Trainer": "trajflight._trainer",
    "LocalCluster": "trajflight._cluster",
    "RayCluster": "trajflight._ray_plane",  # imports ray only when a plane starts or connects
    "LeasedBatch": "trajflight._lease",
    "fetch": "trajflight._lease",
    "fetch_table": "trajflight._lease",
    "BatchHandle": "trajflight._handles",
    "GroupInfo": "trajflight.controller",
    "Partition": "trajflight.keys",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trajflight' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
