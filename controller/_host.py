"""The in-process host: the ledger behind a lock, with a sweeper thread that expires leases, runs deletes
and raises fences.

:class:`LocalController` serialises calls with one lock, wakes long-polling ``acquire`` calls when groups
become READY, and runs a daemon sweeper that applies expiries when they fall due (not only on the next
call) and executes the ledger's delete and fence work through the injected ``deleter`` and ``fencer``,
outside the lock. Use it as a context manager, or call :meth:`LocalController.close`.

It does not guarantee fairness between long-polling acquirers (whoever wakes first takes the groups).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from trajflight.errors import DeadlineExceededError, InvalidRequestError, UnavailableError

from ._checkpoint import read_file, write_atomic
from ._durable import HostCore, run_deletes
from ._fences import run_fences
from ._records import DeleteWork, FenceWork, Lease

__all__ = ["LocalController"]

Deleter = Callable[[DeleteWork], None]
Fencer = Callable[[Sequence[FenceWork]], None]


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
    ) -> None:
        self._core = HostCore(clock=clock, state_dir=state_dir, fsync=journal_fsync)
        self._deleter = deleter
        self._fencer = fencer
        self._sweep_interval = sweep_interval
        self._delete_batch = delete_batch
        self._cond = threading.Condition(threading.Lock())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        if start:
            self.start()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the sweeper thread (idempotent)."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._sweep_loop, name="trajflight-sweeper", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the sweeper (waiting up to ``timeout``) and close the journal; later calls fail."""
        self._closed = True
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._cond:
            self._core.close()

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

    def call(self, method: str, kwargs: dict[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        """Run one ledger call (``now`` is supplied by the host) before ``timeout`` seconds.

        Raises:
            DeadlineExceededError: the lock was not obtained in time (the call did not run).
            UnavailableError: the controller is closed.
            TrajflightError: whatever the ledger raised.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        self._lock(deadline)
        try:
            before = self._core.ledger.ready_version
            try:
                return self._core.apply(method, kwargs or {})
            finally:
                if self._core.ledger.ready_version != before:
                    self._cond.notify_all()
        finally:
            self._cond.release()

    def acquire(
        self, kwargs: dict[str, Any], *, wait: float = 0.0, timeout: float | None = None
    ) -> Lease | None:
        """Long-poll ``Ledger.acquire``: retry whenever groups become READY, for up to ``wait`` seconds.

        Returns ``None`` when no eligible group became READY in time. ``wait`` is cut to ``timeout``.

        Raises:
            DeadlineExceededError: the lock was not obtained before ``timeout``.
            TrajflightError: whatever the ledger raised.
        """
        if wait < 0:
            raise InvalidRequestError(f"wait must be >= 0 seconds, got {wait!r}")
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        end = start + (wait if timeout is None else min(wait, timeout))
        self._lock(deadline)
        try:
            while True:
                lease: Lease | None = self._core.apply("acquire", kwargs)
                remaining = end - time.monotonic()
                if lease is not None or remaining <= 0 or self._closed:
                    return lease
                ledger = self._core.ledger
                nxt = ledger.next_deadline()
                if nxt is not None:
                    remaining = min(remaining, max(0.001, nxt - self._core.clock()))
                self._cond.wait(remaining)
        finally:
            self._cond.release()

    def checkpoint(
        self, job_id: str, path: str | os.PathLike[str] | None = None, *, timeout: float | None = None
    ) -> bytes:
        """Take the job's checkpoint; write it atomically to ``path`` when given. Returns its bytes.

        Raises:
            InvalidStateError: a group is LEASED..TRAINED. CheckpointError: the file could not be written.
        """
        data: bytes = self.call("checkpoint", {"job_id": job_id}, timeout=timeout)
        if path is not None:
            write_atomic(path, data)
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
            before = self._core.ledger.ready_version
            self._core.apply("tick", {})
            work = self._core.apply("take_deletes", {"limit": self._delete_batch})
            fences = self._core.apply("take_fences", {"limit": self._delete_batch})
            if self._core.ledger.ready_version != before:
                self._cond.notify_all()
        if not work and not fences:
            return 0
        fenced = run_fences(fences, self._fencer)
        results = run_deletes(work, self._deleter)
        with self._cond:
            for item, ok, error in results:
                self._core.apply("delete_done", {"partition": item.partition, "ok": ok, "error": error})
            for fence, ok, error in fenced:
                self._core.apply(
                    "fence_done",
                    {"partition": fence.partition, "generation": fence.generation, "ok": ok, "error": error},
                )
        return len(work) + len(fences)

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
