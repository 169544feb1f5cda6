"""The storage servers the ledger places groups on: registration, placement, and what each one holds.

A server's ``used_bytes``/``used_groups`` count what is reserved or stored on it until a delete is
confirmed; :class:`~._groups.Groups` charges and refunds them together with the job's counters. Placement
prefers a server on the writer's node with room, then the least loaded by bytes (ties by id); a batch
of groups is placed so as a whole where one server has room for all of it (see ``Grants.allocate_many``).

It does not know whether a server is reachable (:mod:`._reach` keeps that) nor check anything on it.
"""

from __future__ import annotations

from typing import Any

from ._entries import _Server
from ._records import ServerInfo

__all__ = ["Servers"]


class Servers:
    """The registered storage servers, by id."""

    __slots__ = ("by_id",)

    def __init__(self) -> None:
        self.by_id: dict[str, _Server] = {}
        """Every registered server by id: read it freely; add and update servers with the methods below."""

    def register(
        self, server_id: str, node: str, location: str, capacity_bytes: int, capacity_groups: int
    ) -> tuple[_Server, bool]:
        """Add a server, or update the node, location and capacities of a known one (keeping what is
        reserved on it). Arguments are checked by the caller. Returns the server and whether it was known.
        """
        server = self.by_id.get(server_id)
        if server is None:
            server = self.by_id[server_id] = _Server(
                server_id, node, location, capacity_bytes, capacity_groups
            )
            return server, False
        server.node, server.location = node, location
        server.capacity_bytes, server.capacity_groups = capacity_bytes, capacity_groups
        return server, True

    def infos(self) -> tuple[ServerInfo, ...]:
        """Every server with its reservations, sorted by id."""
        return tuple(self.by_id[s].info() for s in sorted(self.by_id))

    def place(self, node: str, nbytes: int, groups: int = 1) -> _Server | None:
        """The server ``groups`` groups of ``nbytes`` in all from a writer on ``node`` go to together, or
        ``None`` (no server has room for all of them)."""
        best: _Server | None = None
        best_rank: tuple[bool, int, str] | None = None
        for server in self.by_id.values():
            if (
                server.used_bytes + nbytes > server.capacity_bytes
                or server.used_groups + groups > server.capacity_groups
            ):
                continue
            rank = (server.node != node, server.used_bytes, server.server_id)
            if best_rank is None or rank < best_rank:
                best, best_rank = server, rank
        return best

    # ------------------------------------------------------------------ checkpoints and snapshots
    def export(self, only: set[str] | None = None) -> list[list[Any]]:
        """Rows ``[server_id, node, location, capacity_bytes, capacity_groups]`` (of ``only``, or all);
        reservations are not exported: they are counted again from the groups."""
        return [
            [s.server_id, s.node, s.location, s.capacity_bytes, s.capacity_groups]
            for s in self.by_id.values()
            if only is None or s.server_id in only
        ]

    def load(self, rows: list[list[Any]] | list[tuple[str, str, str, int, int]]) -> None:
        """Add the servers of exported ``rows`` that are not registered (a registered one stays as it is)."""
        for server_id, node, location, cap_b, cap_g in rows:
            if server_id not in self.by_id:
                self.by_id[server_id] = _Server(server_id, node, location, cap_b, cap_g)
