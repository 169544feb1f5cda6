"""What both hosts share: running commands on the ledger with the host's clock, the journal, and recovery.

A host with a state directory survives its own crash: every state-changing command is appended to
``journal-N.log`` (one versioned, checksummed JSON record each, see :mod:`._journal`) after it ran, and
every ``compact_every`` records the whole ledger is written to ``snapshot-(N+1).ckpt`` (atomically) and a
new journal started (the pair of files of one generation ``N`` always belong together). On start,
:class:`HostCore` loads the newest snapshot, replays its journal (the ledger is deterministic, so
replaying the same commands at the same ``now`` rebuilds the same state; a torn last record is ignored,
while a record that fails on replay, or a corrupt one before the last, stops the start with a
:class:`~trajflight.errors.RecoveryError`: only commands that succeeded are journaled, so either means the
replay diverged), then starts a new incarnation so that new tokens exceed every old one, and ends every
lease that was live: LEASED/PREPARED groups go back to READY, TRAINING/TRAINED groups come back UNKNOWN.

What is journaled follows each command's declared kind (:mod:`._commands`): ``MUTATING`` commands are,
queries and ``TIMED`` ones (sweeper ticks, delete and fence hand-outs) are not, nor are refused commands
and empty acquires (a job checkpoint is journaled: it numbers the checkpoint and decides which commits
are kept; so is an empty acquire that parked groups of a storage server in back-off). None of the
unjournaled ones changes state except by lazy expiry, and expiry is decided by the recorded deadlines:
the next journaled command applies every expiry due by its own ``now`` before acting, in the original
order, so replay reaches the same states (only the retry timing of deletes may differ). The ledger checks
every argument before it changes anything, so a refused command has no other effect; a command whose
arguments the journal cannot record is refused before it runs. The journal is flushed to the OS after
each record, which survives a crash of the host process; set ``fsync=True`` to survive a crash of the
machine, at the cost of one fsync per command. It does not protect against two hosts sharing one state
directory.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

from trajflight.errors import InvalidRequestError, brief

from . import _journal
from ._commands import Acquire, Command, Kind, parse
from ._files import write_atomic
from ._ledger import Ledger
from ._metrics import ControllerMetrics
from ._records import DeleteWork
from ._timeline import Timeline

__all__ = ["BatchDeleter", "DeleteOutcome", "GroupDeletes", "HostCore", "delete_failure", "run_deletes"]

R = TypeVar("R")

DeleteOutcome = tuple[DeleteWork, bool, str | None]
"""One delete's outcome, as the host takes it: the work, whether it succeeded, and why not."""


class HostCore:
    """A ledger plus its host's clock and (optionally) its journal. Not thread-safe: hosts serialise.

    Args:
        clock: Wall-clock seconds (``time.time``): deadlines survive a restart in another process.
        state_dir: Directory for ``snapshot-N.ckpt`` and ``journal-N.log``; ``None`` keeps state in memory
            only (a restart starts empty).
        fsync: fsync the journal after every record.
        compact_every: Journal records between snapshots.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        state_dir: str | os.PathLike[str] | None = None,
        fsync: bool = False,
        compact_every: int = 20000,
    ) -> None:
        self.clock = clock
        self.metrics = ControllerMetrics()
        """Prometheus metrics of the calls run here; the host registers the ledger collector."""
        self._fsync = fsync
        self._compact_every = compact_every
        self._records = 0
        self._journal: BinaryIO | None = None
        self.recovered_leases = 0
        self.timeline = Timeline()
        if state_dir is None:
            self._dir: Path | None = None
            self.ledger = Ledger()
            return
        self._dir = Path(state_dir)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._seq = _latest_seq(self._dir)
        snap = self._dir / f"snapshot-{self._seq}.ckpt"
        if snap.exists():
            self.ledger = Ledger.from_snapshot(snap.read_bytes(), source=str(snap))
        else:
            self.ledger = Ledger()
        self._replay(self._dir / f"journal-{self._seq}.log")
        now = self.clock()
        self.recovered_leases = self.ledger.recover(self.ledger.incarnation + 1, now=now)
        self.compact()

    def poll_wait(self, remaining: float, overdue: float) -> float:
        """How long a parked long poll may sleep before it looks again: at most ``remaining``, and no
        later than the ledger's next deadline still ahead (a lease or grant ending may free groups).

        A deadline already past is the sweeper's to apply, and the host notifies its waiters when the
        sweeper changes anything; such a deadline bounds the sleep by ``overdue`` (the sweeper's
        interval) rather than making the poll spin while, say, a slow delete holds the sweeper.
        """
        nxt = self.ledger.next_deadline()
        if nxt is None:
            return remaining
        ahead = nxt - self.clock()
        return min(remaining, max(0.001, ahead) if ahead > 0 else overdue)

    @property
    def incarnation(self) -> int:
        """The ledger's current incarnation (increases by one per recovery)."""
        return self.ledger.incarnation

    def _replay(self, path: Path) -> None:
        """Replay the journal at ``path`` onto the ledger loaded from its snapshot.

        Raises:
            RecoveryError: a record that is not the last is corrupt, a record does not decode (or is of
                the pickle format of older releases), or a record fails on replay (only commands that
                succeeded are journaled, so the replay diverged from what happened).
        """
        if not path.exists():
            return
        for number, command, now in _journal.records(path.read_bytes(), str(path)):
            try:
                command.apply(self.ledger, now)
            except Exception as exc:  # journaled commands succeeded once: failing now means divergence
                raise _journal.diverged(
                    str(path), number, command.name, f"it raised {type(exc).__name__}: {brief(str(exc))}"
                ) from exc

    def compact(self) -> None:
        """Write a snapshot of the ledger and start an empty journal (no-op without a state directory).

        Snapshot ``n + 1`` is written (atomically) before journal ``n + 1`` is created and the files of
        ``n`` are removed, so a crash at any point leaves either snapshot ``n`` with its journal, or
        snapshot ``n + 1`` alone: no journal record is ever replayed on top of a snapshot that has it.
        """
        if self._dir is None:
            return
        old = self._seq
        self._seq += 1
        write_atomic(self._dir / f"snapshot-{self._seq}.ckpt", self.ledger.snapshot())
        if self._journal is not None:
            self._journal.close()
        self._journal = open(self._dir / f"journal-{self._seq}.log", "wb")  # noqa: SIM115 - held for appends
        self._records = 0
        for stale in (self._dir / f"journal-{old}.log", self._dir / f"snapshot-{old}.ckpt"):
            stale.unlink(missing_ok=True)

    def close(self) -> None:
        """Close the journal (state stays on disk)."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def sample_timeline(self) -> None:
        """Add every job's counts to :attr:`timeline` when a sample is due (the sweeper calls this)."""
        ledger = self.ledger

        def counts() -> dict[str, dict[str, int]]:  # zeros left out: most states are empty most of the time
            return {j: {k: v for k, v in ledger.counts(j).items() if v} for j in ledger.job_ids}

        self.timeline.sample(self.clock(), counts)

    def apply(self, method: str, kwargs: dict[str, Any]) -> Any:
        """Run the operation ``method`` with ``kwargs`` (see :meth:`run`).

        Raises:
            InvalidRequestError: ``method`` is not a controller operation, or does not take ``kwargs``.
            TrajflightError: whatever the ledger raised (not journaled; see the module docstring).
        """
        return self.run(parse(method, kwargs))

    def run(self, command: Command[R]) -> R:
        """Run ``command`` on the ledger (``now`` from the host's clock for timed and mutating ones) and
        journal it when it changed state.

        Raises:
            InvalidRequestError: an argument the command does not take, or that the journal cannot record.
            TrajflightError: whatever the ledger raised (not journaled; see the module docstring).
        """
        kind = command.kind
        now = 0.0 if kind is Kind.QUERY else self.clock()
        record = None if kind is not Kind.MUTATING or self._journal is None else _journal.encode(command, now)
        acquire = record is not None and isinstance(command, Acquire)
        parks = self.ledger.parks if acquire else 0
        try:
            result = self.metrics.run(command, self.ledger, now)
        except TypeError as exc:  # a value of a type the ledger cannot even compare: the caller's mistake
            raise InvalidRequestError(f"bad arguments for {command.name}: {brief(str(exc))}") from exc
        # An empty acquire changed nothing, unless it parked groups of a server in back-off.
        if record is not None and (not acquire or result is not None or self.ledger.parks != parks):
            self._record(record)
        return result

    def _record(self, record: bytes) -> None:
        if self._journal is None:
            return
        self._journal.write(record)
        self._journal.flush()
        if self._fsync:
            os.fsync(self._journal.fileno())
        self._records += 1
        if self._records >= self._compact_every:
            self.compact()


def _latest_seq(state_dir: Path) -> int:
    """The newest snapshot generation in ``state_dir`` (0 when there is none)."""
    seqs = [0]
    for path in state_dir.glob("snapshot-*.ckpt"):
        with contextlib.suppress(ValueError):
            seqs.append(int(path.stem.split("-", 1)[1]))
    return max(seqs)


def delete_failure(exc: BaseException) -> str:
    """The error text of a failed delete, as every deleter reports it: ``"Type: message"``."""
    return f"{type(exc).__name__}: {exc}"


def run_deletes(work: list[DeleteWork], deleter: Callable[[DeleteWork], None] | None) -> list[DeleteOutcome]:
    """Run each delete with ``deleter`` (no deleter: every delete succeeds at once); never raises.

    A deleter signals failure by raising; a storage server that no longer has the group must not raise.
    """
    out: list[DeleteOutcome] = []
    for item in work:
        if deleter is None:
            out.append((item, True, None))
            continue
        try:
            deleter(item)
        except Exception as exc:  # any failure keeps the group on the GC list; it is retried later
            out.append((item, False, delete_failure(exc)))
        else:
            out.append((item, True, None))
    return out


class BatchDeleter(Protocol):
    """Runs each sweeper pass's deletes itself, and may hold some back to batch them (an archive writes
    committed groups before it deletes them). The host calls it every pass while it holds any.

    A held delete is reported in a later pass; one never reported is handed out again after the GC
    list's timeout, so a batch deleter that dies loses nothing.
    """

    @property
    def pending(self) -> int:
        """Deletes held back, not yet reported."""
        ...

    def __call__(self, work: list[DeleteWork]) -> list[DeleteOutcome]:
        """Run ``work`` (possibly empty); return the outcome of every delete finished now, this pass's or
        an earlier one's; never raises."""
        ...


class GroupDeletes:
    """The batch deleter of a host without an archive: each pass's deletes go at once, all together, to
    ``delete_groups`` (``StoragePool.delete_groups``: one call per server), rather than one call per
    group; it holds nothing back.

    Args:
        delete_groups: Deletes many groups; returns ``(work, ok, error)`` per item in order and never
            raises (as :func:`run_deletes` reports).
    """

    pending = 0
    """It holds no delete back."""

    def __init__(self, delete_groups: Callable[[Sequence[DeleteWork]], list[DeleteOutcome]]) -> None:
        self._delete_groups = delete_groups

    def __call__(self, work: list[DeleteWork]) -> list[DeleteOutcome]:
        """Run ``work`` in one batch; never raises (a raising ``delete_groups`` fails every item)."""
        if not work:
            return []
        try:
            return self._delete_groups(work)
        except Exception as exc:  # the protocol's promise: the groups stay on the GC list and are retried
            return [(w, False, delete_failure(exc)) for w in work]
