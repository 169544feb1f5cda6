"""Records of the controller: group states, job configuration, and the frozen values the ledger returns.

Every value handed out by the ledger is an immutable snapshot taken at the time of the call: holding one
does not keep it up to date, and it carries no reference into the ledger's own state.

This module does not guarantee that a configuration is *sensible* for a workload (a 1 s lease with a 30 s
training step is legal); it guarantees that it is *consistent*, and names the setting when it is not.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trajflight.errors import ConfigError, brief
from trajflight.keys import Partition
from trajflight.units import parse_duration, parse_size

__all__ = [
    "DeleteWork",
    "FenceWork",
    "GroupInfo",
    "GroupState",
    "HeldGroup",
    "JobConfig",
    "Lease",
    "LostGroup",
    "OldReady",
    "Partition",
    "PolicyStatus",
    "Publication",
    "Published",
    "PutGrant",
    "ResolveAction",
    "ServerInfo",
]


class GroupState(enum.StrEnum):
    """Where a group is in its life.

    ``READY -> LEASED -> PREPARED -> TRAINING -> TRAINED -> COMMITTED`` is the lease path of
    the README; ``UNKNOWN`` is where a lease that expired during training leaves its groups until an
    operator resolves them. ``ALLOCATED`` (a put grant was issued, nothing published yet) and ``DROPPED``
    (abandoned grant, or dropped by an operator or a restore; waiting for its delete) frame that path.
    """

    ALLOCATED = "ALLOCATED"
    READY = "READY"
    LEASED = "LEASED"
    PREPARED = "PREPARED"
    TRAINING = "TRAINING"
    TRAINED = "TRAINED"
    COMMITTED = "COMMITTED"
    UNKNOWN = "UNKNOWN"
    DROPPED = "DROPPED"


LIVE_STATES = frozenset({GroupState.LEASED, GroupState.PREPARED, GroupState.TRAINING, GroupState.TRAINED})
"""States in which a group belongs to a live lease (a checkpoint is refused while any group is in one)."""


class ResolveAction(enum.StrEnum):
    """What an operator does with an ``UNKNOWN`` group: offer it again, or drop (delete) it."""

    REQUEUE = "requeue"
    DROP = "drop"


class OldReady(enum.StrEnum):
    """What a new epoch does with the READY groups of the previous one: offer them again or drop them."""

    REOFFER = "reoffer"
    DROP = "drop"


INT64_MAX = (1 << 63) - 1
"""Largest int the ledger accepts anywhere: storage servers and Arrow key columns hold int64."""


_SIZE_SETTINGS = ("capacity_bytes", "max_group_bytes")
_DURATION_SETTINGS = (
    "grant_ttl",
    "default_lease_ttl",
    "max_lease_ttl",
    "delete_retry_initial",
    "delete_retry_max",
    "delete_timeout",
    "capacity_retry_after",
    "server_retry_initial",
    "server_retry_max",
)


@dataclass(frozen=True, slots=True)
class JobConfig:
    """The configuration of one job, validated on construction.

    Build it directly with numbers, or with :meth:`from_mapping` from human values (``"8GiB"``,
    ``"30s"``) as found in a file or on a command line.

    Attributes:
        capacity_bytes: Most bytes the job may hold on the storage servers (reserved by allocations,
            released when deletes are confirmed). ``None``: bounded only by the servers.
        capacity_groups: Most groups the job may hold, counted like ``capacity_bytes``.
        max_group_bytes: Largest allocation one group may ask for.
        grant_ttl: Seconds a put grant stays valid before it is abandoned and garbage-collected.
        default_lease_ttl: Lease time-to-live when ``acquire``/``renew`` do not give one.
        max_lease_ttl: Largest time-to-live a lease may ask for.
        max_groups_per_lease: Most groups one ``acquire`` may lease.
        strict_on_policy: Hold ``acquire`` until every registered writer acknowledged the announced
            policy version, and lease only groups generated with exactly that version.
        max_staleness: Lease only groups whose policy version is at least ``current - max_staleness``;
            ``None`` for no bound. Must be ``None`` or 0 under ``strict_on_policy``.
        delete_retry_initial: First back-off after a failed delete; doubles per failure.
        delete_retry_max: Largest back-off between delete attempts.
        delete_timeout: Seconds after which a delete handed out but never confirmed is handed out again.
        capacity_retry_after: Retry hint (seconds) carried by a capacity refusal.
        server_retry_initial: How long ``acquire`` leases none of a storage server's groups after a
            trainer of the job reported that it did not answer; doubles per report while it stays
            unreachable.
        server_retry_max: Longest such back-off.
    """

    capacity_bytes: int | None = None
    capacity_groups: int | None = None
    max_group_bytes: int = 1 << 30
    grant_ttl: float = 60.0
    default_lease_ttl: float = 30.0
    max_lease_ttl: float = 600.0
    max_groups_per_lease: int = 4096
    strict_on_policy: bool = False
    max_staleness: int | None = None
    delete_retry_initial: float = 0.5
    delete_retry_max: float = 30.0
    delete_timeout: float = 30.0
    capacity_retry_after: float = 1.0
    server_retry_initial: float = 1.0
    server_retry_max: float = 30.0

    def __post_init__(self) -> None:
        for name in ("capacity_bytes", "capacity_groups", "max_staleness"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT64_MAX
            ):
                raise ConfigError(
                    f"{name}: expected a non-negative int (int64) or None, got {brief(value)}", setting=name
                )
        for name in ("max_group_bytes", "max_groups_per_lease"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= INT64_MAX:
                raise ConfigError(
                    f"{name}: expected a positive int (int64), got {brief(value)}", setting=name
                )
        for name in _DURATION_SETTINGS:
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or (isinstance(value, int) and value > INT64_MAX)
                or not math.isfinite(value)
            ):
                raise ConfigError(
                    f"{name}: expected a finite number of seconds, got {brief(value)}", setting=name
                )
            if value <= 0:
                raise ConfigError(f"{name}: must be positive, got {value!r}", setting=name)
        if not isinstance(self.strict_on_policy, bool):
            raise ConfigError(
                f"strict_on_policy: expected a bool, got {self.strict_on_policy!r}",
                setting="strict_on_policy",
            )
        if self.capacity_groups == 0:
            raise ConfigError(
                "capacity_groups: 0 would refuse every allocation; use None for no job-level bound",
                setting="capacity_groups",
            )
        if self.capacity_bytes is not None and self.capacity_bytes < self.max_group_bytes:
            raise ConfigError(
                f"capacity_bytes ({self.capacity_bytes}) is smaller than max_group_bytes "
                f"({self.max_group_bytes}): a largest group could never be stored; raise capacity_bytes "
                "or lower max_group_bytes",
                setting="capacity_bytes",
            )
        if self.default_lease_ttl > self.max_lease_ttl:
            raise ConfigError(
                f"default_lease_ttl ({self.default_lease_ttl}s) exceeds max_lease_ttl "
                f"({self.max_lease_ttl}s); lower the default or raise the maximum",
                setting="default_lease_ttl",
            )
        if self.delete_retry_initial > self.delete_retry_max:
            raise ConfigError(
                f"delete_retry_initial ({self.delete_retry_initial}s) exceeds delete_retry_max "
                f"({self.delete_retry_max}s)",
                setting="delete_retry_initial",
            )
        if self.server_retry_initial > self.server_retry_max:
            raise ConfigError(
                f"server_retry_initial ({self.server_retry_initial}s) exceeds server_retry_max "
                f"({self.server_retry_max}s)",
                setting="server_retry_initial",
            )
        if self.strict_on_policy and self.max_staleness not in (None, 0):
            raise ConfigError(
                f"max_staleness={self.max_staleness} contradicts strict_on_policy=True (which leases only "
                "the current policy version); set max_staleness to 0 or None, or turn strict_on_policy off",
                setting="max_staleness",
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> JobConfig:
        """Build a configuration from plain values: sizes may be ``"64MiB"``, durations ``"30s"``.

        Raises:
            ConfigError: an unknown setting (named, with the known ones listed) or an invalid value.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for name, value in values.items():
            if name not in known:
                shown = name if isinstance(name, str) and len(name) <= 100 else brief(name)
                raise ConfigError(
                    f"{shown}: unknown controller setting; known settings are {sorted(known)}", setting=shown
                )
            if name in _SIZE_SETTINGS and value is not None:
                value = parse_size(value, setting=name)
            elif name in _DURATION_SETTINGS:
                value = parse_duration(value, setting=name)
            kwargs[name] = value
        return cls(**kwargs)

    def to_mapping(self) -> dict[str, Any]:
        """The settings as a plain dict (the inverse of :meth:`from_mapping`)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def difference(self, other: JobConfig) -> str | None:
        """The name of the first setting on which ``self`` and ``other`` differ, or ``None``."""
        for f in dataclasses.fields(self):
            if getattr(self, f.name) != getattr(other, f.name):
                return f.name
        return None


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """A registered storage server and what the ledger has reserved on it.

    Attributes:
        server_id: Stable name of the server.
        node: The node (host) it runs on; writers on the same node are placed on it first.
        location: Its Flight location (``grpc://host:port``), passed through to grants and deletes.
        capacity_bytes: Bytes it may hold.
        capacity_groups: Groups it may hold.
        used_bytes: Bytes reserved or stored, not yet confirmed deleted.
        used_groups: Groups reserved or stored, not yet confirmed deleted.
    """

    server_id: str
    node: str
    location: str
    capacity_bytes: int
    capacity_groups: int
    used_bytes: int = 0
    used_groups: int = 0


@dataclass(frozen=True, slots=True)
class PutGrant:
    """Permission to put one group to one storage server, until ``expires_at``.

    Attributes:
        partition: The key the group must be put under.
        server_id: The server to put it to.
        location: That server's Flight location.
        token: The grant's fencing token (pass it to the server with the put and to ``publish``).
        nbytes: Bytes reserved; the published group may not be larger.
        expires_at: Ledger time after which the grant is abandoned and the partition garbage-collected.
    """

    partition: Partition
    server_id: str
    location: str
    token: int
    nbytes: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class Publication:
    """One stored group to make READY with ``publish_many``: the arguments of ``publish`` for it.

    The ledger checks every field when it is published (this record does not validate itself).

    Attributes:
        partition: The group's partition, from its grant.
        token: The grant's fencing token.
        rows: Samples in the group.
        nbytes: Bytes stored; at most the bytes the grant reserved.
        tokens: Token count (for token budgets and per-rank balancing).
        policy_version: Weights version that generated it (an announced one).
        columns: Names of the columns the group carries.
    """

    partition: Partition
    token: int
    rows: int
    nbytes: int
    tokens: int
    policy_version: int
    columns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Published:
    """The answer of ``publish_ahead``: the groups it published and the grants it made ahead.

    Attributes:
        groups: One :class:`GroupInfo` per publication, in order (what ``publish_many`` returns).
        grants: The grants asked for ahead that fit, a prefix of the sizes asked for (possibly none:
            asking ahead never makes the publication fail).
        granted_at: Ledger time of the grants, so that a holder on another clock can tell how long
            each stays valid (``expires_at - granted_at`` seconds from when it received them).
    """

    groups: tuple[GroupInfo, ...]
    grants: tuple[PutGrant, ...]
    granted_at: float


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """What the ledger knows of one group, at the time of the call.

    Attributes:
        partition: ``(job_id, epoch, group_id)``.
        state: Its state.
        server_id: Server holding (or about to hold) its data.
        location: That server's Flight location.
        generation: The newest fencing token issued for the group (grant, then each lease).
        rows: Samples in the group (0 until published).
        nbytes: Bytes stored (the reservation until published).
        tokens: Token count (for token budgets and per-rank balancing).
        policy_version: Weights version that generated it.
        columns: Columns the group carries, sorted.
        batch_id: The training batch it is prepared for, while PREPARED..COMMITTED.
    """

    partition: Partition
    state: GroupState
    server_id: str
    location: str
    generation: int
    rows: int
    nbytes: int
    tokens: int
    policy_version: int
    columns: tuple[str, ...]
    batch_id: str | None


@dataclass(frozen=True, slots=True)
class Lease:
    """A fenced, expiring lease on some groups of one job.

    Attributes:
        token: The fencing token (lease generation); every later call on the lease carries it.
        job_id: The job the groups belong to.
        owner: Who asked (free text, for operators).
        expires_at: Ledger time at which the lease expires unless renewed.
        groups: The groups leased, in the order they were granted.
    """

    token: int
    job_id: str
    owner: str
    expires_at: float
    groups: tuple[GroupInfo, ...]

    @property
    def partitions(self) -> tuple[Partition, ...]:
        """The partitions of the leased groups, in order."""
        return tuple(g.partition for g in self.groups)

    @property
    def total_tokens(self) -> int:
        """Sum of the groups' token counts."""
        return sum(g.tokens for g in self.groups)


@dataclass(frozen=True, slots=True)
class DeleteWork:
    """One delete the host must carry out on a storage server, then confirm with ``delete_done``.

    A delete of a group the server no longer has counts as done: report it as a success.

    Attributes:
        partition: The group to delete.
        server_id: The server holding it.
        location: That server's Flight location.
        token: Fencing token to present to the server (the group's newest generation).
        attempt: 1 for the first attempt, then 2, 3, ...
        last_error: Why the previous attempt failed, if one did.
        reason: Why it is deleted: ``"committed"`` (trained; an archive keeps it first) or ``"dropped"``
            (an abandoned grant, dropped by an operator or a new epoch, or purged by a restore).
        committed_at: Ledger time of its commit (committed groups only).
        trained_by: Owner of the lease that committed it (committed groups only).
        trained_version: The job's announced policy version when it was committed (committed groups
            only); a sample's staleness at training time is this minus its ``policy_version``.
    """

    partition: Partition
    server_id: str
    location: str
    token: int
    attempt: int
    last_error: str | None = None
    reason: str = "dropped"
    committed_at: float | None = None
    trained_by: str | None = None
    trained_version: int | None = None


@dataclass(frozen=True, slots=True)
class LostGroup:
    """A group that can never be offered again although it was not trained: its data is gone.

    The ledger keeps one record per lost group of a job (in its checkpoints and snapshots too), so that
    a loss is reported with its partition, never silently dropped.

    Attributes:
        partition: The group.
        reason: Why it is lost (``"missing on server <id>"``, or absent from every storage server at a
            restore).
    """

    partition: Partition
    reason: str


@dataclass(frozen=True, slots=True)
class HeldGroup:
    """A group a storage server holds, as its listing reports it: what a restore needs to re-offer it
    or, when the checkpoint does not know it, to purge it (delete it and give its capacity back).

    Attributes:
        partition: The group.
        server_id: The registered server that holds it.
        nbytes: The bytes it takes there.
        columns: The columns it stores there, appended ones included (empty: not known). A group
            offered again takes these, so a column appended after the checkpoint is not asked for twice.
    """

    partition: Partition
    server_id: str
    nbytes: int
    columns: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FenceWork:
    """One fence the host must raise on a storage server, then confirm with ``fence_done``.

    A lease that ended without its holder (expiry, a newer epoch, a controller restart) leaves its
    groups under a fresh generation; until the server knows it, the old holder (a zombie) could still
    read and append there. The host raises the group's highest generation on its server to
    ``generation`` (``advance_generation``), after which the old token is refused for Flight and
    shared-memory reads, appends and deletes alike. A server that no longer has the group, or already
    saw a higher generation, counts as done.

    Attributes:
        partition: The group to fence.
        server_id: The server holding it.
        location: That server's Flight location.
        generation: The generation to raise it to (the group's newest token).
        attempt: 1 for the first attempt, then 2, 3, ...
        last_error: Why the previous attempt failed, if one did.
    """

    partition: Partition
    server_id: str
    location: str
    generation: int
    attempt: int
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class PolicyStatus:
    """The announced policy version of a job and which registered writers acknowledged it.

    Attributes:
        job_id: The job.
        version: Newest announced weights version (0 before any announcement).
        acknowledged: Writers that acknowledged ``version``, sorted.
        pending: Registered writers that did not yet, sorted.
        held: Whether strict on-policy mode currently holds ``acquire`` (some writer is pending).
    """

    job_id: str
    version: int
    acknowledged: tuple[str, ...]
    pending: tuple[str, ...]
    held: bool
