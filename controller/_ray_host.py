"""The Ray host: the ledger inside a named, asynchronous Ray actor, one namespace per deployment.

The actor runs on an asyncio loop: each ledger call runs to completion between two awaits (so calls are
serialised without a lock) and a long-polling ``acquire`` awaits an event instead of blocking, so other
callers proceed while it waits, for at most :data:`~._host.MAX_WAIT` seconds (a longer ``wait`` is cut
to it; the client polls again); an ``invoke`` with a ``wait`` refused for capacity awaits the same event
and runs again whenever the ledger's ``capacity_version`` moves (``LocalController.run``). A caller that
gives up (the client's deadline cancels the call) is cancelled at its await, granted nothing.
:meth:`ControllerActor.close` answers parked calls with UnavailableError before the actor is killed. A
sweeper task applies expiries as they fall due and runs deletes and fences through the injected
``deleter`` and ``fencer`` in a worker thread.

Metrics: the actor keeps the controller's Prometheus registry (``controller._metrics``) as the in-process
host does, and serves it through the endpoint the injected ``metrics`` factory makes (``info`` names its
URL). A scrape reads the ledger on the actor's event loop, which serialises it with every call.

Crash recovery: with ``state_dir`` the actor journals every state-changing call (see :mod:`._durable`);
Ray restarts it up to ``max_restarts`` times and the constructor, which Ray re-runs, reloads the snapshot,
replays the journal, persists a new incarnation (so tokens keep increasing) and ends the leases that were
live: TRAINING/TRAINED groups come back UNKNOWN. The state directory must be on the node where Ray
restarts the actor (pin it with a node-affinity scheduling strategy on a multi-node cluster).

The actor serves the client operations of :mod:`._commands`: ``invoke`` and ``invoke_many`` the commands whose
route is ``CALL`` (as the Flight endpoint does), ``acquire``, ``checkpoint`` and ``restore`` (route ``OWN``)
with methods of their own; the ``HOST`` commands are its sweeper's. Ray is imported only when this
module's functions are called. Ledger errors travel back as values and are raised again by the client with
their own class: Ray's exception wrapping never reaches the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry

from trajflight import logs
from trajflight.errors import CapacityExceededError, TrajflightError, UnavailableError

from ._checkpoint import checkpoint_seq
from ._commands import (
    Checkpoint,
    Command,
    ConfirmCheckpoint,
    DeleteDone,
    FenceDone,
    Figures,
    TakeDeletes,
    TakeFences,
    Tick,
    client_call,
    parse,
)
from ._durable import BatchDeleter, HostCore, run_deletes
from ._entries import check_seconds
from ._fences import run_fences
from ._files import read_file, write_atomic
from ._host import MAX_WAIT
from ._records import DeleteWork, FenceWork

__all__ = [
    "DEFAULT_NAME",
    "DEFAULT_NAMESPACE",
    "ControllerActor",
    "MetricsServer",
    "import_ray",
    "ray_actor_class",
    "start_ray_actor",
]

DEFAULT_NAME = "trajflight-controller"
DEFAULT_NAMESPACE = "trajflight"

Reply = tuple[str, Any]
R = TypeVar("R")

SCRAPE_TIMEOUT = 10.0
"""Longest a scrape waits for the actor's event loop to read the ledger, seconds."""


class MetricsServer(Protocol):
    """What the actor's ``metrics`` factory makes: an endpoint serving the registry it was given."""

    @property
    def url(self) -> str:
        """What Prometheus scrapes (``http://host:port/metrics``)."""
        ...

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        ...


def import_ray() -> Any:
    """Import ray, or fail with an install hint."""
    try:
        import ray
    except ImportError:
        raise UnavailableError("the Ray host needs ray: pip install 'trajflight[ray]'") from None
    return ray


class ControllerActor:
    """The body of the Ray actor (wrapped by :func:`ray_actor_class`); usable directly in tests.

    Args:
        state_dir: Journal and snapshot directory; ``None`` loses state on restart.
        deleter: Deletes one group from its storage server (must be picklable for Ray); raises on
            failure. ``None``: every delete is confirmed at once. Give it its own deadline: while it
            hangs, the sweeper waits (calls still expire leases lazily).
        sweep_interval: Longest sleep of the sweeper (seconds).
        delete_batch: Most deletes (and fences) per sweeper pass.
        journal_fsync: fsync the journal after every call.
        fencer: Raises the generation of the fences of one storage server location (picklable); raises on
            failure. ``None``: every fence is confirmed at once.
        batch_deleter: Picklable factory, called once in the actor, of a
            :class:`~._durable.BatchDeleter` that runs every pass's deletes instead of ``deleter`` (an
            archive); made again when Ray restarts the actor.
        metrics: Picklable factory, called once in the actor with its Prometheus registry, of the
            endpoint that serves it (made again when Ray restarts the actor; a fixed port is bound
            again). ``None``: the metrics are kept, not served. Its errors (a port in use) fail the
            actor's start.
    """

    def __init__(
        self,
        state_dir: str | None = None,
        deleter: Callable[[DeleteWork], None] | None = None,
        sweep_interval: float = 0.05,
        delete_batch: int = 256,
        journal_fsync: bool = False,
        fencer: Callable[[Sequence[FenceWork]], None] | None = None,
        batch_deleter: Callable[[], BatchDeleter] | None = None,
        metrics: Callable[[CollectorRegistry], MetricsServer] | None = None,
    ) -> None:
        logs.setup_from_env()  # the actor's entry: RayCluster(log_level=) sets the environment
        self._core = HostCore(clock=time.time, state_dir=state_dir, fsync=journal_fsync)
        self._loop = _running_loop()  # Ray runs an async actor's constructor on its loop; else the first call
        self._core.metrics.watch(self._figures)
        self._deleter = deleter
        self._batch_deleter = None if batch_deleter is None else batch_deleter()
        self._fencer = fencer
        self._closing = False
        self._sweep_interval = sweep_interval
        self._delete_batch = delete_batch
        self._changed: asyncio.Event | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._metrics = None if metrics is None else metrics(self._core.metrics.registry)

    def _ensure_started(self) -> asyncio.Event:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if self._changed is None:
            self._changed = asyncio.Event()
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())
        return self._changed

    def _apply(self, command: Command[R]) -> R:
        event = self._ensure_started()
        ledger = self._core.ledger
        before = ledger.ready_version, ledger.capacity_version
        try:
            return self._core.run(command)
        finally:
            if (ledger.ready_version, ledger.capacity_version) != before:
                event.set()
                self._changed = asyncio.Event()

    def _figures(self) -> dict[str, Any]:
        """The ledger's figures for a scrape: read on the actor's event loop, where every ledger call
        runs (from the endpoint's thread, waiting at most :data:`SCRAPE_TIMEOUT`); directly on the loop's
        own thread (registering the collector describes it in the constructor) or before any loop is
        known (an actor used outside Ray, before its first call)."""
        loop = self._loop
        if loop is None or _running_loop() is loop:
            return self._core.run(Figures())
        return asyncio.run_coroutine_threadsafe(self._read_figures(), loop).result(SCRAPE_TIMEOUT)

    async def _read_figures(self) -> dict[str, Any]:
        return self._core.run(Figures())

    async def invoke(self, method: str, kwargs: dict[str, Any], wait: float = 0.0) -> Reply:
        """Run one client operation (a command of route ``CALL``); reply ``("ok", result)`` or
        ``("err", TrajflightError)``. With ``wait`` (seconds, at most :data:`~._host.MAX_WAIT`), one
        refused for capacity awaits capacity and runs again whenever some is released, until ``wait``
        ends (then the last refusal is the reply)."""
        try:
            command = client_call(method, kwargs)
            wait = min(check_seconds(wait, "wait"), MAX_WAIT)
            return ("ok", await self._await_capacity(command, time.monotonic() + wait))
        except TrajflightError as exc:
            return ("err", exc)

    async def _await_capacity(self, command: Command[R], end: float) -> R:
        """Run ``command`` until capacity does not refuse it, awaiting a release between tries, at most
        until ``end`` (monotonic; in the past: one try)."""
        ledger = self._core.ledger
        while True:
            seen = ledger.capacity_version
            try:
                return self._apply(command)
            except CapacityExceededError:
                while ledger.capacity_version == seen:
                    remaining = end - time.monotonic()
                    if self._closing:
                        raise UnavailableError(
                            "the controller is shutting down; put again once it is back"
                        ) from None
                    if remaining <= 0:
                        raise
                    event = self._ensure_started()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(event.wait(), remaining)

    async def invoke_many(self, calls: list[tuple[str, dict[str, Any]]]) -> list[Reply]:
        """Run several client operations in order, in one actor call (each reply as for :meth:`invoke`)."""
        out: list[Reply] = []
        for method, kwargs in calls:
            out.append(await self.invoke(method, kwargs))
        return out

    async def acquire(self, kwargs: dict[str, Any], wait: float) -> Reply:
        """Long-poll acquire: retry whenever groups become READY, for up to ``wait`` seconds (at most
        :data:`~._host.MAX_WAIT`); ``("err", UnavailableError)`` once :meth:`close` was called."""
        try:
            wait = min(check_seconds(wait, "wait"), MAX_WAIT)
        except TrajflightError as exc:
            return ("err", exc)
        end = time.monotonic() + wait
        command: Command[Any] | None = None
        while True:
            if self._closing:
                return (
                    "err",
                    UnavailableError("the controller is shutting down; lease again once it is back"),
                )
            try:
                if command is None:
                    command = parse("acquire", kwargs)
                lease = self._apply(command)
            except TrajflightError as exc:
                return ("err", exc)
            remaining = end - time.monotonic()
            if lease is not None or remaining <= 0:
                return ("ok", lease)
            remaining = self._core.poll_wait(remaining, self._sweep_interval)
            event = self._ensure_started()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)

    async def close(self) -> None:
        """Answer every parked acquire with UnavailableError and stop serving metrics (call it before
        killing the actor)."""
        self._closing = True
        event = self._ensure_started()
        event.set()
        self._changed = asyncio.Event()
        await asyncio.sleep(0)  # let the woken acquires answer
        if self._metrics is not None:  # off the loop: a scrape in flight waits on it for the ledger
            await asyncio.to_thread(self._metrics.close)

    async def checkpoint(self, job_id: str, path: str | None) -> Reply:
        """Take a job checkpoint; write it (atomically, on the actor's node) to ``path`` when given, and
        then confirm it durable (see ``LocalController.checkpoint``)."""
        try:
            data: bytes = self._apply(Checkpoint(job_id=job_id))
            if path is not None:
                write_atomic(path, data)
                self._apply(ConfirmCheckpoint(job_id=job_id, seq=checkpoint_seq(data)))
            return ("ok", data)
        except TrajflightError as exc:
            return ("err", exc)

    async def restore(self, source: bytes | str, kwargs: dict[str, Any]) -> Reply:
        """Restore a job from checkpoint bytes or a file on the actor's node."""
        try:
            data = source if isinstance(source, bytes) else read_file(source)
            return ("ok", self._apply(parse("restore", {"data": data, **kwargs})))
        except TrajflightError as exc:
            return ("err", exc)

    async def info(self) -> dict[str, Any]:
        """Incarnation, pid, how many leases the last recovery ended, the metrics endpoint's URL (None
        without one), and the timeline of every job's counts (``controller._timeline``), for operators,
        tests and reports."""
        self._ensure_started()
        return {
            "incarnation": self._core.incarnation,
            "pid": os.getpid(),
            "metrics": None if self._metrics is None else self._metrics.url,
            "recovered_leases": self._core.recovered_leases,
            "timeline": self._core.timeline.samples(),
            **self._archive_info(),
        }

    def _archive_info(self) -> dict[str, Any]:
        """``{"archive": status}`` when the batch deleter reports one (an archive), else nothing."""
        status = getattr(self._batch_deleter, "status", None)
        return {} if status is None else {"archive": status()}

    async def sweep(self) -> int:
        """One sweeper pass (expiries, then deletes and fences); returns the work items run."""
        self._apply(Tick())
        self._core.sample_timeline()
        work = self._apply(TakeDeletes(limit=self._delete_batch))
        fences = self._apply(TakeFences(limit=self._delete_batch))
        held = self._batch_deleter is not None and self._batch_deleter.pending > 0
        if not work and not fences and not held:
            return 0
        fenced = await asyncio.to_thread(run_fences, fences, self._fencer)
        results = await asyncio.to_thread(self._run_deletes, work)
        for item, ok, error in results:
            self._apply(DeleteDone(partition=item.partition, ok=ok, error=error))
        for fence, ok, error in fenced:
            self._apply(FenceDone(partition=fence.partition, generation=fence.generation, ok=ok, error=error))
        return len(work) + len(fences) + (len(results) if held else 0)

    def _run_deletes(self, work: list[DeleteWork]) -> list[tuple[DeleteWork, bool, str | None]]:
        """Run a pass's deletes through the batch deleter when there is one, else one by one."""
        if self._batch_deleter is None:
            return run_deletes(work, self._deleter)
        try:
            return self._batch_deleter(work)
        except Exception:  # it must not raise; if it does, its work is handed out again after the timeout
            return []

    async def _sweep_loop(self) -> None:
        while True:
            try:
                ran = await self.sweep()
            except Exception:  # keep sweeping: a failure here must not silently stop expiry
                ran = 0
            if ran:
                continue
            nxt = self._core.ledger.next_deadline()
            delay = (
                self._sweep_interval
                if nxt is None
                else min(self._sweep_interval, max(0.0, nxt - time.time()))
            )
            await asyncio.sleep(delay)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def ray_actor_class() -> Any:
    """The Ray actor class wrapping :class:`ControllerActor` (imports ray)."""
    ray = import_ray()
    return ray.remote(ControllerActor)


def start_ray_actor(
    *,
    name: str = DEFAULT_NAME,
    namespace: str = DEFAULT_NAMESPACE,
    state_dir: str | os.PathLike[str] | None = None,
    deleter: Callable[[DeleteWork], None] | None = None,
    fencer: Callable[[Sequence[FenceWork]], None] | None = None,
    max_restarts: int = -1,
    sweep_interval: float = 0.05,
    journal_fsync: bool = False,
    detached: bool = False,
    get_if_exists: bool = False,
    options: dict[str, Any] | None = None,
    batch_deleter: Callable[[], BatchDeleter] | None = None,
    metrics: Callable[[CollectorRegistry], MetricsServer] | None = None,
) -> Any:
    """Create the named controller actor and return its handle (Ray must be initialised).

    Args:
        name: Actor name, unique in ``namespace``.
        namespace: One namespace per deployment, so that two deployments on one cluster never meet.
        state_dir: Journal and snapshot directory on the actor's node (required to survive restarts).
        deleter: Picklable callable deleting one group from its storage server.
        fencer: Picklable callable raising the generation of the fences of one storage server.
        max_restarts: Restarts Ray may do (-1: unlimited).
        sweep_interval: Longest sleep of the sweeper.
        journal_fsync: fsync the journal after every call.
        detached: Keep the actor alive after the creating driver exits.
        get_if_exists: Return the running actor of that name instead of failing.
        options: Further ``ActorClass.options`` (e.g. ``scheduling_strategy``).
        batch_deleter: Picklable factory of the actor's batch deleter (an archive), see
            :class:`ControllerActor`.
        metrics: Picklable factory of the actor's metrics endpoint, see :class:`ControllerActor`.
    """
    cls = ray_actor_class()
    opts: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "max_restarts": max_restarts,
        "max_task_retries": 0,
        "max_concurrency": 1000,
        "num_cpus": 0,
        "get_if_exists": get_if_exists,
    }
    if detached:
        opts["lifetime"] = "detached"
    opts.update(options or {})
    return cls.options(**opts).remote(
        None if state_dir is None else os.fspath(state_dir),
        deleter,
        sweep_interval,
        256,
        journal_fsync,
        fencer,
        batch_deleter,
        metrics,
    )
