"""The cross-process handoff: one group from a writer process to a trainer process already waiting for it.

The writer is this process; the trainer is another, started here and waiting before each put:

* trajflight: a spawned trainer process (``trajflight.connect`` to the run's data plane, the transport
  given) waits in ``Trainer.lease(1)``; this process puts one group (``Writer.put`` of a batch encoded
  beforehand); the trainer's lease returns, it fetches the group to torch and notes the time, then
  commits and says it waits again.
* Ray, one object: a trainer actor waits for a call; this process ``ray.put``s the group (one dict of
  arrays) and passes the ref; the actor ``ray.get``s it, builds torch tensors over it and notes the time.

The figure is the trainer's time with tensors in hand minus the writer's time before its put, on one
clock (``time.monotonic_ns``: ``CLOCK_MONOTONIC``, one clock for every process of the host).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ray_handoff", "trajflight_handoff"]

_TIMEOUT = 120.0
# Between the trainer's "waiting" and the put: the trainer is inside its lease's wait by then.
_SETTLE = 0.01


def _trainer_main(conn: Any, address: str, job: str, transport: str, iters: int) -> None:
    """The trainer process: ``iters`` times, say it waits, lease one group, fetch it, send the time."""
    import trajflight

    client = trajflight.connect(address, transport=transport, timeout=30.0)
    try:
        trainer = client.trainer(job, owner=f"handoff-{os.getpid()}", ttl=60.0)
        for _ in range(iters):
            conn.send("waiting")
            lease = trainer.lease(1, wait=_TIMEOUT, renew=False)
            lease.fetch()
            conn.send(time.monotonic_ns())
            lease.commit()
        conn.send("done")
    finally:
        client.close()
        conn.close()


def _recv(conn: Any, what: str) -> Any:
    if not conn.poll(_TIMEOUT):
        raise TimeoutError(f"the handoff trainer process sent nothing in {_TIMEOUT:g} s while {what}")
    return conn.recv()


def trajflight_handoff(
    address: str, job: str, transport: str, put: Callable[[int], None], iters: int, warmup: int = 3
) -> list[float]:
    """Seconds from ``put(i)`` starting here to a trainer process holding group ``i`` as torch tensors,
    ``iters`` times after ``warmup`` untimed ones.

    Args:
        address: The data plane's control address (``LocalCluster.address``).
        job: The job the puts go to (open, with nothing READY in it).
        transport: The trainer's ``transport`` setting (``"auto"``: shared memory on this host).
        put: Puts one group (the ``i``-th) into ``job``.
        iters: Timed handoffs.
        warmup: Untimed handoffs first.
    """
    ctx = multiprocessing.get_context("spawn")  # gRPC is not fork-safe
    conn, child = ctx.Pipe()
    proc = ctx.Process(
        target=_trainer_main, args=(child, address, job, transport, warmup + iters), daemon=True
    )
    proc.start()
    child.close()
    out: list[float] = []
    try:
        for i in range(warmup + iters):
            if _recv(conn, "starting") != "waiting":
                raise RuntimeError("the handoff trainer process is out of step")
            time.sleep(_SETTLE)
            start = time.monotonic_ns()
            put(i)
            held = _recv(conn, "fetching")
            if i >= warmup:
                out.append((held - start) / 1e9)
        _recv(conn, "finishing")
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(10)
        conn.close()
    return out


class HandoffTrainer:
    """The Ray trainer actor: takes a ref, gets it, builds torch tensors over it, returns the time."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = tuple(columns)

    def take(self, wrapped: list[Any]) -> int:
        """``ray.get`` the wrapped ref into torch tensors; ``time.monotonic_ns()`` once they exist."""
        import ray

        from ._peer_ray import batch_to_torch

        batch_to_torch(ray.get(wrapped[0], timeout=_TIMEOUT), self.columns)
        return time.monotonic_ns()


def ray_handoff(ray: Any, batches: Sequence[dict[str, Any]], iters: int, warmup: int = 3) -> list[float]:
    """Seconds from this process's ``ray.put`` of one group (one dict of arrays, ``batches[i]``) to a
    trainer actor holding it as torch tensors, ``iters`` times after ``warmup`` untimed ones."""
    from ._system import ALL_COLUMNS

    trainer = ray.remote(num_cpus=0)(HandoffTrainer).remote(ALL_COLUMNS)
    out: list[float] = []
    try:
        ray.get(trainer.take.remote([ray.put(batches[0])]), timeout=_TIMEOUT)  # the actor is up
        for i in range(warmup + iters):
            start = time.monotonic_ns()
            ref = ray.put(batches[i % len(batches)])
            held = ray.get(trainer.take.remote([ref]), timeout=_TIMEOUT)
            del ref
            if i >= warmup:
                out.append((held - start) / 1e9)
    finally:
        with contextlib.suppress(Exception):
            ray.kill(trainer)
    return out
