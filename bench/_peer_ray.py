"""Ray's object store, as many RL stacks move trajectories today.

A producer actor (the rollout worker) holds the workload as numpy arrays and ``ray.put``s one dict of
arrays per group, returning the object refs to the driver; a put is finished when the driver holds the
refs (the consumer can read them). The driver (the trainer) ``ray.get``s the refs (numpy views of the
shared-memory object store, no copy) and joins them into torch tensors with one copy, as
:func:`~trajflight.bench._system.torch_from_arrays` does, jagged or padded.

Ray is bound to loopback. A Ray runtime already initialised in this process
(a test fixture, a user's) is reused and left running; one started here is shut down by
:func:`shutdown_ray`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from trajflight.workload import SyntheticGroup, make_workload

from ._system import ALL_COLUMNS, GetVariant, System, SystemUnavailable, group_arrays, torch_from_arrays

__all__ = ["RAY_HINT", "RaySystem", "ensure_ray", "shutdown_ray"]

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


class RaySystem(System):
    """``ray.put`` per group in a producer actor, ``ray.get`` into torch in the driver."""

    name = "ray"
    role = "peer"
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
