"""Ray's object store, as RL stacks move trajectories with it, in two forms.

* ``ray`` (its strongest ordinary form, how slime moves rollout data): one object per batch. A producer
  actor (the rollout worker) holds the workload as one batch, each column's arrays concatenated
  (:func:`batch_arrays`), and ``ray.put``s that one dict of arrays; the driver (the trainer) ``ray.get``s
  it (numpy views of the shared-memory object store, no copy) and builds torch tensors over those views
  (:func:`batch_to_torch`: jagged with no copy; padded is one copy).
* ``ray-per-group``: the producer ``ray.put``s one dict of arrays per group; the driver ``ray.get``s the
  refs and joins them into torch tensors with one copy, as
  :func:`~trajflight.bench._system.torch_from_arrays` does.

A put is finished when the driver holds the refs (the consumer can read them).
``bench/bench_same_host.py`` uses the same producer and conversion.

Ray is bound to loopback. A Ray runtime already initialised in this process
(a test fixture, a user's) is reused and left running; one started here is shut down by
:func:`shutdown_ray`.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from trajflight.workload import SyntheticGroup, make_workload

from ._system import (
    ALL_COLUMNS,
    RAGGED,
    GetVariant,
    Layout,
    System,
    SystemUnavailable,
    group_arrays,
    torch_from_arrays,
)

__all__ = [
    "RAY_HINT",
    "BatchProducer",
    "RayPerGroupSystem",
    "RaySystem",
    "batch_arrays",
    "batch_to_torch",
    "ensure_ray",
    "shutdown_ray",
]

RAY_HINT = "pip install 'trajflight[ray]'"
_STARTED_HERE = False


def ensure_ray() -> Any:
    """Import Ray and make sure a runtime is up (started on loopback here if none is); returns ``ray``.

    Raises:
        SystemUnavailable: Ray is not installed.
    """
    global _STARTED_HERE
    # Before the import: Ray reads it then, and without it advertises the machine's network address.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError as exc:
        raise SystemUnavailable("ray is not installed", RAY_HINT) from exc
    if not ray.is_initialized():
        ray.init(
            address="local",
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            num_cpus=8,
            log_to_driver=False,
            namespace="trajflight-bench",
        )
        _STARTED_HERE = True
    return ray


def shutdown_ray() -> None:
    """Shut Ray down if :func:`ensure_ray` started it."""
    global _STARTED_HERE
    if _STARTED_HERE:
        import ray

        ray.shutdown()
        _STARTED_HERE = False


def raylet_pids() -> list[int]:
    """PIDs of the raylet processes descending from this process (the object store's host)."""
    import psutil

    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.name() == "raylet":
                out.append(child.pid)
        except psutil.Error:
            continue
    return out


def batch_arrays(parts: Sequence[dict[str, np.ndarray]], columns: Sequence[str]) -> dict[str, np.ndarray]:
    """Groups' arrays (:func:`~trajflight.bench._system.group_arrays`) as one batch: each column's values
    concatenated, ragged columns with their int64 offsets (``<col>@offsets``) rebased over the batch."""
    batch: dict[str, np.ndarray] = {}
    for name in columns:
        batch[name] = np.concatenate([p[name] for p in parts])
        if name in RAGGED:
            lengths = np.concatenate([np.diff(p[name + "@offsets"]) for p in parts])
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            batch[name + "@offsets"] = offsets
    return batch


def batch_to_torch(
    batch: dict[str, np.ndarray], columns: Sequence[str], layout: Layout = "jagged"
) -> dict[str, Any]:
    """Torch tensors over a batch's numpy arrays (the read-only views ``ray.get`` returns): no copy for
    flat and jagged columns; ``layout="padded"`` pads the ragged ones (one copy)."""
    import torch

    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        # ray.get's arrays are read-only views of the object store by design; nothing writes to them.
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        views = {name: torch.from_numpy(array) for name, array in batch.items()}
    for name in columns:
        values = views[name]
        if name in RAGGED:
            offsets = views[name + "@offsets"]
            max_len = int((offsets[1:] - offsets[:-1]).max())
            values = torch.nested.nested_tensor_from_jagged(values, offsets, max_seqlen=max_len)
            if layout == "padded":
                values = values.to_padded_tensor(0)
        out[name] = values
    return out


class BatchProducer:
    """The rollout worker actor of the one-object form: holds the workload as one batch and ``ray.put``s
    it (or one group, as a batch of one) on request."""

    def __init__(
        self,
        groups: int,
        samples: int,
        seed: int,
        response_median: float = 1024.0,
        columns: Sequence[str] = ALL_COLUMNS,
    ) -> None:
        made = make_workload(groups, samples, seed=seed, response_median=response_median)
        self.parts = [group_arrays(g) for g in made]
        self.columns = tuple(columns)
        self.batch = batch_arrays(self.parts, self.columns)
        self.ones = [batch_arrays([p], self.columns) for p in self.parts]  # each group as a batch of one

    def pid(self) -> int:
        """This actor's process id."""
        return os.getpid()

    def put_batch(self) -> tuple[list[Any], float]:
        """``ray.put`` the batch; its ref (wrapped so Ray does not resolve it) and the put's seconds."""
        import ray

        t0 = time.perf_counter()
        ref = ray.put(self.batch)
        return [ref], time.perf_counter() - t0

    def put_one(self, index: int) -> list[Any]:
        """``ray.put`` group ``index`` as a batch of one; its ref, wrapped."""
        import ray

        return [ray.put(self.ones[index % len(self.ones)])]


class Producer:
    """The rollout worker actor: holds the workload and ``ray.put``s groups on request."""

    def __init__(self, groups: int, samples: int, seed: int, response_median: float) -> None:
        self.groups = make_workload(groups, samples, seed=seed, response_median=response_median)

    def pid(self) -> int:
        """This actor's process id."""
        return os.getpid()

    def put_all(self) -> list[Any]:
        """``ray.put`` each group (a dict of numpy arrays); the refs, wrapped so Ray does not resolve them."""
        import ray

        return [[ray.put(group_arrays(g))] for g in self.groups]

    def put_batched(self) -> list[Any]:
        """One ``ray.put`` of the whole workload (a list of per-group dicts); its ref, wrapped."""
        import ray

        return [ray.put([group_arrays(g) for g in self.groups])]

    def put_one(self, index: int) -> list[Any]:
        """``ray.put`` group ``index``; its ref, wrapped."""
        import ray

        return [ray.put(group_arrays(self.groups[index % len(self.groups)]))]


class RayPerGroupSystem(System):
    """``ray.put`` per group in a producer actor, ``ray.get`` into torch in the driver."""

    name = "ray-per-group"
    role = "peer"
    form = "one object per group"
    strongest = False
    description = "Ray object store: ray.put per group in an actor, ray.get + join into torch in the driver"
    memory_note = "raylet RSS + shared-memory (object store) growth"
    include_shmem = True
    supports_batched = True

    def __init__(
        self, groups: Sequence[SyntheticGroup], *, samples: int, seed: int, response_median: float
    ) -> None:
        super().__init__(groups)
        self._params = (len(groups), samples, seed, response_median)
        self._ray: Any = None
        self._producer: Any = None
        self._refs: list[Any] = []
        self._small: list[Any] = []

    def setup(self) -> None:
        ray = ensure_ray()
        self._ray = ray
        self._producer = ray.remote(num_cpus=0)(Producer).remote(*self._params)
        ray.get(self._producer.pid.remote(), timeout=120)

    def close(self) -> None:
        self._refs = []
        self._small = []
        if self._producer is not None:
            self._ray.kill(self._producer)
            self._producer = None

    def server_pids(self) -> list[int]:
        return raylet_pids()

    def put_all(self) -> None:
        wrapped = self._ray.get(self._producer.put_all.remote(), timeout=120)
        self._refs = [w[0] for w in wrapped]

    def get(self, variant: GetVariant) -> Any:
        parts = self._ray.get(self._refs, timeout=120)
        return torch_from_arrays(parts, variant.columns or ALL_COLUMNS, variant.layout)

    def put_batched_all(self) -> None:
        self._refs = self._ray.get(self._producer.put_batched.remote(), timeout=120)

    def drain(self) -> None:
        self._refs = []

    def small_roundtrip(self, index: int) -> None:
        self._small = self._ray.get(self._producer.put_one.remote(index), timeout=60)
        parts = self._ray.get(self._small, timeout=60)
        torch_from_arrays(parts, ALL_COLUMNS, "jagged")

    def small_cleanup(self) -> None:
        self._small = []


class RaySystem(System):
    """Ray's strongest ordinary form: one ``ray.put`` of the whole batch in a producer actor, zero-copy
    ``ray.get`` into torch in the driver. It has no call per group: its put is the batch's one put."""

    name = "ray"
    role = "peer"
    form = "one object per batch"
    description = (
        "Ray object store: one ray.put of the batch (one dict of arrays) in an actor, ray.get + torch "
        "views in the driver (no copy)"
    )
    memory_note = "raylet RSS + shared-memory (object store) growth"
    include_shmem = True
    supports_batched = True

    def __init__(
        self, groups: Sequence[SyntheticGroup], *, samples: int, seed: int, response_median: float
    ) -> None:
        super().__init__(groups)
        self._params = (len(groups), samples, seed, response_median)
        self._ray: Any = None
        self._producer: Any = None
        self._ref: Any = None
        self._small: list[Any] = []

    def setup(self) -> None:
        ray = ensure_ray()
        self._ray = ray
        self._producer = ray.remote(num_cpus=0)(BatchProducer).remote(*self._params)
        ray.get(self._producer.pid.remote(), timeout=120)

    def close(self) -> None:
        self._ref = None
        self._small = []
        if self._producer is not None:
            self._ray.kill(self._producer)
            self._producer = None

    def server_pids(self) -> list[int]:
        return raylet_pids()

    def put_all(self) -> None:
        wrapped, _ = self._ray.get(self._producer.put_batch.remote(), timeout=120)
        self._ref = wrapped[0]

    def put_batched_all(self) -> None:
        self.put_all()

    def get(self, variant: GetVariant) -> Any:
        batch = self._ray.get(self._ref, timeout=120)
        return batch_to_torch(batch, variant.columns or ALL_COLUMNS, variant.layout)

    def drain(self) -> None:
        self._ref = None

    def small_roundtrip(self, index: int) -> None:
        self._small = self._ray.get(self._producer.put_one.remote(index), timeout=60)
        batch_to_torch(self._ray.get(self._small[0], timeout=60), ALL_COLUMNS)

    def small_cleanup(self) -> None:
        self._small = []

    def handoff(self, iters: int) -> list[float]:
        """One group (one object) from this process's ``ray.put`` to a trainer actor waiting for a call."""
        return ray_handoff(
            self._ray, [batch_arrays([group_arrays(g)], ALL_COLUMNS) for g in self.groups], iters
        )


# ---------------------------------------------------------------------------------- the handoff

_HANDOFF_TIMEOUT = 120.0


class HandoffTrainer:
    """The Ray trainer actor: takes a ref, gets it, builds torch tensors over it, returns the time."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = tuple(columns)

    def take(self, wrapped: list[Any]) -> int:
        """``ray.get`` the wrapped ref into torch tensors; ``time.monotonic_ns()`` once they exist."""
        import ray

        batch_to_torch(ray.get(wrapped[0], timeout=_HANDOFF_TIMEOUT), self.columns)
        return time.monotonic_ns()


def ray_handoff(ray: Any, batches: Sequence[dict[str, Any]], iters: int, warmup: int = 3) -> list[float]:
    """Seconds from this process's ``ray.put`` of one group (one dict of arrays, ``batches[i]``) to a
    trainer actor holding it as torch tensors, ``iters`` times after ``warmup`` untimed ones."""
    trainer = ray.remote(num_cpus=0)(HandoffTrainer).remote(ALL_COLUMNS)
    out: list[float] = []
    try:
        ray.get(trainer.take.remote([ray.put(batches[0])]), timeout=_HANDOFF_TIMEOUT)  # the actor is up
        for i in range(warmup + iters):
            start = time.monotonic_ns()
            ref = ray.put(batches[i % len(batches)])
            held = ray.get(trainer.take.remote([ref]), timeout=_HANDOFF_TIMEOUT)
            del ref
            if i >= warmup:
                out.append((held - start) / 1e9)
    finally:
        with contextlib.suppress(Exception):
            ray.kill(trainer)
    return out
