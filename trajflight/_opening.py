"""Opening a fresh lease on its storage servers without ever stranding it (issue 14, item 7).

``Trainer.try_lease`` fences every leased group on its server (and maps it, on this host) before anyone
reads it. One lost or stopped server must not starve the healthy groups leased with its own, nor hold
them until the lease's time-to-live:

* a server that answers that it lacks a group (``NotFoundError``; its listing says which): those
  groups are lost: the controller records them (``"missing on server <id>"``), takes them out of the
  lease and deletes them, so their capacity comes back;
* a server that does not answer under the short fence deadline (``UnavailableError``,
  ``DeadlineExceededError``: dead or stopped): its groups go back to READY and the controller backs the
  server off, so that not every acquirer pays a deadline for it;
* the trainer gets the rest. Any other failure gives the whole lease back before it is raised.

It does not retry: a lease whose every group was unusable is ended, and the caller leases again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from trajflight._handles import BatchHandle
from trajflight._session import Session
from trajflight.controller import GroupInfo, Lease, Partition
from trajflight.errors import DeadlineExceededError, NotFoundError, UnavailableError
from trajflight.flight_server import ShmOpened

__all__ = ["open_lease"]

_SILENT = (UnavailableError, DeadlineExceededError)
"""What a server that does not answer (dead, stopped, cut off) makes a call raise."""


def open_lease(
    session: Session, lease: Lease, *, timeout: float
) -> tuple[BatchHandle, dict[str, ShmOpened]] | None:
    """Fence (and on this host map) the lease's groups on their servers, each call under ``timeout``.

    Returns:
        The handle of the groups opened, with the segments opened per location (shared memory); or
        ``None`` when no group was usable (the lease has then ended).

    Raises:
        Whatever a server or the controller raised other than the failures above; the lease's groups
        were given back first (best effort).
    """
    try:
        return _open(session, lease, timeout)
    except BaseException:
        _give_back(session, lease)
        raise


def _open(session: Session, lease: Lease, timeout: float) -> tuple[BatchHandle, dict[str, ShmOpened]] | None:
    handle = _handle(lease, lease.groups)
    opened, failed = session.storage.advance_each(handle, timeout=timeout)
    if not failed:
        return handle, opened
    missing: list[Partition] = []
    unreachable: list[str] = []
    give_back: list[Partition] = []
    for location, exc in failed.items():
        groups = [g for g in lease.groups if g.location == location]
        if isinstance(exc, _SILENT):
            unreachable.append(groups[0].server_id)
        elif not isinstance(exc, NotFoundError):
            raise exc
        elif (held := _held(session, location, lease.job_id, timeout)) is None:
            unreachable.append(groups[0].server_id)  # it stopped answering meanwhile
        else:
            missing += [g.partition for g in groups if tuple(g.partition) not in held]
            present = [g for g in groups if tuple(g.partition) in held]
            if present:  # refused with a missing one: open them again on their own
                got, again = session.storage.advance_each(_handle(lease, present), timeout=timeout)
                if again:
                    give_back += [g.partition for g in present]
                opened.update(got)
    left = set(session.controller.report_unusable(lease.token, missing=missing, unreachable=unreachable))
    if give_back:
        session.controller.release(lease.token, partitions=give_back)
    out = set(give_back) | left
    remaining = tuple(g for g in lease.groups if g.partition not in out)
    if not remaining:
        return None
    locations = {g.location for g in remaining}
    return _handle(lease, remaining), {loc: o for loc, o in opened.items() if loc in locations}


def _handle(lease: Lease, groups: Sequence[GroupInfo]) -> BatchHandle:
    return BatchHandle(lease.job_id, lease.token, tuple(groups), expires_at=lease.expires_at)


def _held(session: Session, location: str, job_id: str, timeout: float) -> set[tuple[object, ...]] | None:
    """The keys of the job's groups the server at ``location`` holds; ``None`` if it did not answer."""
    try:
        return {tuple(g.key) for g in session.storage.client(location).list_groups(job_id, timeout=timeout)}
    except _SILENT:
        return None


def _give_back(session: Session, lease: Lease) -> None:
    """Release whatever is left of the lease (after an unexpected failure); never raises."""
    with contextlib.suppress(Exception):  # the controller is away too: the lease expires on its own
        session.controller.release(lease.token)
