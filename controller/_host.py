"""The in-process host: the ledger behind a lock, with a sweeper thread that expires leases, runs deletes
and raises fences.

:class:`LocalController` serialises calls with one lock, wakes long-polling ``acquire`` calls when groups
become READY, and runs a daemon sweeper that applies expiries when they fall due (not only on the next
call) and executes the ledger's delete and fence work through the injected ``deleter`` and ``fencer``,
outside the lock. Use it as a context manager, or call :meth:`LocalController.close`.

A long-polling ``acquire`` waits at most :data:`MAX_WAIT` seconds (a longer ``wait`` is cut to it; the
client polls again, see ``ControllerClient.acquire``). It is woken and answered with
:class:`~trajflight.errors.UnavailableError` when the controller closes, and gives up (granting nothing,
or releasing what it had just been granted) as soon as its caller is gone (``abandoned``).

A call refused for capacity may wait too (``run(..., wait=)``, the route of a writer's ``allocate`` and
``allocate_many``): it is parked, asked again whenever the ledger's ``capacity_version`` moves (a delete
confirmed, a reservation given back, a server added), for at most :data:`MAX_WAIT` seconds, and then
answered with the refusal it got last. It is answered with UnavailableError when the controller closes or
its caller is gone (``abandoned``), and gives back the grants it was made as its caller left.

It does not guarantee fairness between long-polling acquirers (whoever wakes first takes the groups), nor
between writers waiting for capacity.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

from trajflight.errors import CapacityExceededError, DeadlineExceededError, TrajflightError, UnavailableError

from ._checkpoint import checkpoint_seq
from ._commands import (
    Abandon,
    Checkpoint,
    Command,
    ConfirmCheckpoint,
    DeleteDone,
    FenceDone,
    Figures,
    Release,
    TakeDeletes,
    TakeFences,
    Tick,
    parse,
)
from ._durable import BatchDeleter, HostCore, run_deletes
from ._entries import check_seconds
from ._fences import run_fences
from ._files import read_file, write_atomic
from ._metrics import ControllerMetrics
from ._records import DeleteWork, FenceWork, Lease, PutGrant

__all__ = ["MAX_WAIT", "POLL_CHECK", "LocalController", "check_timeout"]

R = TypeVar("R")
Deleter = Callable[[DeleteWork], None]
Fencer = Callable[[Sequence[FenceWork]], None]

MAX_WAIT = 20.0
"""Longest one long-polling call (``acquire``, or one waiting for capacity) waits on a host (seconds); a
longer ``wait`` is cut to it."""

POLL_CHECK = 0.1
"""How often a parked call looks whether its caller is gone (seconds)."""


def check_timeout(timeout: object) -> float | None:
    """``timeout`` (seconds) if it is ``None`` or a finite number >= 0; else InvalidRequestError."""
    return None if timeout is None else check_seconds(timeout, "timeout")


class LocalController:
    """The ledger hosted in this process, thread-safe.

    Args:
        deleter: Deletes one group from its storage server; raises on failure (the group stays on the GC
            list and is retried). ``None``: no storage servers, every delete is confirmed at once. Give
            it its own deadline: while it hangs, the sweeper waits (calls still expire leases lazily).
        fencer: Raises the generation of some groups of one storage server (the fences of one location,
            see :class:`~trajflight.controller.FenceWork`); raises on failure (retried with back-off).
            ``None``: every fence is confirmed at once. Give it its own deadline, as ``deleter``.
        clock: Wall-clock seconds given to the ledger as ``now``.
        state_dir: Journal and snapshot directory for crash recovery (see :mod:`._durable`); ``None``
            keeps state in memory only.
        sweep_interval: Longest sleep of the sweeper between passes (seconds).
        delete_batch: Most deletes handed out per sweeper pass.
        journal_fsync: fsync the journal after every call.
        start: Start the sweeper now (else on ``__enter__`` or :meth:`start`).
        batch_deleter: Runs every pass's deletes instead of ``deleter`` (an archive that writes
            committed groups before deleting them); see :class:`~._durable.BatchDeleter`.
    """

    def __init__(
        self,
        *,
        deleter: Deleter | None = None,
        fencer: Fencer | None = None,
        clock: Callable[[], float] = time.time,
        state_dir: str | os.PathLike[str] | None = None,
        sweep_interval: float = 0.05,
        delete_batch: int = 256,
        journal_fsync: bool = False,
        start: bool = True,
        batch_deleter: BatchDeleter | None = None,
    ) -> None:
        self._core = HostCore(clock=clock, state_dir=state_dir, fsync=journal_fsync)
        self._deleter = deleter
        self._batch_deleter = batch_deleter
        self._fencer = fencer
        self._sweep_interval = sweep_interval
        self._delete_batch = delete_batch
        self._cond = threading.Condition(threading.Lock())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._parked = 0
        self._waiting_for_capacity = 0
        self._core.metrics.watch(self._figures)
        if start:
            self.start()

    @property
    def metrics(self) -> ControllerMetrics:
        """This controller's Prometheus metrics (its own registry: serve ``metrics.registry``)."""
        return self._core.metrics

    def _figures(self) -> dict[str, Any]:
        """The ledger's figures for a scrape, read under the lock."""
        with self._cond:
            return self._core.run(Figures())

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the sweeper thread (idempotent)."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._sweep_loop, name="trajflight-sweeper", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the sweeper (waiting up to ``timeout``) and close the journal; later calls fail.

        Parked long-polling acquires are woken at once and answered with UnavailableError, so that a
        Flight control server in front of this controller can shut down without waiting them out.
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._cond:
            self._core.close()

    def wake(self) -> None:
        """Wake every parked long-polling acquire so that it looks again (at its ``abandoned`` check)."""
        with self._cond:
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        """Long-polling acquires parked right now (for operators and tests)."""
        return self._parked

    @property
    def waiting_for_capacity(self) -> int:
        """Calls parked right now until capacity comes back (for operators and tests)."""
        return self._waiting_for_capacity

    def __enter__(self) -> LocalController:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def incarnation(self) -> int:
        """The ledger's incarnation (one more after each recovery from ``state_dir``)."""
        return self._core.incarnation

    # ------------------------------------------------------------------ calls
    def _lock(self, deadline: float | None) -> None:
        if self._closed:
            raise UnavailableError("the controller is closed; start a new one")
        timeout = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._cond.acquire(timeout=timeout):
            raise DeadlineExceededError("the controller did not take the call before its deadline; retry")
        if self._closed:  # closed while this call waited for the lock: the journal is gone
            self._cond.release()
            raise UnavailableError("the controller is closed; start a new one")

    def call(self, method: str, kwargs: dict[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        """Run the operation ``method`` with ``kwargs`` (any command of :mod:`._commands`, the hosts' own
        included); see :meth:`run`.

        Raises:
            InvalidRequestError: ``method`` is not an operation, or does not take ``kwargs``.
            DeadlineExceededError, UnavailableError, TrajflightError: as :meth:`run`.
        """
        return self.run(parse(method, kwargs or {}), timeout=timeout)

    def run(
        self,
        command: Command[R],
        *,
        timeout: float | None = None,
        wait: float = 0.0,
        abandoned: Callable[[], bool] | None = None,
    ) -> R:
        """Run one command (``now`` is supplied by the host) before ``timeout`` seconds.

        With ``wait`` (seconds, cut to ``timeout`` and to :data:`MAX_WAIT`), a command refused for capacity
        is parked and run again whenever capacity comes back, until it is not refused or ``wait`` ends (then
        the last refusal is raised). ``abandoned`` (checked every :data:`POLL_CHECK` seconds while parked,
        and right after a grant) says that its caller is gone: the put grants of a command that succeeded
        as it left are abandoned at once. ``wait=0`` runs the command once, as every other call does.

        Raises:
            CapacityExceededError: refused for capacity, and none came back within ``wait``.
            DeadlineExceededError: the lock was not obtained in time (the call did not run).
            UnavailableError: the controller is closed (or closed while the call was parked), or the
                caller is gone (nothing was granted to it).
            InvalidRequestError: ``timeout`` or ``wait`` is not a finite number >= 0.
            TrajflightError: whatever the ledger raised.
        """
        timeout = check_timeout(timeout)
        wait = min(check_seconds(wait, "wait"), MAX_WAIT)
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        self._lock(deadline)
        try:
            if not wait:
                return self._apply(command)
            return self._await_capacity(
                command, start + (wait if timeout is None else min(wait, timeout)), abandoned
            )
        finally:
            self._cond.release()

    def _versions(self) -> tuple[int, int]:
        ledger = self._core.ledger
        return ledger.ready_version, ledger.capacity_version

    def _apply(self, command: Command[R]) -> R:
        """Run ``command`` (lock held) and wake parked calls when groups became READY or capacity freed."""
        before = self._versions()
        try:
            return self._core.run(command)
        finally:
            if self._versions() != before:
                self._cond.notify_all()

    def _await_capacity(self, command: Command[R], end: float, abandoned: Callable[[], bool] | None) -> R:
        """Run ``command`` (lock held) until capacity does not refuse it, parked between tries until the
        ledger's capacity version moves, at most until ``end`` (monotonic)."""
        self._waiting_for_capacity += 1
        try:
            while True:
                seen = self._core.ledger.capacity_version
                try:
                    result = self._apply(command)
                except CapacityExceededError:
                    while self._core.ledger.capacity_version == seen:
                        self._check_caller(abandoned)
                        remaining = end - time.monotonic()
                        if remaining <= 0:
                            raise
                        self._cond.wait(remaining if abandoned is None else min(remaining, POLL_CHECK))
                    self._check_caller(abandoned)
                    continue
                if abandoned is not None and abandoned():
                    self._abandon_grants(result)
                    self._check_caller(abandoned)
                return result
        finally:
            self._waiting_for_capacity -= 1

    def _check_caller(self, abandoned: Callable[[], bool] | None) -> None:
        """Raise UnavailableError when the controller closed or a parked call's caller is gone."""
        if self._closed:
            raise UnavailableError("the controller is shutting down; connect to its successor and put again")
        if abandoned is not None and abandoned():
            raise UnavailableError("the caller left (or its server is shutting down); nothing was granted")

    def _abandon_grants(self, result: object) -> None:
        """Give up the put grants in ``result`` (a grant or a list of them) of a caller that left; call
        with the lock held."""
        for grant in result if isinstance(result, list) else [result]:
            if isinstance(grant, PutGrant):
                with contextlib.suppress(TrajflightError):  # published or dropped meanwhile: nothing to give
                    self._apply(Abandon(partition=grant.partition, token=grant.token))

    def abandon_grants(self, result: object, *, timeout: float | None = None) -> None:
        """Give up at once the put grants in ``result`` (a grant or a list of them) made to a caller that
        is gone before it got them (a reply that could not be delivered); anything else is left alone."""
        self._lock(None if timeout is None else time.monotonic() + timeout)
        try:
            self._abandon_grants(result)
        finally:
            self._cond.release()

    def acquire(
        self,
        kwargs: dict[str, Any],
        *,
        wait: float = 0.0,
        timeout: float | None = None,
        abandoned: Callable[[], bool] | None = None,
    ) -> Lease | None:
        """Long-poll ``Ledger.acquire``: retry whenever groups become READY, for up to ``wait`` seconds.

        ``wait`` is cut to ``timeout`` and to :data:`MAX_WAIT`. ``abandoned`` (checked every
        :data:`POLL_CHECK` seconds while parked, and right before and after the grant) says that the
        caller is gone: nothing is granted to it then, and a lease granted just as it left is released
        at once (its groups go back to READY, at the front).

        Returns:
            The lease, or ``None`` when no eligible group became READY in time (or the caller is gone).

        Raises:
            UnavailableError: the controller is closed, or closed while this call was parked.
            DeadlineExceededError: the lock was not obtained before ``timeout``.
            InvalidRequestError: ``wait`` or ``timeout`` is not a finite number >= 0.
            TrajflightError: whatever the ledger raised.
        """
        wait = min(check_seconds(wait, "wait"), MAX_WAIT)
        timeout = check_timeout(timeout)
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        end = start + (wait if timeout is None else min(wait, timeout))
        self._lock(deadline)
        self._parked += 1
        command: Command[Lease | None] | None = None
        try:
            while True:
                if self._closed:
                    raise UnavailableError(
                        "the controller is shutting down; connect to its successor and lease again"
                    )
                if abandoned is not None and abandoned():
                    return None
                if command is None:
                    command = parse("acquire", kwargs)
                lease = self._apply(command)
                if lease is not None and abandoned is not None and abandoned():
                    self._give_back(lease)
                    return None
                remaining = end - time.monotonic()
                if lease is not None or remaining <= 0:
                    return lease
                remaining = self._core.poll_wait(remaining, self._sweep_interval)
                if abandoned is not None:
                    remaining = min(remaining, POLL_CHECK)
                self._cond.wait(remaining)
        finally:
            self._parked -= 1
            self._cond.release()

    def _give_back(self, lease: Lease) -> None:
        """Release a lease nobody will hold (its caller left); call with the lock held."""
        self._core.run(Release(token=lease.token))
        self._cond.notify_all()

    def release_abandoned(self, lease: Lease, *, timeout: float | None = None) -> None:
        """Release ``lease`` at once because its caller is gone before it got it (a lease granted to a
        long poll whose reply could not be delivered). A lease already moved on is left alone."""
        # Ended, committed or released meanwhile: nothing left to give back.
        with contextlib.suppress(TrajflightError):
            self.run(Release(token=lease.token), timeout=timeout)

    def checkpoint(
        self, job_id: str, path: str | os.PathLike[str] | None = None, *, timeout: float | None = None
    ) -> bytes:
        """Take the job's checkpoint; write it atomically to ``path`` when given. Returns its bytes.

        With ``path``, the checkpoint is confirmed durable once written (the commits it covers are then
        deleted); without, the caller keeps the bytes and calls ``confirm_checkpoint`` once they are safe.

        Raises:
            InvalidStateError: a group is LEASED..TRAINED. CheckpointError: the file could not be written
                (nothing is confirmed: kept commits stay kept).
        """
        data = self.run(Checkpoint(job_id=job_id), timeout=timeout)
        if path is not None:
            write_atomic(path, data)
            self.run(ConfirmCheckpoint(job_id=job_id, seq=checkpoint_seq(data)), timeout=timeout)
        return data

    def restore(
        self, source: bytes | str | os.PathLike[str], *, timeout: float | None = None, **kwargs: Any
    ) -> dict[str, int]:
        """Restore a job from checkpoint bytes or a file (see ``Ledger.restore`` for ``kwargs``).

        Raises:
            NotFoundError: no such file. CheckpointError, ConfigError, StaleFenceError: see the ledger.
        """
        data = source if isinstance(source, bytes) else read_file(source)
        out: dict[str, int] = self.call("restore", {"data": data, **kwargs}, timeout=timeout)
        return out

    # ------------------------------------------------------------------ sweeper
    def sweep(self) -> int:
        """One sweeper pass: apply due expiries, run due deletes and fences, report them. Returns the work
        items run (deletes plus fences)."""
        with self._cond:
            if self._closed:
                return 0
            before = self._versions()
            self._core.run(Tick())
            self._core.sample_timeline()
            work = self._core.run(TakeDeletes(limit=self._delete_batch))
            fences = self._core.run(TakeFences(limit=self._delete_batch))
            if self._versions() != before:
                self._cond.notify_all()
        held = self._batch_deleter is not None and self._batch_deleter.pending > 0
        if not work and not fences and not held:
            return 0
        fenced = run_fences(fences, self._fencer)
        results = self._run_deletes(work)
        with self._cond:
            if self._closed:
                return (
                    0  # closed meanwhile: the journal is gone; the work is handed out again after a restart
                )
            before = self._versions()
            for item, ok, error in results:
                self._core.run(DeleteDone(partition=item.partition, ok=ok, error=error))
            for fence, ok, error in fenced:
                self._core.run(
                    FenceDone(partition=fence.partition, generation=fence.generation, ok=ok, error=error)
                )
            if self._versions() != before:  # confirmed deletes freed capacity (or unparked groups)
                self._cond.notify_all()
        return len(work) + len(fences) + (len(results) if held else 0)

    def timeline(self) -> list[dict[str, Any]]:
        """The sweeper's samples of every job's counts, oldest first (see ``controller._timeline``)."""
        return self._core.timeline.samples()

    def _run_deletes(self, work: list[DeleteWork]) -> list[tuple[DeleteWork, bool, str | None]]:
        """Run a pass's deletes through the batch deleter when there is one, else one by one."""
        if self._batch_deleter is None:
            return run_deletes(work, self._deleter)
        try:
            return self._batch_deleter(work)
        except Exception:  # it must not raise; if it does, its work is handed out again after the timeout
            return []

    def _sweep_loop(self) -> None:
        while not self._stop.is_set():
            try:
                ran = self.sweep()
            except Exception:  # keep sweeping: a failure here must not silently stop expiry
                ran = 0
            if ran:
                continue
            with self._cond:
                nxt = self._core.ledger.next_deadline()
                now = self._core.clock()
            delay = self._sweep_interval if nxt is None else min(self._sweep_interval, max(0.0, nxt - now))
            self._stop.wait(delay)
