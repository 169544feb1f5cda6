"""The lease state machine: acquire, the forward steps, release, and leases that end without their holder.

Per group: ``READY -> LEASED -> PREPARED -> TRAINING -> TRAINED -> COMMITTED``, plus ``UNKNOWN``.
``acquire`` leases READY groups under one fencing token; ``prepare`` gathers some LEASED groups of the
lease into a named batch; ``start_training``, ``finish_training`` and ``commit`` move a whole batch one
step. Each step is a compare-and-set on the token and the batch's prior state and returns the same answer
when repeated identically. ``release`` gives LEASED/PREPARED groups back to READY (enrichment stages record
the columns they appended). Expiry (lazy, on every call) sends LEASED/PREPARED groups to READY and
TRAINING/TRAINED groups to UNKNOWN, where only an operator's ``resolve`` moves them.

A lease that ends without its holder (expiry, a newer epoch, a restart) gives its groups a fresh
generation and puts them on the fence list, so that the old holder's token is refused on their storage
servers too. Ended leases are remembered (oldest forgotten first) for idempotent repeats and precise
errors; a forgotten token is still refused, as stale.

It does not retry anything by itself, never replays an UNKNOWN group, and reads no clock.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

from trajflight.errors import (
    AlreadyExistsError,
    InvalidRequestError,
    InvalidStateError,
    LeaseExpiredError,
    NotFoundError,
    StaleFenceError,
    brief,
)
from trajflight.logs import context as log_context

from ._entries import (
    COMMITTED,
    DROPPED,
    INT64_MAX,
    LEASED,
    PREPARED,
    READY,
    TRAINED,
    TRAINING,
    UNKNOWN,
    _Group,
    _Lease,
    check_columns,
    check_int,
    check_name,
    check_names,
    check_partitions,
)
from ._groups import Groups
from ._jobs import Jobs
from ._records import GroupInfo, GroupState, Lease, Partition
from ._servers import Servers
from ._tokens import Tokens
from ._upkeep import Upkeep

log = logging.getLogger("trajflight.controller")

__all__ = ["Leases"]

_ENDED_KEPT = 65536
_ENDED_GROUPS_KEPT = 1 << 20


class Leases:
    """Live leases with their expiries, and the leases that ended.

    Args:
        jobs, groups, servers, tokens, upkeep: The ledger's collaborators a lease touches.
    """

    __slots__ = (
        "_ended",
        "_ended_groups",
        "_ends",
        "_groups",
        "_heap",
        "_jobs",
        "_live",
        "_servers",
        "_tokens",
        "_upkeep",
    )

    def __init__(self, jobs: Jobs, groups: Groups, servers: Servers, tokens: Tokens, upkeep: Upkeep) -> None:
        self._jobs = jobs
        self._groups = groups
        self._servers = servers
        self._tokens = tokens
        self._upkeep = upkeep
        self._live: dict[int, _Lease] = {}
        self._ended: dict[int, _Lease] = {}
        self._ended_groups = 0
        self._ends: Counter[str] = Counter()  # leases ended, by reason (done, expired, fenced, ...)
        self._heap: list[tuple[float, int]] = []

    def __iter__(self) -> Iterator[_Lease]:
        """The live leases, oldest first."""
        return iter(list(self._live.values()))

    def ended(self, token: int) -> _Lease | None:
        """The ended (and still remembered) lease of ``token``, or ``None``."""
        return self._ended.get(token)

    def forget_ended(self) -> None:
        """Forget every ended lease (their tokens are refused as stale from now on)."""
        self._ended.clear()
        self._ended_groups = 0

    # ------------------------------------------------------------------ expiry
    def next_due(self) -> float | None:
        """The earliest scheduled expiry (possibly of a lease renewed or ended since: then a no-op)."""
        return self._heap[0][0] if self._heap else None

    def expire(self, now: float) -> None:
        """End every lease due to expire by ``now``, and the back-offs of storage servers due by then."""
        heap, reach, live = self._heap, self._upkeep.reach, self._live
        while True:
            # Lease expiries and ends of server back-offs both put groups at the front of the READY index:
            # apply them in the order they fell due, whenever the call comes (a replay comes later).
            lease_due = heap[0][0] if heap else None
            reach_due = reach.next_due()
            if reach_due is not None and reach_due <= now and (lease_due is None or reach_due < lease_due):
                self._groups.unpark(reach.expire_next())
                continue
            if lease_due is None or lease_due > now:
                return
            expires_at, token = heapq.heappop(heap)
            lease = live.get(token)
            if lease is not None and lease.expires_at == expires_at:
                self.end(lease, "expired", now)

    def end(self, lease: _Lease, reason: str, now: float) -> None:
        """End a live lease without its holder: LEASED/PREPARED groups go back to READY, TRAINING/TRAINED
        to UNKNOWN, and every one of them gets a fresh generation that its storage server is told about
        (the fence list), so that the holder, if it still runs, is refused there too."""
        fresh = self._tokens.next() if lease.live else 0
        groups, table = self._groups, self._groups.table
        ready = unknown = 0
        for key in lease.live:
            g = table[key]
            if g.state is LEASED or g.state is PREPARED:
                groups.make_ready(g, front=True)
                ready += 1
            elif g.state is TRAINING or g.state is TRAINED:
                groups.set_state(g, UNKNOWN)
                g.lease = None
                unknown += 1
                log.warning(
                    "group became UNKNOWN: lease %d ended (%s) while it was in training; an operator "
                    "resolves it",
                    lease.token,
                    reason,
                    extra=log_context(partition=key, token=lease.token),
                )
            else:
                continue
            g.generation = fresh
            self._upkeep.fence(g, fresh, now)
        lease.live.clear()
        self._retire(lease, reason)
        log.info(
            "lease %d of %s ended (%s): %d groups back to READY, %d UNKNOWN",
            lease.token,
            lease.owner,
            reason,
            ready,
            unknown,
            extra=log_context(job=lease.job_id, token=lease.token),
        )

    def end_job(self, job_id: str, now: float) -> None:
        """End every live lease of ``job_id``: a newer epoch fenced it."""
        for lease in [lease for lease in self._live.values() if lease.job_id == job_id]:
            self.end(lease, "fenced", now)

    def end_all(self, now: float) -> int:
        """End every live lease (a host restarted); returns how many."""
        leases = list(self._live.values())
        for lease in leases:
            self.end(lease, "restart", now)
        return len(leases)

    def _retire(self, lease: _Lease, reason: str) -> None:
        lease.ended = reason
        self._ends[reason] += 1
        del self._live[lease.token]
        self._ended[lease.token] = lease
        self._ended_groups += len(lease.keys)
        while len(self._ended) > _ENDED_KEPT or self._ended_groups > _ENDED_GROUPS_KEPT:
            oldest = self._ended.pop(next(iter(self._ended)))
            self._ended_groups -= len(oldest.keys)

    def end_counts(self) -> dict[str, int]:
        """Leases ended since this ledger was made (or loaded), by reason: ``done`` (committed or
        released), ``expired``, ``fenced`` (a newer epoch), ``restart``."""
        return dict(self._ends)

    # ------------------------------------------------------------------ lookups
    def lookup(self, token: int) -> _Lease:
        """The lease of ``token``, live or ended; raise if the token was never a lease or is forgotten."""
        if type(token) is not int or token < 0 or token > INT64_MAX:
            check_int(token, "token")
        lease = self._live.get(token)
        if lease is None:
            lease = self._ended.get(token)
        if lease is not None:
            return lease
        if 0 < token <= self._tokens.last:
            raise StaleFenceError(
                f"token {token} belongs to a lease that ended long ago; stop and acquire a new lease",
                token=token,
            )
        raise NotFoundError(f"no lease has token {token}; use the token returned by acquire", token=token)

    @staticmethod
    def ended_error(lease: _Lease) -> Exception:
        """The error a call on the ended ``lease`` raises."""
        if lease.ended == "expired":
            return LeaseExpiredError(
                f"lease {lease.token} expired; its LEASED/PREPARED groups went back to READY and its "
                "TRAINING/TRAINED groups to UNKNOWN; acquire a new lease (do not commit this work)",
                token=lease.token,
            )
        if lease.ended == "restart":
            return LeaseExpiredError(
                f"lease {lease.token} ended when the controller restarted; acquire a new lease",
                token=lease.token,
            )
        if lease.ended == "fenced":
            return StaleFenceError(
                f"lease {lease.token} belongs to an epoch of job {lease.job_id!r} that a newer epoch fenced; "
                "stop this trainer",
                token=lease.token,
            )
        return InvalidStateError(
            f"lease {lease.token} is finished (every group was committed or released); acquire a new lease",
            token=lease.token,
        )

    def _live_lease(self, token: int) -> _Lease:
        lease = self.lookup(token)
        if lease.ended is not None:
            raise self.ended_error(lease)
        return lease

    def live_tokens(self, job_id: str | None) -> tuple[int, ...]:
        """See :meth:`~._ledger.Ledger.live_leases`."""
        return tuple(t for t, lease in self._live.items() if job_id is None or lease.job_id == job_id)

    def lease_groups(self, token: int) -> tuple[GroupInfo, ...]:
        """See :meth:`~._ledger.Ledger.lease_groups`."""
        lease = self.lookup(token)
        groups, table = self._groups, self._groups.table
        return tuple(groups.info(table[k]) for k in lease.keys if k in table)

    # ------------------------------------------------------------------ acquire and renew
    def acquire(
        self,
        job_id: str,
        owner: str,
        max_groups: int,
        now: float,
        ttl: float | None,
        max_tokens: int | None,
        max_staleness: int | None,
        require: Iterable[str],
        lack: Iterable[str],
    ) -> Lease | None:
        """See :meth:`~._ledger.Ledger.acquire`."""
        job = self._jobs.job(job_id)
        cfg = job.config
        check_name(owner, "owner")
        check_int(max_groups, "max_groups", minimum=1)
        if max_groups > cfg.max_groups_per_lease:
            raise InvalidRequestError(
                f"max_groups={max_groups} exceeds max_groups_per_lease={cfg.max_groups_per_lease}; "
                "ask for fewer"
            )
        ttl = _ttl(ttl, cfg.default_lease_ttl, cfg.max_lease_ttl)
        if max_tokens is not None:
            check_int(max_tokens, "max_tokens", minimum=1)
        staleness = cfg.max_staleness
        if max_staleness is not None:
            check_int(max_staleness, "max_staleness")
            staleness = max_staleness if staleness is None else min(staleness, max_staleness)
        require_set = check_columns(require, "require")
        lack_set = check_columns(lack, "lack")
        exact = None
        if cfg.strict_on_policy:
            if job.pending_writers():
                return None
            exact = job.policy_version
        groups, table = self._groups, self._groups.table
        reach = self._upkeep.reach

        def parked(key: Partition) -> bool:  # a group of a server in back-off waits for it
            g = table[key]
            if reach.unreachable(g.server_id):
                reach.park(g.server_id, key, g.ready_seq)
                return True
            return False

        keys = job.ready.take(
            max_groups,
            min_version=None if staleness is None else job.policy_version - staleness,
            exact_version=exact,
            require=require_set,
            lack=lack_set,
            max_tokens=max_tokens,
            tokens_of=lambda key: table[key].tokens,
            skip=parked if reach else None,
        )
        if not keys:
            return None
        token = self._tokens.next()
        lease = _Lease(token, job_id, owner, ttl, now + ttl)
        counts = job.counts
        infos = []
        info = groups.info
        for key in keys:
            g = table[key]
            g.state = LEASED
            g.generation = token
            g.lease = token
            lease.live[key] = None
            infos.append(info(g))
        counts[READY] -= len(keys)
        counts[LEASED] += len(keys)
        lease.keys = keys
        self._live[token] = lease
        heapq.heappush(self._heap, (lease.expires_at, token))
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "lease %d granted to %s: %d groups for %.3gs",
                token,
                owner,
                len(keys),
                ttl,
                extra=log_context(job=job_id, token=token),
            )
        return Lease(token, job_id, owner, lease.expires_at, tuple(infos))

    def renew(self, token: int, now: float, ttl: float | None) -> float:
        """See :meth:`~._ledger.Ledger.renew`."""
        lease = self._live_lease(token)
        cfg = self._jobs[lease.job_id].config
        lease.ttl = _ttl(ttl, lease.ttl, cfg.max_lease_ttl)
        lease.expires_at = now + lease.ttl
        heapq.heappush(self._heap, (lease.expires_at, token))
        return lease.expires_at

    # ------------------------------------------------------------------ batches
    def prepare(
        self, token: int, batch_id: str, partitions: Sequence[Partition] | None
    ) -> tuple[Partition, ...]:
        """See :meth:`~._ledger.Ledger.prepare`."""
        lease = self.lookup(token)
        check_name(batch_id, "batch_id")
        existing = lease.batches.get(batch_id)
        if existing is not None:
            if lease.stage[batch_id] is PREPARED and (
                partitions is None or set(check_partitions(partitions)) == set(existing)
            ):
                if lease.ended is not None:
                    raise self.ended_error(lease)
                return existing
            raise InvalidStateError(
                f"batch {batch_id!r} of lease {token} already exists ({lease.stage[batch_id]}) with other "
                "groups or further on; use a new batch id",
            )
        if lease.ended is not None:
            raise self.ended_error(lease)
        table = self._groups.table
        if partitions is None:
            keys = tuple(k for k in lease.live if table[k].state is LEASED)
            if not keys:
                raise InvalidStateError(f"lease {token} has no LEASED group left to prepare")
        else:
            keys = check_partitions(partitions)
            if not keys:
                raise InvalidRequestError("partitions must name at least one group (or be None for all)")
            for key in keys:
                self._check_member(lease, key, (LEASED,))
        for key in keys:
            g = table[key]
            g.state = PREPARED
            g.batch_id = batch_id
        counts = self._jobs[lease.job_id].counts
        counts[LEASED] -= len(keys)
        counts[PREPARED] += len(keys)
        lease.batches[batch_id] = keys
        lease.stage[batch_id] = PREPARED
        return keys

    def _check_member(self, lease: _Lease, key: Partition, states: tuple[GroupState, ...]) -> _Group:
        g = self._groups.table.get(key)
        # Tokens are unique per lease and only grow: a generation below the token means the group was
        # never granted to this lease; above it, the group was granted again since (O(1), no scan).
        if g is None or g.generation < lease.token or g.key.job_id != lease.job_id:
            raise NotFoundError(f"group {tuple(key)} is not part of lease {lease.token}")
        if g.generation != lease.token:
            raise StaleFenceError(
                f"group {tuple(key)} has a newer generation {g.generation} than lease {lease.token} (the "
                "lease ended, or the group was leased again); stop working on it",
                token=lease.token,
            )
        if key not in lease.live or g.state not in states:
            raise InvalidStateError(
                f"group {tuple(key)} is {g.state.value}, expected {'/'.join(s.value for s in states)} under "
                f"lease {lease.token}",
            )
        return g

    def step(self, token: int, batch_id: str, prior: GroupState, target: GroupState) -> tuple[Partition, ...]:
        """Move batch ``batch_id`` of the lease from ``prior`` to ``target`` (the same answer on an
        identical repeat); see :meth:`~._ledger.Ledger.start_training`."""
        lease = self.lookup(token)
        keys = lease.batches.get(check_name(batch_id, "batch_id"))
        if keys is None:
            if lease.ended is not None:
                raise self.ended_error(lease)
            raise NotFoundError(f"lease {token} has no batch {batch_id!r}; call prepare first")
        stage = lease.stage[batch_id]
        if stage is target:
            return keys  # an identical repeat
        if lease.ended is not None:
            raise self.ended_error(lease)
        if stage is not prior:
            raise InvalidStateError(
                f"batch {batch_id!r} of lease {token} is {stage.value}; this step needs {prior.value}",
                token=token,
            )
        table = self._groups.table
        for key in keys:
            table[key].state = target
        counts = self._jobs[lease.job_id].counts
        counts[prior] -= len(keys)
        counts[target] += len(keys)
        lease.stage[batch_id] = target
        return keys

    def commit(self, token: int, batch_id: str, now: float) -> tuple[Partition, ...]:
        """See :meth:`~._ledger.Ledger.commit`."""
        lease = self._live.get(token)
        keys = self.step(token, batch_id, TRAINED, COMMITTED)
        if lease is not None and lease.ended is None and keys[0] in lease.live:
            job = self._jobs[lease.job_id]
            job.committed += len(keys)
            for key in keys:
                del lease.live[key]
                g = self._groups.table[key]
                g.lease = None
                g.trained = (now, lease.owner, job.policy_version)
                if job.checkpoints:  # a restore from the newest checkpoint must find it again
                    job.kept[key] = job.checkpoints
                else:
                    job.gc.add(key, now)
            if not lease.live:
                self._retire(lease, "done")
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "lease %d committed %d groups",
                    token,
                    len(keys),
                    extra=log_context(job=lease.job_id, token=token),
                )
        return keys

    # ------------------------------------------------------------------ giving groups back
    def release(
        self, token: int, partitions: Sequence[Partition] | None, columns: Iterable[str]
    ) -> tuple[Partition, ...]:
        """See :meth:`~._ledger.Ledger.release`."""
        lease = self.lookup(token)
        added = check_columns(columns, "columns")
        groups, table = self._groups, self._groups.table
        if partitions is None:
            if lease.ended is not None and lease.ended != "done":
                raise self.ended_error(lease)
            keys = tuple(k for k in lease.live if table[k].state in (LEASED, PREPARED))
        else:
            keys = check_partitions(partitions)
        todo = []
        for key in keys:
            g = table.get(key)
            if (
                g is not None
                and key not in lease.live
                and g.generation == token
                and g.state is READY
                and added <= g.colset
            ):
                continue  # an identical repeat
            if g is not None and g.generation > token:
                self._check_member(lease, key, (LEASED, PREPARED))  # raises StaleFenceError
            if lease.ended is not None:
                raise self.ended_error(lease)
            todo.append(self._check_member(lease, key, (LEASED, PREPARED)))
        for g in todo:
            twice = added & g.colset
            if twice:
                raise AlreadyExistsError(
                    f"group {tuple(g.key)} already carries {sorted(twice)}; each column is written once "
                    "(lease with lack=... to skip groups that have it)",
                    columns=sorted(twice),
                )
        _leave_batches(lease, todo)
        for g in todo:
            if added:
                g.colset = g.colset | added
                g.columns = groups.columns(g.colset)
            del lease.live[g.key]
            groups.make_ready(g, front=True)
        if lease.ended is None and not lease.live:
            self._retire(lease, "done")
        return keys

    def report_unusable(
        self, token: int, now: float, missing: Sequence[Partition], unreachable: Sequence[str]
    ) -> tuple[Partition, ...]:
        """See :meth:`~._ledger.Ledger.report_unusable`."""
        lease = self.lookup(token)
        job = self._jobs[lease.job_id]
        keys = check_partitions(missing)
        servers = check_names(unreachable, "unreachable")
        for server_id in servers:
            if server_id not in self._servers.by_id:
                raise NotFoundError(f"no storage server {brief(server_id)} is registered")
        lost = []
        for key in keys:
            if job.lost.get(key, "").startswith("missing on server") and key not in lease.live:
                continue  # an identical repeat
            if lease.ended is not None:
                raise self.ended_error(lease)
            lost.append(self._check_member(lease, key, (LEASED, PREPARED)))
        if lease.ended is not None:
            if servers and lease.ended != "done":
                raise self.ended_error(lease)
            return ()
        cfg = job.config
        reach = self._upkeep.reach
        for server_id in servers:
            reach.mark(server_id, now, cfg.server_retry_initial, cfg.server_retry_max)
        lost_keys = {g.key for g in lost}
        groups, table = self._groups, self._groups.table
        waiting = [
            g
            for k in lease.live
            if k not in lost_keys and (g := table[k]).server_id in servers and g.state in (LEASED, PREPARED)
        ]
        _leave_batches(lease, [*lost, *waiting])
        for g in lost:
            del lease.live[g.key]
            job.lost[g.key] = f"missing on server {g.server_id[:100]}"
            groups.to_gc(g, DROPPED, now)
        for g in waiting:
            del lease.live[g.key]
            groups.make_ready(g, front=True)  # parked by the next acquire that meets it
        if not lease.live:
            self._retire(lease, "done")
        gone = lost_keys | {g.key for g in waiting}
        return tuple(k for k in lease.keys if k in gone)

    # ------------------------------------------------------------------ snapshots
    def install(self, lease: _Lease) -> None:
        """Add a live lease read from a snapshot (its expiry scheduled; call :meth:`loaded` after all)."""
        self._live[lease.token] = lease
        self._heap.append((lease.expires_at, lease.token))

    def loaded(self) -> None:
        """Order the expiries of the leases installed from a snapshot."""
        self._heap.sort()


def _ttl(ttl: float | None, default: float, maximum: float) -> float:
    if ttl is None:
        return default
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= maximum:
        raise InvalidRequestError(
            f"ttl must be a number of seconds in (0, {maximum}] (max_lease_ttl), got {brief(ttl)}"
        )
    return float(ttl)


def _leave_batches(lease: _Lease, groups: Iterable[_Group]) -> None:
    """Take prepared ``groups`` out of their batches (a batch left empty is forgotten)."""
    leaving: dict[str, set[Partition]] = {}
    for g in groups:
        if g.batch_id is not None:
            leaving.setdefault(g.batch_id, set()).add(g.key)
    for batch, keys_out in leaving.items():
        rest = tuple(k for k in lease.batches[batch] if k not in keys_out)
        if rest:
            lease.batches[batch] = rest
        else:
            del lease.batches[batch]
            del lease.stage[batch]
