"""The names of the systems ``trajflight bench`` runs, in table order (standard library only, so that the
command line can list them without importing the systems)."""

from __future__ import annotations

__all__ = ["SYSTEMS"]

SYSTEMS: tuple[str, ...] = (
    "memcpy",
    "shm-ceiling",
    "flight",
    "flight-per-group",
    "trajflight",
    "trajflight-flight",
    "ray",
    "ray-per-group",
    "transferqueue",
)
