"""What both hosts share: applying calls to the ledger with the host's clock, the journal, and recovery.

A host with a state directory survives its own crash: every state-changing call is appended to
``journal-N.log`` (length, CRC-32, pickled ``(method, kwargs, now)``) after it ran, and every
``compact_every`` records the whole ledger is written to ``snapshot-(N+1).ckpt`` (atomically) and a new
journal started (the pair of files of one generation ``N`` always belong together). On start,
:class:`HostCore` loads the newest snapshot, replays its journal (the ledger is deterministic, so
replaying the same calls at the same ``now`` rebuilds the same state; a torn last record is ignored,
while a record that fails on replay, or a corrupt one before the last, stops the start with a
:class:`~trajflight.errors.RecoveryError`: only calls that succeeded are journaled, so either means the
replay diverged),
then starts a new incarnation so that new tokens exceed every old one, and ends every lease
that was live: LEASED/PREPARED groups go back to READY, TRAINING/TRAINED groups come back UNKNOWN.

Not journaled: queries, sweeper ticks, delete and fence hand-outs, refused calls and empty acquires (a job
checkpoint is journaled: it numbers the checkpoint and decides which commits are kept; so is an empty
acquire that parked groups of a storage server in back-off). None of
them changes state except by lazy expiry, and expiry is decided by the recorded deadlines: the next
journaled call applies every expiry due by its own ``now`` before acting, in the original order, so
replay reaches the same states (only the retry timing of deletes may differ). The ledger checks every
argument before it changes anything, so a refused call has no other effect. The journal is flushed to
the OS after each record, which survives a crash of the host process; set ``fsync=True`` to survive a
crash of the machine, at the cost of one fsync per call. It does not protect against two hosts sharing
one state directory.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from trajflight.errors import InvalidRequestError, RecoveryError

from ._files import write_atomic
from ._ledger import Ledger
from ._records import DeleteWork

__all__ = ["MUTATING", "QUERIES", "HostCore", "run_deletes"]

MUTATING = frozenset(
    {
        "register_server",
        "open_job",
        "register_writer",
        "announce_policy",
        "ack_policy",
        "allocate",
        "allocate_many",
        "publish",
        "publish_many",
        "acquire",
        "renew",
        "prepare",
        "start_training",
        "finish_training",
        "commit",
        "release",
        "resolve",
        "delete_done",
        "fence_done",
        "restore",
        "recover",
        "checkpoint",
        "confirm_checkpoint",
        "report_unusable",
    }
)
"""Ledger methods that change state and take ``now``: journaled."""

TIMED_UNJOURNALED = frozenset({"tick", "take_deletes", "take_fences"})
"""Ledger methods that take ``now`` but are not journaled (see the module docstring)."""

QUERIES = frozenset(
    {
        "counts",
        "usage",
        "lease_groups",
        "live_leases",
        "gc_list",
        "fence_list",
        "groups_in",
        "group",
        "servers",
        "policy_status",
        "is_quiescent",
        "next_deadline",
        "lost",
    }
)
"""Ledger methods that only read: no ``now``, not journaled."""

_RECORD = struct.Struct("<II")  # length, crc32


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
        self._fsync = fsync
        self._compact_every = compact_every
        self._records = 0
        self._journal: BinaryIO | None = None
        self.recovered_leases = 0
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

    @property
    def incarnation(self) -> int:
        """The ledger's current incarnation (increases by one per recovery)."""
        return self.ledger.incarnation

    def _replay(self, path: Path) -> None:
        """Replay the journal at ``path`` onto the ledger loaded from its snapshot.

        Raises:
            RecoveryError: a record that is not the last is corrupt, or a record fails on replay (only
                calls that succeeded are journaled, so the replay diverged from what happened).
        """
        if not path.exists():
            return
        data = path.read_bytes()
        pos, number = 0, 0
        while pos + _RECORD.size <= len(data):
            length, crc = _RECORD.unpack_from(data, pos)
            end = pos + _RECORD.size + length
            body = data[pos + _RECORD.size : end]
            number += 1
            if len(body) < length:
                break  # a torn last record: the call it describes never returned to its caller
            if zlib.crc32(body) != crc:
                if end == len(data):
                    break  # the last record, torn mid-write: its call never returned either
                raise _diverged(path, number, None, "its checksum does not match (the journal is corrupt)")
            pos = end
            try:
                method, kwargs, now = pickle.loads(body)
            except Exception as exc:  # a record with a valid checksum that does not decode
                raise _diverged(path, number, None, f"it does not decode ({_cut(exc)})") from exc
            if method not in MUTATING or not isinstance(kwargs, dict):
                raise _diverged(path, number, None, f"it names no journaled operation ({_cut(method)})")
            try:
                getattr(self.ledger, method)(now=now, **kwargs)
            except Exception as exc:  # journaled calls succeeded once: failing now means divergence
                raise _diverged(path, number, method, f"it raised {_cut(exc)}") from exc

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

    def apply(self, method: str, kwargs: dict[str, Any]) -> Any:
        """Run ledger ``method`` with ``kwargs`` (``now`` added for timed methods) and journal it.

        Raises:
            InvalidRequestError: ``method`` is not a ledger call.
            InvalidRequestError: also for arguments the method does not take.
            TrajflightError: whatever the ledger raised (not journaled; see the module docstring).
        """
        try:
            if method in QUERIES:
                return getattr(self.ledger, method)(**kwargs)
            if method in TIMED_UNJOURNALED:
                return getattr(self.ledger, method)(now=self.clock(), **kwargs)
        except TypeError as exc:
            raise InvalidRequestError(f"bad arguments for {method}: {exc}") from exc
        if method not in MUTATING:
            raise InvalidRequestError(f"{method!r} is not a controller call")
        now = self.clock()
        parks = self.ledger.parks
        try:
            result = getattr(self.ledger, method)(now=now, **kwargs)
        except TypeError as exc:
            raise InvalidRequestError(f"bad arguments for {method}: {exc}") from exc
        # An empty acquire changed nothing, unless it parked groups of a server in back-off.
        if result is not None or method != "acquire" or self.ledger.parks != parks:
            self._record(method, kwargs, now)
        return result

    def _record(self, method: str, kwargs: dict[str, Any], now: float) -> None:
        if self._journal is None:
            return
        body = pickle.dumps((method, kwargs, now), protocol=pickle.HIGHEST_PROTOCOL)
        self._journal.write(_RECORD.pack(len(body), zlib.crc32(body)) + body)
        self._journal.flush()
        if self._fsync:
            os.fsync(self._journal.fileno())
        self._records += 1
        if self._records >= self._compact_every:
            self.compact()


def _cut(value: object, limit: int = 200) -> str:
    """``value`` for an error message, cut to ``limit`` characters (an exception's text, or a name)."""
    text = f"{type(value).__name__}: {value}" if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _diverged(path: Path, number: int, method: str | None, why: str) -> RecoveryError:
    """The error of a journal that cannot be replayed: the host must not start on it."""
    what = f"record {number}" + (f" ({method})" if method else "")
    return RecoveryError(
        f"journal {path}: {what} cannot be replayed: {why}. The ledger would diverge from what happened, "
        "so the controller refuses to start: move the state directory aside and restore the jobs from "
        "their checkpoints into a fresh one",
        path=str(path),
        record=number,
        method=method,
    )


def _latest_seq(state_dir: Path) -> int:
    """The newest snapshot generation in ``state_dir`` (0 when there is none)."""
    seqs = [0]
    for path in state_dir.glob("snapshot-*.ckpt"):
        with contextlib.suppress(ValueError):
            seqs.append(int(path.stem.split("-", 1)[1]))
    return max(seqs)


def run_deletes(
    work: list[DeleteWork], deleter: Callable[[DeleteWork], None] | None
) -> list[tuple[DeleteWork, bool, str | None]]:
    """Run each delete with ``deleter`` (no deleter: every delete succeeds at once); never raises.

    A deleter signals failure by raising; a storage server that no longer has the group must not raise.
    """
    out: list[tuple[DeleteWork, bool, str | None]] = []
    for item in work:
        if deleter is None:
            out.append((item, True, None))
            continue
        try:
            deleter(item)
        except Exception as exc:  # any failure keeps the group on the GC list; it is retried later
            out.append((item, False, f"{type(exc).__name__}: {exc}"))
        else:
            out.append((item, True, None))
    return out
