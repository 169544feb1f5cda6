"""The collaborators one ledger is made of, wired together, as one value.

:class:`~._ledger.Ledger` is a thin surface over these; checkpoints, snapshots (:mod:`._checkpoint`),
restores (:mod:`._restore`), epochs (:mod:`._epochs`), crash recovery (:mod:`._recovery`) and the views
across them (:mod:`._views`) work on them through their public methods. Each owns its state:

* :class:`~._tokens.Tokens` — the fencing token counter;
* :class:`~._servers.Servers` — storage servers, placement, what each holds;
* :class:`~._jobs.Jobs` — jobs, epochs, writers, policy versions;
* :class:`~._groups.Groups` — the group table and every change of a group's state;
* :class:`~._upkeep.Upkeep` — deletes and fences for the host to run, servers in back-off;
* :class:`~._grants.Grants` — put grants and publishing;
* :class:`~._leases.Leases` — the lease state machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._grants import Grants
from ._groups import Groups
from ._jobs import Jobs
from ._leases import Leases
from ._servers import Servers
from ._tokens import Tokens
from ._upkeep import Upkeep

__all__ = ["Parts"]


@dataclass(frozen=True, slots=True)
class Parts:
    """The collaborators of one ledger (build them with :meth:`create`)."""

    tokens: Tokens
    servers: Servers
    jobs: Jobs
    groups: Groups
    upkeep: Upkeep
    grants: Grants
    leases: Leases

    @classmethod
    def create(cls, incarnation: int) -> Parts:
        """Empty collaborators, wired to each other; tokens start at ``incarnation << 32``."""
        tokens = Tokens(incarnation)
        servers = Servers()
        jobs = Jobs()
        groups = Groups(jobs, servers)
        upkeep = Upkeep(jobs, servers, groups)
        grants = Grants(jobs, servers, groups, tokens)
        leases = Leases(jobs, groups, servers, tokens, upkeep)
        return cls(tokens, servers, jobs, groups, upkeep, grants, leases)
