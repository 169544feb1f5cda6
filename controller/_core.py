"""The core of the ledger: internal records, jobs and epochs, storage servers, policy versions.

:mod:`._partitions` adds put grants and publishing on top of it, :mod:`._leases` the lease state machine,
:mod:`._ledger` the GC list, the queries and checkpoints.

Events in, decisions out, time passed in. No method reads a clock, opens a file or a socket, or starts a
thread: every call gets ``now`` (seconds, any monotonic-enough origin) and first applies what time has
done since the last call (lazy expiry of leases and put grants). The ledger never goes back in time: a
``now`` smaller than one already seen is treated as the latest one seen. Given the same calls with the
same arguments, it makes the same decisions, so a host can journal the calls and replay them.

Fencing tokens come from one counter, ``incarnation << 32 | counter``: each grant and each lease takes the
next value, so a group's generation strictly increases across re-grants, and across restarts as long as the
incarnation does (hosts persist it).

A lease that ends without its holder (expiry, a newer epoch, a restart) gives its groups a fresh
generation and puts them on the fence list (:mod:`._fences`): the host raises that generation on their
storage servers (``take_fences`` / ``fence_done``), so that the old holder's token is refused there too.

It does not guarantee anything about the storage servers: it tells the host what to delete
(``take_deletes``) and to fence (``take_fences``) and believes what the host reports (``delete_done``,
``fence_done``). It is not thread-safe; hosts serialise calls.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

from trajflight.errors import (
    ConfigError,
    InvalidRequestError,
    InvalidStateError,
    LeaseExpiredError,
    NotFoundError,
    StaleFenceError,
    brief,
)

from ._entries import (
    ALLOCATED,
    DROPPED,
    INT64_MAX,
    LEASED,
    PREPARED,
    READY,
    TRAINED,
    TRAINING,
    UNKNOWN,
    _Group,
    _Job,
    _Lease,
    _Server,
    _Writer,
    check_int,
    check_name,
    check_old_ready,
    check_partition,
)
from ._fences import FenceList
from ._index import ReadyIndex
from ._reach import Parked, Reachability
from ._records import (
    FenceWork,
    GroupInfo,
    GroupState,
    JobConfig,
    OldReady,
    Partition,
    PolicyStatus,
    ServerInfo,
)

__all__ = ["LedgerCore"]

# Ended leases are remembered (oldest forgotten first) for idempotent repeats and precise errors; a
# forgotten token is still refused, as stale.
_ENDED_KEPT = 65536
_ENDED_GROUPS_KEPT = 1 << 20
_COUNTER_BITS = 32


class LedgerCore:
    """Jobs, epochs, servers and policy versions; :class:`~._partitions.PartitionLedger` adds the partitions.

    Args:
        incarnation: Fencing tokens start at ``incarnation << 32``; hosts pass a value larger than any
            previous run's (they persist it) so that tokens keep increasing across restarts.
    """

    def __init__(self, *, incarnation: int = 0) -> None:
        self._incarnation = check_int(incarnation, "incarnation")
        self._counter = 0
        self._now = float("-inf")
        self._servers: dict[str, _Server] = {}
        self._jobs: dict[str, _Job] = {}
        self._groups: dict[Partition, _Group] = {}
        self._leases: dict[int, _Lease] = {}
        self._ended: dict[int, _Lease] = {}
        self._ended_groups = 0
        self._lease_heap: list[tuple[float, int]] = []
        self._grant_heap: list[tuple[float, Partition]] = []
        self._colcache: dict[frozenset[str], tuple[str, ...]] = {}
        self._reach = Reachability()  # storage servers in back-off, and the READY groups parked on them
        self._fences = FenceList()
        self.ready_version = 0
        """Incremented whenever a group becomes READY: hosts wake long-polling acquirers on a change."""

    # ------------------------------------------------------------------ internals
    @property
    def incarnation(self) -> int:
        """The incarnation folded into the tokens issued now."""
        return self._incarnation

    @property
    def parks(self) -> int:
        """Groups parked so far on storage servers in back-off (a host journals a call that parked)."""
        return self._reach.parks

    @property
    def last_token(self) -> int:
        """The newest fencing token issued (0 before any)."""
        return (self._incarnation << _COUNTER_BITS) | self._counter

    def _next_token(self) -> int:
        self._counter += 1
        if self._counter >= 1 << _COUNTER_BITS:
            self._incarnation += 1
            self._counter = 1
        return (self._incarnation << _COUNTER_BITS) | self._counter

    def _advance(self, now: float) -> float:
        if now > self._now:
            self._now = float(now)
        now = self._now
        heap, reach = self._lease_heap, self._reach
        while True:
            # Lease expiries and ends of server back-offs both put groups at the front of the READY index:
            # apply them in the order they fell due, whenever the call comes (a replay comes later).
            lease_due = heap[0][0] if heap else None
            reach_due = reach.next_due()
            if reach_due is not None and reach_due <= now and (lease_due is None or reach_due < lease_due):
                self._unpark(reach.expire_next())
                continue
            if lease_due is None or lease_due > now:
                break
            expires_at, token = heapq.heappop(heap)
            lease = self._leases.get(token)
            if lease is not None and lease.expires_at == expires_at:
                self._end_live_lease(lease, "expired")
        grants = self._grant_heap
        while grants and grants[0][0] <= now:
            expires_at, key = heapq.heappop(grants)
            g = self._groups.get(key)
            if g is not None and g.state is ALLOCATED and g.expires_at == expires_at:
                self._to_gc(g, DROPPED)
        return now

    def _set_state(self, g: _Group, state: GroupState) -> None:
        counts = self._jobs[g.key.job_id].counts
        counts[g.state] -= 1
        counts[state] += 1
        g.state = state

    def _make_ready(self, g: _Group, *, front: bool) -> None:
        self._set_state(g, READY)
        g.lease = None
        g.batch_id = None
        g.ready_seq = self._jobs[g.key.job_id].ready.push(g.key, g.policy_version, g.colset, front=front)
        self.ready_version += 1

    def _unpark(self, parked: Parked) -> None:
        """Put groups parked on a server that is reachable again back at the front of the READY index,
        in the order they were parked (entries of groups that left READY meanwhile are skipped)."""
        moved = False
        for key, seq in reversed(parked):
            g = self._groups.get(key)
            if g is not None and g.state is READY and g.ready_seq == seq:
                g.ready_seq = self._jobs[key.job_id].ready.push(key, g.policy_version, g.colset, front=True)
                moved = True
        if moved:
            self.ready_version += 1

    def _to_gc(self, g: _Group, state: GroupState) -> None:
        self._set_state(g, state)
        g.lease = None
        self._jobs[g.key.job_id].gc.add(g.key, self._now)

    def _end_live_lease(self, lease: _Lease, reason: str) -> None:
        """End a live lease without its holder: LEASED/PREPARED groups go back to READY, TRAINING/TRAINED
        to UNKNOWN, and every one of them gets a fresh generation that its storage server is told about
        (the fence list), so that the holder, if it still runs, is refused there too."""
        fresh = self._next_token() if lease.live else 0
        for key in lease.live:
            g = self._groups[key]
            if g.state is LEASED or g.state is PREPARED:
                self._make_ready(g, front=True)
            elif g.state is TRAINING or g.state is TRAINED:
                self._set_state(g, UNKNOWN)
                g.lease = None
            else:
                continue
            g.generation = fresh
            self._fences.add(key, g.server_id, self._servers[g.server_id].location, fresh, self._now)
        lease.live.clear()
        self._retire(lease, reason)

    def _retire(self, lease: _Lease, reason: str) -> None:
        lease.ended = reason
        del self._leases[lease.token]
        self._ended[lease.token] = lease
        self._ended_groups += len(lease.keys)
        while len(self._ended) > _ENDED_KEPT or self._ended_groups > _ENDED_GROUPS_KEPT:
            oldest = self._ended.pop(next(iter(self._ended)))
            self._ended_groups -= len(oldest.keys)

    def _job(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id) if type(job_id) is str else None
        if job is None:
            check_name(job_id, "job_id")
            raise NotFoundError(f"job {brief(job_id)} is not open; call open_job first", job_id=job_id)
        return job

    def _job_epoch(self, job_id: str, epoch: int) -> _Job:
        job = self._job(job_id)
        if type(epoch) is not int or epoch < 0 or epoch > INT64_MAX:
            check_int(epoch, "epoch")
        if epoch < job.epoch:
            raise StaleFenceError(
                f"epoch {epoch} of job {job_id!r} is fenced by epoch {job.epoch}: this caller belongs to an "
                "older run of the job; stop it",
                job_id=job_id,
                epoch=epoch,
                current_epoch=job.epoch,
            )
        if epoch > job.epoch:
            raise NotFoundError(
                f"epoch {epoch} of job {job_id!r} is not open (current epoch {job.epoch}); "
                "call open_job first",
                job_id=job_id,
            )
        return job

    def _columns(self, colset: frozenset[str]) -> tuple[str, ...]:
        cols = self._colcache.get(colset)
        if cols is None:
            cols = self._colcache[colset] = tuple(sorted(colset))
        return cols

    def _info(self, g: _Group) -> GroupInfo:
        return GroupInfo(
            g.key,
            g.state,
            g.server_id,
            self._servers[g.server_id].location,
            g.generation,
            g.rows,
            g.nbytes,
            g.tokens,
            g.policy_version,
            g.columns,
            g.batch_id,
        )

    def _lease(self, token: int) -> _Lease:
        """The lease of ``token``, live or ended; raise if the token was never a lease or is forgotten."""
        if type(token) is not int or token < 0 or token > INT64_MAX:
            check_int(token, "token")
        lease = self._leases.get(token)
        if lease is None:
            lease = self._ended.get(token)
        if lease is not None:
            return lease
        if 0 < token <= self.last_token:
            raise StaleFenceError(
                f"token {token} belongs to a lease that ended long ago; stop and acquire a new lease",
                token=token,
            )
        raise NotFoundError(f"no lease has token {token}; use the token returned by acquire", token=token)

    def _ended_error(self, lease: _Lease) -> Exception:
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
        lease = self._lease(token)
        if lease.ended is not None:
            raise self._ended_error(lease)
        return lease

    # ------------------------------------------------------------------ fences
    def take_fences(self, *, now: float, limit: int = 256) -> list[FenceWork]:
        """Hand out up to ``limit`` due fences; each must be reported with :meth:`fence_done`.

        A fence of a group the ledger has since forgotten (deleted) is dropped, not handed out. An
        unreported fence is handed out again after a timeout.
        """
        self._advance(now)
        out = []
        for work in self._fences.take(self._now, limit):
            if work.partition in self._groups:
                out.append(work)
            else:
                self._fences.discard(work.partition)
        return out

    def fence_done(
        self,
        partition: Partition | Any,
        *,
        generation: int,
        ok: bool,
        now: float,
        error: str | None = None,
    ) -> bool:
        """Report a fence's outcome. Returns True when it confirmed the group's pending fence; False for a
        failure (retried with back-off), a fence of an older generation, or a late duplicate."""
        self._advance(now)
        key = check_partition(partition)
        check_int(generation, "generation")
        return self._fences.done(key, generation, bool(ok), self._now, error)

    def fence_list(self) -> tuple[FenceWork, ...]:
        """The fences that wait for a confirmation, with attempts and last errors (operators, tests)."""
        return tuple(self._fences)

    # ------------------------------------------------------------------ storage servers
    def register_server(
        self,
        server_id: str,
        *,
        node: str,
        location: str,
        capacity_bytes: int,
        capacity_groups: int,
        now: float,
    ) -> ServerInfo:
        """Register (or update) a storage server that groups can be placed on.

        Re-registering an id updates its node, location and capacities and keeps what is reserved on it;
        it also counts as reaching the server: a back-off after unanswered calls ends at once.

        Raises:
            InvalidRequestError: an empty name or a negative capacity.
        """
        self._advance(now)
        check_name(server_id, "server_id")
        check_name(node, "node")
        check_name(location, "location")
        check_int(capacity_bytes, "capacity_bytes")
        check_int(capacity_groups, "capacity_groups")
        server = self._servers.get(server_id)
        if server is None:
            server = self._servers[server_id] = _Server(
                server_id, node, location, capacity_bytes, capacity_groups
            )
        else:
            server.node, server.location = node, location
            server.capacity_bytes, server.capacity_groups = capacity_bytes, capacity_groups
            self._unpark(self._reach.reached(server_id))
        return server.info()

    def servers(self) -> tuple[ServerInfo, ...]:
        """Every registered storage server with its reservations, sorted by id."""
        return tuple(self._servers[s].info() for s in sorted(self._servers))

    # ------------------------------------------------------------------ jobs and epochs
    def open_job(
        self,
        job_id: str,
        epoch: int,
        config: JobConfig | Mapping[str, Any] | None = None,
        *,
        now: float,
        old_ready: OldReady | str = OldReady.REOFFER,
    ) -> JobConfig:
        """Open ``job_id`` at ``epoch`` (idempotent for the same epoch and configuration).

        A larger epoch fences every older one: its put grants are abandoned (garbage-collected), its live
        leases end (LEASED/PREPARED groups to READY, TRAINING/TRAINED to UNKNOWN), its writers must
        register again, and its READY groups are re-offered or dropped as ``old_ready`` says.

        Returns:
            The validated configuration.

        Raises:
            ConfigError: a setting is invalid (named), or the epoch is already open with another setting.
            StaleFenceError: ``epoch`` is smaller than one already opened for the job.
        """
        self._advance(now)
        check_name(job_id, "job_id")
        check_int(epoch, "epoch")
        cfg = self._config(config)
        old_ready = check_old_ready(old_ready)
        job = self._jobs.get(job_id)
        if job is None:
            self._jobs[job_id] = self._new_job(job_id, epoch, cfg)
            return cfg
        if epoch < job.epoch:
            raise StaleFenceError(
                f"epoch {epoch} of job {job_id!r} is older than its current epoch {job.epoch}; a "
                "restart must use a larger epoch",
                job_id=job_id,
                epoch=epoch,
            )
        if epoch == job.epoch:
            diff = cfg.difference(job.config)
            if diff is not None:
                raise ConfigError(
                    f"{diff}: job {job_id!r} epoch {epoch} is already open with {diff}="
                    f"{getattr(job.config, diff)!r}; open a larger epoch to change the configuration",
                    setting=diff,
                )
            return cfg
        self._fence(job, epoch, cfg, old_ready)
        return cfg

    @staticmethod
    def _config(config: JobConfig | Mapping[str, Any] | None) -> JobConfig:
        if config is None:
            return JobConfig()
        if isinstance(config, JobConfig):
            return config
        if isinstance(config, Mapping):
            return JobConfig.from_mapping(config)
        raise InvalidRequestError(f"config must be a JobConfig or a mapping, got {type(config).__name__}")

    def _new_job(self, job_id: str, epoch: int, cfg: JobConfig) -> _Job:
        groups = self._groups

        def is_valid(key: Partition, seq: int) -> bool:
            g = groups.get(key)
            return g is not None and g.state is READY and g.ready_seq == seq

        return _Job(job_id, epoch, cfg, ReadyIndex(is_valid))

    def _fence(self, job: _Job, epoch: int, cfg: JobConfig, old_ready: OldReady) -> None:
        for lease in [lease for lease in self._leases.values() if lease.job_id == job.job_id]:
            self._end_live_lease(lease, "fenced")
        for key in list(job.groups):
            g = self._groups[key]
            if g.state is ALLOCATED or (g.state is READY and old_ready is OldReady.DROP):
                self._to_gc(g, DROPPED)
        job.epoch = epoch
        job.config = cfg
        job.next_group_id = 0
        job.writers.clear()
        job.gc.retry_initial, job.gc.retry_max = cfg.delete_retry_initial, cfg.delete_retry_max
        job.gc.timeout = cfg.delete_timeout

    def register_writer(
        self,
        job_id: str,
        epoch: int,
        writer_id: str,
        *,
        node: str,
        now: float,
        policy_version: int | None = None,
    ) -> PolicyStatus:
        """Register a rollout worker of the job's current epoch (idempotent; updates its node).

        Args:
            policy_version: The weights version the writer has loaded; default the job's current one.

        Raises:
            StaleFenceError: ``epoch`` is older than the job's current epoch.
            NotFoundError: the job or epoch is not open.
        """
        self._advance(now)
        job = self._job_epoch(job_id, epoch)
        check_name(writer_id, "writer_id")
        check_name(node, "node")
        version = (
            job.policy_version if policy_version is None else check_int(policy_version, "policy_version")
        )
        writer = job.writers.get(writer_id)
        if writer is None:
            job.writers[writer_id] = _Writer(node, version)
        else:
            writer.node = node
            writer.acked = max(writer.acked, version)
        return self.policy_status(job_id)

    # ------------------------------------------------------------------ policy versions
    def announce_policy(self, job_id: str, version: int, *, now: float) -> PolicyStatus:
        """The trainer announces new weights ``version`` (larger than the current one; idempotent if equal).

        Raises:
            InvalidRequestError: ``version`` is smaller than the current one.
        """
        self._advance(now)
        job = self._job(job_id)
        check_int(version, "version")
        if version < job.policy_version:
            raise InvalidRequestError(
                f"policy version {version} is older than the announced version {job.policy_version} of job "
                f"{job_id!r}; versions only increase",
            )
        job.policy_version = version
        return self.policy_status(job_id)

    def ack_policy(
        self, job_id: str, epoch: int, writer_id: str, version: int, *, now: float
    ) -> PolicyStatus:
        """A registered writer acknowledges that it generates with ``version`` from now on.

        Raises:
            NotFoundError: the writer is not registered for this epoch.
            InvalidRequestError: ``version`` was never announced.
        """
        self._advance(now)
        job = self._job_epoch(job_id, epoch)
        writer = job.writers.get(check_name(writer_id, "writer_id"))
        if writer is None:
            raise NotFoundError(
                f"writer {writer_id!r} is not registered for job {job_id!r}; register_writer first"
            )
        check_int(version, "version")
        if version > job.policy_version:
            raise InvalidRequestError(
                f"policy version {version} was not announced (current {job.policy_version}); "
                "ack what was announced"
            )
        writer.acked = max(writer.acked, version)
        self.ready_version += 1  # a hold may have lifted
        return self.policy_status(job_id)

    def policy_status(self, job_id: str) -> PolicyStatus:
        """The current policy version of the job and which writers acknowledged it."""
        job = self._job(job_id)
        pending = job.pending_writers()
        acked = sorted(w for w in job.writers if w not in pending)
        return PolicyStatus(
            job_id,
            job.policy_version,
            tuple(acked),
            tuple(pending),
            job.config.strict_on_policy and bool(pending),
        )
