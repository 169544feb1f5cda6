"""The cross-process handoff: one group from a writer process to a trainer process already waiting for it.

The trainer, started here, waits before each put; this process only coordinates and keeps the score:

* trajflight: a spawned writer process and a spawned trainer process, each ``trajflight.connect``-ed to
  the run's data plane with the transport given (a client of the control server, as a rollout worker and
  a trainer are: not this process's in-process controller). The trainer waits in ``Trainer.lease(1)``;
  the writer puts one group (``Writer.put`` of a batch encoded beforehand); the trainer's lease returns,
  it fetches the group to torch and notes the time, then commits and says it waits again.
* Ray, one object (``_peer_ray.ray_handoff``, beside Ray's other forms): this process is the writer; a
  trainer actor waits for a call; this process ``ray.put``s the group (one dict of arrays) and passes the
  ref; the actor ``ray.get``s it, builds torch tensors over it and notes the time.

The figure is the trainer's time with tensors in hand minus the writer's time before its put, on one
clock (``time.monotonic_ns``: ``CLOCK_MONOTONIC``, one clock for every process of the host).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence
from typing import Any

from trajflight.workload import SyntheticGroup

__all__ = ["trajflight_handoff"]

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


def _writer_main(
    conn: Any, address: str, job: str, transport: str, groups: list[SyntheticGroup], grant_ahead: bool
) -> None:
    """The writer process: encode the groups (user columns too), then on ``i`` put group ``i`` and send
    the time just before the put, until ``None``."""
    import trajflight

    from ._system import encode_with_users

    batches = [encode_with_users(g, job, 1) for g in groups]
    client = trajflight.connect(address, transport=transport, timeout=30.0)
    try:
        writer = client.writer(job, 1, writer_id=f"handoff-{os.getpid()}", grant_ahead=grant_ahead)
        writer.put(batches[0])  # first use: connections, the transport's setup
        conn.send("ready")
        while (i := conn.recv()) is not None:
            start = time.monotonic_ns()
            writer.put(batches[i % len(batches)])
            conn.send(start)
    finally:
        client.close()
        conn.close()


def _recv(conn: Any, who: str, what: str) -> Any:
    if not conn.poll(_TIMEOUT):
        raise TimeoutError(f"the handoff {who} process sent nothing in {_TIMEOUT:g} s while {what}")
    return conn.recv()


def _stop(proc: Any, conn: Any) -> None:
    proc.join(30)
    if proc.is_alive():
        proc.kill()
        proc.join(10)
    conn.close()


def trajflight_handoff(
    address: str,
    job: str,
    transport: str,
    groups: Sequence[SyntheticGroup],
    iters: int,
    warmup: int = 3,
    *,
    grant_ahead: bool = False,
) -> list[float]:
    """Seconds from a writer process starting ``Writer.put`` of one group to a trainer process holding it
    as torch tensors, ``iters`` times after ``warmup`` untimed ones.

    Args:
        address: The data plane's control address (``LocalCluster.address``).
        job: The job the puts go to (open at epoch 1, with nothing READY in it).
        transport: Both processes' ``transport`` setting (``"auto"``: shared memory on this host).
        groups: The groups put, in turn (the writer's first put, untimed, is leased by the trainer's
            first, untimed, round).
        iters: Timed handoffs.
        warmup: Untimed handoffs first.
        grant_ahead: The writer's ``grant_ahead`` (its puts then make one controller call each).
    """
    ctx = multiprocessing.get_context("spawn")  # gRPC is not fork-safe
    tconn, tchild = ctx.Pipe()
    wconn, wchild = ctx.Pipe()
    rounds = warmup + iters
    trainer = ctx.Process(
        target=_trainer_main, args=(tchild, address, job, transport, rounds + 1), daemon=True
    )
    writer = ctx.Process(
        target=_writer_main, args=(wchild, address, job, transport, list(groups), grant_ahead), daemon=True
    )
    trainer.start()
    writer.start()
    tchild.close()
    wchild.close()
    out: list[float] = []
    try:
        if _recv(wconn, "writer", "starting") != "ready":
            raise RuntimeError("the handoff writer process is out of step")
        for i in range(-1, rounds):  # round -1: the writer's first-use put, already made
            if _recv(tconn, "trainer", "starting") != "waiting":
                raise RuntimeError("the handoff trainer process is out of step")
            if i < 0:
                _recv(tconn, "trainer", "fetching")
                continue
            time.sleep(_SETTLE)
            wconn.send(i)
            start = _recv(wconn, "writer", "putting")
            held = _recv(tconn, "trainer", "fetching")
            if i >= warmup:
                out.append((held - start) / 1e9)
        wconn.send(None)
        _recv(tconn, "trainer", "finishing")
    finally:
        _stop(writer, wconn)
        _stop(trainer, tconn)
    return out
