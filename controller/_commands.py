"""The controller's operations, declared once: one frozen dataclass per operation.

A command's fields are the arguments of the :class:`~._ledger.Ledger` method of the same name (``now``
aside: the host supplies it), typed and with the method's defaults; the command checks nothing itself
(the ledger checks every argument). Each is tagged with

* its :class:`Kind`: ``MUTATING`` (changes state, takes ``now``, journaled), ``TIMED`` (takes ``now``, only
  applies expiries or hands out work: not journaled) or ``QUERY`` (reads only, no ``now``);
* its :class:`Route`: ``CALL`` (a client operation carried by the generic call: Flight ``call``/``many``,
  the Ray actor's ``invoke``), ``OWN`` (a client operation the hosts serve with a method of its own:
  ``acquire`` long-polls, ``checkpoint`` may write a file, ``restore`` may read one) or ``HOST`` (the
  hosts' own: the sweeper, recovery, in-process queries; never served to a remote caller).

Everything that lists operations derives from :data:`COMMANDS`: the hosts' dispatch and journal
(:mod:`._durable`, :mod:`._journal`), the Flight allowlist of the public face, the Ray actor and the
:class:`~trajflight.controller.ControllerClient` (each of its methods builds its command).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Generic, TypeVar

from trajflight.auth import Role
from trajflight.errors import InvalidRequestError, brief

from . import _records as rec
from ._ledger import Ledger
from ._records import (
    DeleteWork,
    FenceWork,
    GroupInfo,
    GroupState,
    HeldGroup,
    JobConfig,
    Lease,
    LostGroup,
    OldReady,
    Partition,
    Publication,
    Published,
    PutGrant,
    ResolveAction,
    ServerInfo,
)

__all__ = ["CALLS", "COMMANDS", "MUTATING", "ROLES", "Command", "Kind", "Route", "client_call", "parse"]

R = TypeVar("R")
C = TypeVar("C", bound="type[Command[Any]]")


class Kind(enum.Enum):
    """What a command does to the ledger (see the module docstring)."""

    MUTATING = "mutating"
    TIMED = "timed"
    QUERY = "query"


class Route(enum.Enum):
    """Who may send a command (see the module docstring)."""

    CALL = "call"
    OWN = "own"
    HOST = "host"


@dataclass(frozen=True, slots=True, kw_only=True)
class Command(Generic[R]):
    """One call of a controller operation, as data; ``apply`` runs it on a ledger and returns its ``R``."""

    name: ClassVar[str]
    """The operation's name: the ledger method it runs."""
    kind: ClassVar[Kind]
    route: ClassVar[Route]
    argument_names: ClassVar[tuple[str, ...]]
    """The fields, in declaration order."""

    def apply(self, ledger: Ledger, now: float) -> R:
        """Run the command on ``ledger`` at ``now`` (ignored by a query)."""
        raise NotImplementedError

    def arguments(self) -> dict[str, Any]:
        """The fields as keyword arguments (what transports and the journal carry)."""
        return {name: getattr(self, name) for name in self.argument_names}


_COMMANDS: dict[str, type[Command[Any]]] = {}

COMMANDS: Mapping[str, type[Command[Any]]] = MappingProxyType(_COMMANDS)
"""Every command class by operation name, in declaration order."""


def _declare(kind: Kind, route: Route) -> Callable[[C], C]:
    def declare(cls: C) -> C:
        cls.name = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()
        cls.kind, cls.route = kind, route
        cls.argument_names = tuple(f.name for f in dataclasses.fields(cls))
        _COMMANDS[cls.name] = cls
        return cls

    return declare


def parse(name: object, kwargs: Mapping[str, Any]) -> Command[Any]:
    """The command ``name`` with the keyword arguments ``kwargs`` (as a transport carries it).

    Raises:
        InvalidRequestError: no operation has that name, or it does not take those arguments.
    """
    cls = _COMMANDS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise InvalidRequestError(f"{brief(name)} is not a controller call")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise InvalidRequestError(f"bad arguments for {cls.name}: {brief(str(exc))}") from exc


M, T, Q = Kind.MUTATING, Kind.TIMED, Kind.QUERY
CALL, OWN, HOST = Route.CALL, Route.OWN, Route.HOST
_Parts = tuple[Partition, ...]


# ---------------------------------------------------------------------- servers, jobs, writers, policy
@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterServer(Command[ServerInfo]):
    server_id: str
    node: str
    location: str
    capacity_bytes: int
    capacity_groups: int

    def apply(self, ledger: Ledger, now: float) -> ServerInfo:
        return ledger.register_server(
            self.server_id, node=self.node, location=self.location, capacity_bytes=self.capacity_bytes,
            capacity_groups=self.capacity_groups, now=now,
        )  # fmt: skip


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class OpenJob(Command[JobConfig]):
    job_id: str
    epoch: int
    config: JobConfig | Mapping[str, Any] | None = None
    old_ready: OldReady | str = OldReady.REOFFER

    def apply(self, ledger: Ledger, now: float) -> JobConfig:
        return ledger.open_job(self.job_id, self.epoch, self.config, now=now, old_ready=self.old_ready)


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterWriter(Command[rec.PolicyStatus]):
    job_id: str
    epoch: int
    writer_id: str
    node: str
    policy_version: int | None = None

    def apply(self, ledger: Ledger, now: float) -> rec.PolicyStatus:
        return ledger.register_writer(
            self.job_id,
            self.epoch,
            self.writer_id,
            node=self.node,
            now=now,
            policy_version=self.policy_version,
        )


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class AnnouncePolicy(Command[rec.PolicyStatus]):
    job_id: str
    version: int

    def apply(self, ledger: Ledger, now: float) -> rec.PolicyStatus:
        return ledger.announce_policy(self.job_id, self.version, now=now)


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class AckPolicy(Command[rec.PolicyStatus]):
    job_id: str
    epoch: int
    writer_id: str
    version: int

    def apply(self, ledger: Ledger, now: float) -> rec.PolicyStatus:
        return ledger.ack_policy(self.job_id, self.epoch, self.writer_id, self.version, now=now)


@_declare(Q, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyStatus(Command[rec.PolicyStatus]):
    job_id: str

    def apply(self, ledger: Ledger, now: float) -> rec.PolicyStatus:
        return ledger.policy_status(self.job_id)


# ---------------------------------------------------------------------- partitions
@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class Allocate(Command[PutGrant]):
    job_id: str
    epoch: int
    writer_id: str
    nbytes: int

    def apply(self, ledger: Ledger, now: float) -> PutGrant:
        return ledger.allocate(self.job_id, self.epoch, self.writer_id, nbytes=self.nbytes, now=now)


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class AllocateMany(Command[list[PutGrant]]):
    job_id: str
    epoch: int
    writer_id: str
    nbytes: Sequence[int]

    def apply(self, ledger: Ledger, now: float) -> list[PutGrant]:
        return ledger.allocate_many(self.job_id, self.epoch, self.writer_id, nbytes=self.nbytes, now=now)


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class Publish(Command[GroupInfo]):
    partition: Partition | Sequence[Any]
    token: int
    rows: int
    nbytes: int
    tokens: int
    policy_version: int
    columns: Iterable[str]

    def apply(self, ledger: Ledger, now: float) -> GroupInfo:
        return ledger.publish(
            self.partition, token=self.token, rows=self.rows, nbytes=self.nbytes, tokens=self.tokens,
            policy_version=self.policy_version, columns=self.columns, now=now,
        )  # fmt: skip


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class PublishMany(Command[list[GroupInfo]]):
    items: Sequence[Publication]

    def apply(self, ledger: Ledger, now: float) -> list[GroupInfo]:
        return ledger.publish_many(self.items, now=now)


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class PublishAhead(Command[Published]):
    items: Sequence[Publication]
    job_id: str
    epoch: int
    writer_id: str
    ahead: Sequence[int] = ()

    def apply(self, ledger: Ledger, now: float) -> Published:
        return ledger.publish_ahead(
            self.items, job_id=self.job_id, epoch=self.epoch, writer_id=self.writer_id, ahead=self.ahead,
            now=now,
        )  # fmt: skip


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class Abandon(Command[bool]):
    partition: Partition | Sequence[Any]
    token: int

    def apply(self, ledger: Ledger, now: float) -> bool:
        return ledger.abandon(self.partition, token=self.token, now=now)


@_declare(Q, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class Group(Command[GroupInfo]):
    partition: Partition | Sequence[Any]

    def apply(self, ledger: Ledger, now: float) -> GroupInfo:
        return ledger.group(self.partition)


# ---------------------------------------------------------------------- leases
@_declare(M, OWN)
@dataclass(frozen=True, slots=True, kw_only=True)
class Acquire(Command[Lease | None]):
    job_id: str
    owner: str
    max_groups: int
    ttl: float | None = None
    max_tokens: int | None = None
    max_staleness: int | None = None
    require: Iterable[str] = ()
    lack: Iterable[str] = ()

    def apply(self, ledger: Ledger, now: float) -> Lease | None:
        return ledger.acquire(
            self.job_id, self.owner, max_groups=self.max_groups, now=now, ttl=self.ttl,
            max_tokens=self.max_tokens, max_staleness=self.max_staleness, require=self.require,
            lack=self.lack,
        )  # fmt: skip


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class Renew(Command[float]):
    token: int
    ttl: float | None = None

    def apply(self, ledger: Ledger, now: float) -> float:
        return ledger.renew(self.token, now=now, ttl=self.ttl)


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class Prepare(Command[_Parts]):
    token: int
    batch_id: str
    partitions: Sequence[Partition] | None = None

    def apply(self, ledger: Ledger, now: float) -> _Parts:
        return ledger.prepare(self.token, self.batch_id, now=now, partitions=self.partitions)


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class StartTraining(Command[_Parts]):
    token: int
    batch_id: str

    def apply(self, ledger: Ledger, now: float) -> _Parts:
        return ledger.start_training(self.token, self.batch_id, now=now)


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class FinishTraining(Command[_Parts]):
    token: int
    batch_id: str

    def apply(self, ledger: Ledger, now: float) -> _Parts:
        return ledger.finish_training(self.token, self.batch_id, now=now)


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class Commit(Command[_Parts]):
    token: int
    batch_id: str

    def apply(self, ledger: Ledger, now: float) -> _Parts:
        return ledger.commit(self.token, self.batch_id, now=now)


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class Release(Command[_Parts]):
    token: int
    partitions: Sequence[Partition] | None = None
    columns: Iterable[str] = ()

    def apply(self, ledger: Ledger, now: float) -> _Parts:
        return ledger.release(self.token, now=now, partitions=self.partitions, columns=self.columns)


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class ReportUnusable(Command[_Parts]):
    token: int
    missing: Sequence[Partition] = ()
    unreachable: Sequence[str] = ()

    def apply(self, ledger: Ledger, now: float) -> _Parts:
        return ledger.report_unusable(self.token, now=now, missing=self.missing, unreachable=self.unreachable)


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class Resolve(Command[_Parts]):
    job_id: str
    partitions: Sequence[Partition]
    action: ResolveAction | str

    def apply(self, ledger: Ledger, now: float) -> _Parts:
        return ledger.resolve(self.job_id, self.partitions, self.action, now=now)


# ---------------------------------------------------------------------- queries
@_declare(Q, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class Counts(Command[dict[str, int]]):
    job_id: str

    def apply(self, ledger: Ledger, now: float) -> dict[str, int]:
        return ledger.counts(self.job_id)


@_declare(Q, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class Usage(Command[tuple[int, int]]):
    job_id: str

    def apply(self, ledger: Ledger, now: float) -> tuple[int, int]:
        return ledger.usage(self.job_id)


@_declare(Q, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseGroups(Command[tuple[GroupInfo, ...]]):
    token: int

    def apply(self, ledger: Ledger, now: float) -> tuple[GroupInfo, ...]:
        return ledger.lease_groups(self.token)


@_declare(Q, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class GcList(Command[tuple[DeleteWork, ...]]):
    job_id: str | None = None

    def apply(self, ledger: Ledger, now: float) -> tuple[DeleteWork, ...]:
        return ledger.gc_list(self.job_id)


@_declare(Q, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class FenceList(Command[tuple[FenceWork, ...]]):
    def apply(self, ledger: Ledger, now: float) -> tuple[FenceWork, ...]:
        return ledger.fence_list()


@_declare(Q, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class Servers(Command[tuple[ServerInfo, ...]]):
    def apply(self, ledger: Ledger, now: float) -> tuple[ServerInfo, ...]:
        return ledger.servers()


@_declare(Q, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class Lost(Command[tuple[LostGroup, ...]]):
    job_id: str

    def apply(self, ledger: Ledger, now: float) -> tuple[LostGroup, ...]:
        return ledger.lost(self.job_id)


@_declare(Q, HOST)
@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseJob(Command[str]):
    token: int

    def apply(self, ledger: Ledger, now: float) -> str:
        return ledger.lease_job(self.token)


@_declare(Q, HOST)
@dataclass(frozen=True, slots=True, kw_only=True)
class LiveLeases(Command[tuple[int, ...]]):
    job_id: str | None = None

    def apply(self, ledger: Ledger, now: float) -> tuple[int, ...]:
        return ledger.live_leases(self.job_id)


@_declare(Q, HOST)
@dataclass(frozen=True, slots=True, kw_only=True)
class GroupsIn(Command[tuple[GroupInfo, ...]]):
    job_id: str
    state: GroupState | str

    def apply(self, ledger: Ledger, now: float) -> tuple[GroupInfo, ...]:
        return ledger.groups_in(self.job_id, self.state)


@_declare(Q, HOST)
@dataclass(frozen=True, slots=True, kw_only=True)
class IsQuiescent(Command[bool]):
    job_id: str

    def apply(self, ledger: Ledger, now: float) -> bool:
        return ledger.is_quiescent(self.job_id)


@_declare(Q, HOST)
@dataclass(frozen=True, slots=True, kw_only=True)
class NextDeadline(Command[float | None]):
    def apply(self, ledger: Ledger, now: float) -> float | None:
        return ledger.next_deadline()


# ---------------------------------------------------------------------- checkpoints and recovery
@_declare(M, OWN)
@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint(Command[bytes]):
    job_id: str

    def apply(self, ledger: Ledger, now: float) -> bytes:
        return ledger.checkpoint(self.job_id, now=now)


@_declare(M, CALL)
@dataclass(frozen=True, slots=True, kw_only=True)
class ConfirmCheckpoint(Command[int]):
    job_id: str
    seq: int

    def apply(self, ledger: Ledger, now: float) -> int:
        return ledger.confirm_checkpoint(self.job_id, self.seq, now=now)


@_declare(M, OWN)
@dataclass(frozen=True, slots=True, kw_only=True)
class Restore(Command[dict[str, int]]):
    data: bytes
    job_id: str
    epoch: int
    config: JobConfig | Mapping[str, Any] | None
    old_ready: OldReady | str = OldReady.REOFFER
    available: Sequence[Partition | HeldGroup] | None = None
    min_token: int = 0

    def apply(self, ledger: Ledger, now: float) -> dict[str, int]:
        return ledger.restore(
            self.data, job_id=self.job_id, epoch=self.epoch, config=self.config, now=now,
            old_ready=self.old_ready, available=self.available, min_token=self.min_token,
        )  # fmt: skip


@_declare(M, HOST)
@dataclass(frozen=True, slots=True, kw_only=True)
class Recover(Command[int]):
    incarnation: int

    def apply(self, ledger: Ledger, now: float) -> int:
        return ledger.recover(self.incarnation, now=now)


@_declare(Q, HOST)
@dataclass(frozen=True, slots=True, kw_only=True)
class Figures(Command[dict[str, Any]]):
    def apply(self, ledger: Ledger, now: float) -> dict[str, Any]:
        return ledger.figures()


# ---------------------------------------------------------------------- the sweeper
@_declare(T, HOST)
@dataclass(frozen=True, slots=True, kw_only=True)
class Tick(Command[None]):
    def apply(self, ledger: Ledger, now: float) -> None:
        ledger.tick(now)


@_declare(T, HOST)
@dataclass(frozen=True, slots=True, kw_only=True)
class TakeDeletes(Command[list[DeleteWork]]):
    limit: int = 256

    def apply(self, ledger: Ledger, now: float) -> list[DeleteWork]:
        return ledger.take_deletes(now=now, limit=self.limit)


@_declare(M, HOST)
@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteDone(Command[bool]):
    partition: Partition | Sequence[Any]
    ok: bool
    error: str | None = None

    def apply(self, ledger: Ledger, now: float) -> bool:
        return ledger.delete_done(self.partition, ok=self.ok, now=now, error=self.error)


@_declare(T, HOST)
@dataclass(frozen=True, slots=True, kw_only=True)
class TakeFences(Command[list[FenceWork]]):
    limit: int = 256

    def apply(self, ledger: Ledger, now: float) -> list[FenceWork]:
        return ledger.take_fences(now=now, limit=self.limit)


@_declare(M, HOST)
@dataclass(frozen=True, slots=True, kw_only=True)
class FenceDone(Command[bool]):
    partition: Partition | Any
    generation: int
    ok: bool
    error: str | None = None

    def apply(self, ledger: Ledger, now: float) -> bool:
        return ledger.fence_done(
            self.partition, generation=self.generation, ok=self.ok, now=now, error=self.error
        )


MUTATING = frozenset(name for name, cls in _COMMANDS.items() if cls.kind is Kind.MUTATING)
"""The operations that change state (journaled)."""

CALLS = frozenset(name for name, cls in _COMMANDS.items() if cls.route is Route.CALL)
"""The client operations a remote caller may send as a plain call (Flight ``call``, the Ray actor's
``invoke``); ``acquire``, ``checkpoint`` and ``restore`` travel by their own routes."""


_W, _T, _R, _A = Role.WRITER, Role.TRAINER, Role.READER, Role.ADMIN
_ANY = (_W, _T, _R)
ROLES: Mapping[str, tuple[Role, ...]] = MappingProxyType(
    {
        "register_server": (_A,),
        "open_job": (_A,),
        "register_writer": (_W,),
        "announce_policy": (_T,),
        "ack_policy": (_W,),
        "policy_status": _ANY,
        "allocate": (_W,),
        "allocate_many": (_W,),
        "publish": (_W,),
        "publish_many": (_W,),
        "publish_ahead": (_W,),
        "abandon": (_W,),
        "group": _ANY,
        "acquire": (_T,),
        "renew": (_T,),
        "prepare": (_T,),
        "start_training": (_T,),
        "finish_training": (_T,),
        "commit": (_T,),
        "release": (_T,),
        "report_unusable": (_T,),
        "resolve": (_A,),
        "counts": _ANY,
        "usage": _ANY,
        "lease_groups": (_T, _R),
        "gc_list": (_A,),
        "fence_list": (_A,),
        "servers": _ANY,
        "lost": _ANY,
        "checkpoint": (_A,),
        "confirm_checkpoint": (_A,),
        "restore": (_A,),
    }
)
"""Client operation (every command a remote caller may send: route ``CALL`` or ``OWN``) -> the roles that
may run it (``admin`` runs all). Host-only commands have none: no caller may send them. An authenticating
host checks this table; ``docs/auth.md`` renders it."""


def client_call(name: object, kwargs: Mapping[str, Any]) -> Command[Any]:
    """The client operation ``name`` (one of :data:`CALLS`) with the keyword arguments ``kwargs``.

    Raises:
        InvalidRequestError: ``name`` is not such an operation (the known ones are listed), or it does not
            take those arguments.
    """
    if not isinstance(name, str) or name not in CALLS:
        raise InvalidRequestError(f"unknown controller operation {brief(name)}; known: {sorted(CALLS)}")
    return parse(name, kwargs)
