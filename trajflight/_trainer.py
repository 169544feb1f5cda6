"""The trainer's side of the public client: lease batches of one job, fenced on their storage servers.

:class:`Trainer` (made by ``Client.trainer``) long-polls the controller for READY groups, fences them on
their storage servers before anyone reads them (see :mod:`trajflight._opening`: a lost or stopped server
never strands the lease), and hands over a :class:`~trajflight._lease.LeasedBatch`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

from trajflight._lease import LeasedBatch
from trajflight._opening import open_lease
from trajflight._session import Session
from trajflight.errors import DeadlineExceededError, InvalidRequestError

__all__ = ["FENCE_TIMEOUT", "Trainer"]

FENCE_TIMEOUT = 3.0
"""Default deadline (seconds) of a storage server's fence/open call when a trainer takes a lease."""


class Trainer:
    """Leases batches of one job. Thread-safe.

    Args:
        session: The connection's collaborators (controller, storage, renewals).
        job_id: The job.
        owner: Name shown to operators (default: a random one).
        ttl: Lease time-to-live (default: the job's); leases renew themselves while held.
        fence_timeout: Deadline (seconds) of each storage server's fence/open call when a lease is
            taken: a server that does not answer in time is backed off and its groups wait for it.

    Raises:
        InvalidRequestError: ``fence_timeout`` is not a positive number.
    """

    def __init__(
        self,
        session: Session,
        job_id: str,
        *,
        owner: str | None = None,
        ttl: float | None = None,
        fence_timeout: float = FENCE_TIMEOUT,
    ) -> None:
        if (
            isinstance(fence_timeout, bool)
            or not isinstance(fence_timeout, int | float)
            or fence_timeout <= 0
        ):
            raise InvalidRequestError(
                f"fence_timeout must be a positive number of seconds, got {fence_timeout!r}"
            )
        self.session = session
        self.job_id = job_id
        self.owner = owner or f"trainer-{uuid.uuid4().hex[:8]}"
        self.ttl = ttl
        self.fence_timeout = float(fence_timeout)

    def announce_policy(self, version: int) -> None:
        """Announce new weights to the job's writers."""
        self.session.controller.announce_policy(self.job_id, version)

    def try_lease(
        self,
        max_groups: int,
        *,
        wait: float = 0.0,
        max_tokens: int | None = None,
        max_staleness: int | None = None,
        require: Iterable[str] = (),
        lack: Iterable[str] = (),
        renew: bool = True,
    ) -> LeasedBatch | None:
        """Lease up to ``max_groups`` READY groups, waiting up to ``wait`` seconds; ``None`` if none came.

        The groups are fenced on their storage servers (each call under ``fence_timeout``) before the
        batch is handed over; groups that cannot be opened never strand the lease: those whose server
        answers that it lacks them are recorded lost (``Client.lost``) and deleted, those of a server that
        does not answer go back to READY while the controller backs that server off. The batch holds the
        rest; when nothing was usable the wait goes on.

        Args:
            max_groups: Most groups to lease.
            wait: Long-poll time, seconds.
            max_tokens: Token budget of the batch (at least one group is granted).
            max_staleness: Lease only groups at most this many policy versions old.
            require: Lease only groups carrying these columns (e.g. ``advantage``).
            lack: Lease only groups lacking these columns (enrichment stages).
            renew: Renew the lease in the background while it is held.
        """
        deadline = time.monotonic() + wait
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            lease = self.session.controller.acquire(
                self.job_id,
                self.owner,
                max_groups=max_groups,
                wait=remaining,
                ttl=self.ttl,
                max_tokens=max_tokens,
                max_staleness=max_staleness,
                require=tuple(require),
                lack=tuple(lack),
                timeout=max(self.session.timeout, remaining + 5.0),
            )
            if lease is None:
                return None
            # Fence before anyone reads: a zombie holding an older lease of these groups is refused from
            # now on.
            got = open_lease(self.session, lease, timeout=self.fence_timeout)
            if got is not None:
                handle, opened = got
                return LeasedBatch(self.session, handle, ttl=self.ttl, renew=renew, opened=opened)
            if time.monotonic() >= deadline:
                return None

    def lease(
        self,
        max_groups: int,
        *,
        wait: float = 30.0,
        max_tokens: int | None = None,
        max_staleness: int | None = None,
        require: Iterable[str] = (),
        lack: Iterable[str] = (),
        renew: bool = True,
    ) -> LeasedBatch:
        """Like :meth:`try_lease`, but raise when no group became READY within ``wait`` seconds.

        Raises:
            DeadlineExceededError: nothing to lease in time (the writers may be slow or finished).
        """
        batch = self.try_lease(
            max_groups,
            wait=wait,
            max_tokens=max_tokens,
            max_staleness=max_staleness,
            require=require,
            lack=lack,
            renew=renew,
        )
        if batch is None:
            raise DeadlineExceededError(
                f"no group of job {self.job_id!r} became READY within {wait:g}s; wait longer or check writers"
            )
        return batch
