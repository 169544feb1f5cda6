"""Threads kept for :func:`~trajflight.flight_server.run_parallel`, so that a call to several servers
starts no thread.

A lease or a read of two servers used to start a ``ThreadPoolExecutor`` (and its threads) per call: about
2 ms of a lease of 64 groups here (BENCHMARKS.md, "Where the time goes (issue 16)"). :class:`Workers`
keeps idle threads instead, and hands every submitted call a thread of its own: an idle one it claims, or
a new one when none is idle, so a call never queues behind another (no deadlock when a call submits calls
itself) and as many calls overlap as are submitted. A thread idle for :data:`IDLE_EXIT` seconds ends. In a
forked child the parent's threads are gone: the child starts with none.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["IDLE_EXIT", "Workers", "shared_workers"]

T = TypeVar("T")

IDLE_EXIT = 60.0
"""Seconds an idle worker thread waits for a call before it ends."""


class Workers:
    """Kept daemon threads, one per call in flight. Thread-safe.

    Args:
        name: Prefix of the threads' names.
        idle_exit: Seconds an idle thread waits for a call before it ends.
    """

    def __init__(self, name: str = "trajflight-call", idle_exit: float = IDLE_EXIT) -> None:
        self.name = name
        self.idle_exit = idle_exit
        self._lock = threading.Lock()
        self._tasks: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._idle = 0  # threads waiting for a call and not yet claimed by a submitted one
        self._started = 0

    @property
    def started(self) -> int:
        """Threads started so far (for tests: calls in turn reuse them)."""
        return self._started

    def submit(self, call: Callable[[], T]) -> Future[T]:
        """Run ``call`` on a thread of its own (an idle one, else a new one); its future."""
        future: Future[T] = Future()
        with self._lock:
            if self._idle:
                self._idle -= 1  # claimed: this thread will take a call, this one or another's
            else:
                self._started += 1
                threading.Thread(target=self._loop, name=f"{self.name}-{self._started}", daemon=True).start()
        self._tasks.put((call, future))
        return future

    def _loop(self) -> None:
        while True:
            try:
                task = self._tasks.get(timeout=self.idle_exit)
            except queue.Empty:
                with self._lock:
                    if self._idle:  # not claimed meanwhile: end; else a call is on its way to this thread
                        self._idle -= 1
                        return
                continue
            if task is None:
                return
            call, future = task
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as exc:  # handed to the caller through the future
                    future.set_exception(exc)
            del call, future, task
            with self._lock:
                self._idle += 1

    def reset(self) -> None:
        """Forget every thread (a forked child has none of its parent's); later calls start new ones."""
        self._lock = threading.Lock()
        self._tasks = queue.SimpleQueue()
        self._idle = 0


_SHARED = Workers()
os.register_at_fork(after_in_child=_SHARED.reset)


def shared_workers() -> Workers:
    """The process's kept threads for :func:`~trajflight.flight_server.run_parallel`."""
    return _SHARED
