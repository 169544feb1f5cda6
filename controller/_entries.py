"""The ledger's internal, mutable records: groups, leases, writers, servers, jobs; and argument checks.

These are owned by the ledger and never handed out: callers get the frozen records of
:mod:`._records` instead. Nothing here validates invariants across records; the collaborators of
:mod:`._parts` keep them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import Any

from trajflight.errors import InvalidRequestError, brief

from ._gc import GcList
from ._index import ReadyIndex
from ._records import INT64_MAX, GroupState, JobConfig, OldReady, Partition, ServerInfo

__all__ = [
    "ALLOCATED",
    "COMMITTED",
    "DROPPED",
    "INT64_MAX",
    "LEASED",
    "MAX_NAME_CHARS",
    "PREPARED",
    "READY",
    "TRAINED",
    "TRAINING",
    "UNKNOWN",
    "check_columns",
    "check_int",
    "check_name",
    "check_old_ready",
    "check_partition",
    "check_partitions",
    "check_seconds",
    "check_state",
]

MAX_NAME_CHARS = 1024
"""Longest name (job, writer, owner, server, node, location, batch, column) the ledger accepts."""


READY = GroupState.READY
LEASED = GroupState.LEASED
PREPARED = GroupState.PREPARED
TRAINING = GroupState.TRAINING
TRAINED = GroupState.TRAINED
COMMITTED = GroupState.COMMITTED
UNKNOWN = GroupState.UNKNOWN
DROPPED = GroupState.DROPPED
ALLOCATED = GroupState.ALLOCATED


class _Group:
    __slots__ = (
        "batch_id",
        "colset",
        "columns",
        "expires_at",
        "generation",
        "grant_token",
        "key",
        "lease",
        "nbytes",
        "policy_version",
        "ready_seq",
        "rows",
        "server_id",
        "state",
        "tokens",
        "trained",
    )

    def __init__(self, key: Partition, server_id: str, token: int, nbytes: int, expires_at: float) -> None:
        self.key = key
        self.server_id = server_id
        self.state = ALLOCATED
        self.generation = token
        self.grant_token = token
        self.nbytes = nbytes  # the reservation until published, then the stored size
        self.expires_at = expires_at
        self.rows = 0
        self.tokens = 0
        self.policy_version = 0
        self.colset: frozenset[str] = frozenset()
        self.columns: tuple[str, ...] = ()
        self.batch_id: str | None = None
        self.lease: int | None = None
        self.ready_seq = 0
        # Set at commit, for the archive: (commit time, lease owner, the job's policy version then).
        self.trained: tuple[float, str, int] | None = None


class _Lease:
    __slots__ = ("batches", "ended", "expires_at", "job_id", "keys", "live", "owner", "stage", "token", "ttl")

    def __init__(self, token: int, job_id: str, owner: str, ttl: float, expires_at: float) -> None:
        self.token = token
        self.job_id = job_id
        self.owner = owner
        self.ttl = ttl
        self.expires_at = expires_at
        self.keys: list[Partition] = []  # every group granted, in order
        self.live: dict[Partition, None] = {}  # groups still LEASED..TRAINED under this lease
        self.batches: dict[str, tuple[Partition, ...]] = {}
        self.stage: dict[str, GroupState] = {}  # batch -> state all its groups are in
        self.ended: str | None = None  # None while live; else "done", "expired", "fenced", "restart"


class _Writer:
    __slots__ = ("acked", "node")

    def __init__(self, node: str, acked: int) -> None:
        self.node = node
        self.acked = acked


class _Server:
    __slots__ = (
        "capacity_bytes",
        "capacity_groups",
        "location",
        "node",
        "server_id",
        "used_bytes",
        "used_groups",
    )

    def __init__(
        self, server_id: str, node: str, location: str, capacity_bytes: int, capacity_groups: int
    ) -> None:
        self.server_id = server_id
        self.node = node
        self.location = location
        self.capacity_bytes = capacity_bytes
        self.capacity_groups = capacity_groups
        self.used_bytes = 0
        self.used_groups = 0

    def info(self) -> ServerInfo:
        """A frozen copy for callers."""
        return ServerInfo(
            self.server_id,
            self.node,
            self.location,
            self.capacity_bytes,
            self.capacity_groups,
            self.used_bytes,
            self.used_groups,
        )


class _Job:
    __slots__ = (
        "checkpoints",
        "committed",
        "config",
        "counts",
        "deleted",
        "durable",
        "epoch",
        "gc",
        "groups",
        "job_id",
        "kept",
        "lost",
        "next_group_id",
        "policy_version",
        "purged",
        "ready",
        "used_bytes",
        "used_groups",
        "writers",
    )

    def __init__(self, job_id: str, epoch: int, config: JobConfig, ready: ReadyIndex[Partition]) -> None:
        self.job_id = job_id
        self.epoch = epoch
        self.config = config
        self.next_group_id = 0
        self.writers: dict[str, _Writer] = {}
        self.policy_version = 0
        self.groups: dict[Partition, None] = {}
        self.counts: dict[GroupState, int] = dict.fromkeys(GroupState, 0)
        self.committed = 0
        self.deleted = 0
        self.used_bytes = 0
        self.used_groups = 0
        self.ready = ready
        self.gc: GcList[Partition] = GcList(
            config.delete_retry_initial, config.delete_retry_max, config.delete_timeout
        )
        self.checkpoints = 0  # job checkpoints handed out (the newest one's sequence number)
        self.durable = 0  # the newest checkpoint confirmed written
        self.kept: dict[Partition, int] = {}  # committed, kept until a checkpoint after this one is durable
        self.lost: dict[Partition, str] = {}  # groups that can never be offered again -> why
        self.purged = 0  # groups restores deleted because their checkpoint did not know them

    def pending_writers(self) -> list[str]:
        """Registered writers that have not acknowledged the announced policy version, sorted."""
        return sorted(w for w, writer in self.writers.items() if writer.acked < self.policy_version)


def check_name(value: object, what: str) -> str:
    """Return ``value`` if it is a non-empty string of at most :data:`MAX_NAME_CHARS` characters; else
    raise InvalidRequestError naming ``what``."""
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{what} must be a non-empty string, got {brief(value)}")
    if len(value) > MAX_NAME_CHARS:
        raise InvalidRequestError(
            f"{what} must be at most {MAX_NAME_CHARS} characters, got {len(value)}: {brief(value)}"
        )
    return value


def check_names(values: object, what: str) -> tuple[str, ...]:
    """Distinct names in the order given, from a list or tuple (a bare string would read as its
    characters, a mapping as its keys); raise InvalidRequestError naming ``what``."""
    if not isinstance(values, list | tuple):
        raise InvalidRequestError(f"{what} must be a list of names, got {brief(values)}")
    return tuple(dict.fromkeys(check_name(v, f"each of {what}") for v in values))


def check_int(value: object, what: str, *, minimum: int = 0, maximum: int = INT64_MAX) -> int:
    """Return ``value`` if it is an int (not a bool) in ``[minimum, maximum]`` (int64 by default); else
    raise InvalidRequestError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{what} must be an int >= {minimum}, got {brief(value)}")
    if value < minimum:
        raise InvalidRequestError(f"{what} must be an int >= {minimum}, got {brief(value)}")
    if value > maximum:
        raise InvalidRequestError(f"{what} must be an int <= {maximum}, got {brief(value)}")
    return value


def check_seconds(
    value: object, what: str, *, minimum: float = 0.0, maximum: float | None = None, positive: bool = False
) -> float:
    """Return ``value`` as a float if it is a finite number (not a bool) >= ``minimum`` (> 0 when
    ``positive``) and <= ``maximum``; else raise InvalidRequestError naming ``what``. NaN and infinities
    are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(f"{what} must be a number of seconds, got {brief(value)}")
    if isinstance(value, int) and abs(value) > INT64_MAX:
        raise InvalidRequestError(f"{what} is out of range, got {brief(value)}")
    seconds = float(value)
    if not math.isfinite(seconds):
        raise InvalidRequestError(f"{what} must be a finite number of seconds, got {brief(value)}")
    if seconds < minimum or (positive and seconds <= 0):
        bound = "> 0" if positive and minimum <= 0 else f">= {minimum:g}"
        raise InvalidRequestError(f"{what} must be {bound} seconds, got {brief(value)}")
    if maximum is not None and seconds > maximum:
        raise InvalidRequestError(f"{what} must be <= {maximum:g} seconds, got {brief(value)}")
    return seconds


def check_old_ready(value: OldReady | str) -> OldReady:
    """Return ``value`` as :class:`OldReady`; else raise InvalidRequestError listing the choices."""
    try:
        return OldReady(value)
    except (ValueError, TypeError):
        raise InvalidRequestError(f"old_ready must be 'reoffer' or 'drop', got {brief(value)}") from None


def check_state(value: GroupState | str) -> GroupState:
    """Return ``value`` as :class:`GroupState`; else raise InvalidRequestError listing the states."""
    try:
        return GroupState(value)
    except (ValueError, TypeError):
        raise InvalidRequestError(
            f"unknown group state {brief(value)}; one of {[s.value for s in GroupState]}"
        ) from None


def check_partition(value: Any) -> Partition:
    """Return ``value`` (a Partition or a ``(job_id, epoch, group_id)`` sequence) as a :class:`Partition`,
    its job id a name and its epoch and group id ints in int64 (an unchecked NamedTuple is checked too)."""
    if (
        type(value) is Partition
        and type(value[0]) is str
        and type(value[1]) is int
        and type(value[2]) is int
        and 0 < len(value[0]) <= MAX_NAME_CHARS
        and 0 <= value[1] <= INT64_MAX
        and 0 <= value[2] <= INT64_MAX
    ):
        return value  # the common case, checked without a call
    if isinstance(value, str | bytes | dict):
        raise InvalidRequestError(f"a partition is (job_id, epoch, group_id), got {brief(value)}")
    try:
        job_id, epoch, group_id = value
    except (TypeError, ValueError):
        raise InvalidRequestError(f"a partition is (job_id, epoch, group_id), got {brief(value)}") from None
    return Partition(
        check_name(job_id, "a partition's job_id"),
        check_int(epoch, "a partition's epoch"),
        check_int(group_id, "a partition's group_id"),
    )


def check_partitions(values: Iterable[Any]) -> tuple[Partition, ...]:
    """Distinct partitions in the order given (see :func:`check_partition`)."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise InvalidRequestError(f"expected a sequence of partitions, got {brief(values)}")
    return tuple(dict.fromkeys(check_partition(v) for v in values))


def check_columns(values: Iterable[str], what: str) -> frozenset[str]:
    """Column names as a frozenset; a bare string is refused (it would read as its characters)."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise InvalidRequestError(f"{what} must be a list of column names, got {brief(values)}")
    if type(values) is tuple and all(type(v) is str for v in values):
        return _checked_columns(values, what)  # every group of a job publishes the same tuple
    try:
        out = frozenset(values)
    except TypeError:  # an unhashable item: not a column name
        raise InvalidRequestError(f"{what} must be a list of column names, got {brief(values)}") from None
    for name in out:
        check_name(name, f"a column name in {what}")
    return out


@functools.lru_cache(maxsize=256)
def _checked_columns(values: tuple[str, ...], what: str) -> frozenset[str]:
    for name in values:
        check_name(name, f"a column name in {what}")
    return frozenset(values)
