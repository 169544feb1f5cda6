"""trajflight's public client on the embedded data plane, as a user runs it.

``LocalCluster(servers=2, processes=True)``: the controller in this process, two storage servers as
processes on loopback. One :class:`~trajflight.Writer` puts each group (``Writer.put`` of the group's
record batch, encoded from the numpy arrays inside the timing; ``Writer.put_many`` of the whole workload's
columns for the batched figure, encoded together, where the client has it, else of per-group batches);
one :class:`~trajflight.Trainer` leases the whole workload and ``LeasedBatch.fetch`` reads it to torch
(both servers in parallel). A put is finished when the group is READY in the controller, i.e. visible
to the trainer. The workload's user columns go in with ``extra=`` (``_system.USER_COLUMNS``).

Two entries: ``trajflight`` is the client's default transport (``"auto"``: the servers' shared-memory
arenas on this host, Flight to other hosts), what a same-node trainer gets; ``trajflight-flight`` forces
Flight (``transport="flight"``), what a trainer on another node gets, and the like-for-like comparison
with the bare Flight server. On a checkout whose client has no ``transport`` setting both use Flight.

The controller figure is ``bench_controller.bench_local``: acquire..commit cycles through the
in-process host with its sweeper confirming every delete.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from trajflight.workload import SyntheticGroup

from ._stats import Stats
from ._system import GetVariant, System, encode_with_users

__all__ = ["TrajflightSystem"]

JOB = "bench"
TRANSITIONS_PER_CYCLE = 5


class TrajflightSystem(System):
    """The public client over ``LocalCluster(servers=2, processes=True)``, with one transport."""

    name = "trajflight"
    role = "system"
    memory_note = "RSS of the 2 storage server processes"

    def __init__(
        self,
        groups: Sequence[SyntheticGroup],
        *,
        servers: int = 2,
        controller_groups: int = 20_000,
        transport: str = "auto",
        controller: bool = True,
    ) -> None:
        super().__init__(groups)
        self.servers = servers
        self.controller_groups = controller_groups
        self.transport = transport
        self.measure_controller = controller
        how = "shared memory on this host (default)" if transport == "auto" else f"transport={transport!r}"
        self.form = "Writer.put / put_many, " + ("shm" if transport == "auto" else transport)
        self.description = (
            f"trajflight public client, LocalCluster with {servers} storage server processes, {how}: "
            "Writer.put per group, lease + LeasedBatch.fetch"
        )
        if transport != "flight":
            self.include_shmem = True
            self.memory_note = "RSS of the 2 storage server processes + shared-memory (arena) growth"
        self._cluster: Any = None
        self._client: Any = None
        self._writer: Any = None
        self._trainer: Any = None
        self._lease: Any = None
        self._small: Any = None
        self._columns_batched = False

    def setup(self) -> None:
        from trajflight import LocalCluster

        self._cluster = LocalCluster(servers=self.servers, capacity="8GiB", processes=True).start()
        try:
            self._client = self._cluster.client(transport=self.transport)
        except TypeError:  # a client from before the same-host transport: Flight only
            self._client = self._cluster.client()
        self._client.open_job(JOB, 1)
        self._writer = self._client.writer(JOB, 1, writer_id="bench-writer")
        self._trainer = self._client.trainer(JOB, owner="bench-trainer", ttl=120.0)
        self.supports_batched = callable(getattr(self._writer, "put_many", None))
        # A batch moved with put_many is read back from one segment with no join: time the gets there
        self.gets_after_batched = self.supports_batched
        import trajflight.codec

        # A client from before encode_groups takes record batches only.
        self._columns_batched = hasattr(trajflight.codec, "encode_groups")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def server_pids(self) -> list[int]:
        return [p.pid for p in self._cluster._procs] if self._cluster is not None else []

    def put_all(self) -> None:
        put = self._writer.put
        for g, users in zip(self.groups, self.users, strict=True):
            put(encode_with_users(g, JOB, 1, users))

    def put_batched_all(self) -> None:
        if self._columns_batched:  # the groups' columns, encoded together by put_many
            pairs = zip(self.groups, self.users, strict=True)
            self._writer.put_many([g.columns(extra=u) for g, u in pairs])
        else:
            pairs = zip(self.groups, self.users, strict=True)
            self._writer.put_many([encode_with_users(g, JOB, 1, u) for g, u in pairs])

    def prepare_get(self) -> None:
        self._lease = self._trainer.lease(len(self.groups), wait=30.0, renew=False)
        if len(self._lease) != len(self.groups):
            raise RuntimeError(f"leased {len(self._lease)} groups, expected {len(self.groups)}")

    def get(self, variant: GetVariant) -> Any:
        return self._lease.fetch(variant.columns, layout=variant.layout)

    def finish_get(self) -> None:
        self._lease.release()
        self._lease = None

    def drain(self) -> None:
        while True:
            lease = self._trainer.try_lease(4096, wait=0.0, renew=False)
            if lease is None:
                break
            lease.commit()
        self._cluster.wait_idle(JOB, timeout=60.0)

    def small_roundtrip(self, index: int) -> None:
        i = index % len(self.groups)
        self._writer.put(encode_with_users(self.groups[i], JOB, 1, self.users[i]))
        self._small = self._trainer.lease(1, wait=10.0, renew=False)
        self._small.fetch()

    def small_cleanup(self) -> None:
        if self._small is not None:
            self._small.commit()
            self._small = None

    def handoff(self, iters: int) -> list[float]:
        """One group from a writer process to a trainer process waiting in ``lease``, both connected to
        this cluster's control server with this entry's transport; the groups are encoded before the
        clock."""
        from ._handoff import trajflight_handoff

        return trajflight_handoff(self._cluster.address, JOB, self.transport, self.groups, iters)

    def extra_metrics(self, repeats: int) -> dict[str, Any]:
        if not self.measure_controller:
            return {}
        from .bench_controller import bench_local

        per_lease = 64
        runs = [bench_local(self.controller_groups, per_lease) for _ in range(max(1, repeats))]
        cycles = [r / TRANSITIONS_PER_CYCLE for r in runs]
        s = Stats.of(cycles)
        return {
            "controller": {
                "group_cycles_per_s": _stats_dict(s),
                "transitions_per_s": statistics.median(runs),
                "groups_per_lease": per_lease,
                "groups_cycled": self.controller_groups,
                "how": "bench_controller.bench_local: LocalController + ControllerClient, acquire..commit, "
                "deletes confirmed by the sweeper",
            }
        }


def _stats_dict(s: Stats) -> dict[str, float | int]:
    return {"median": s.median, "min": s.min, "max": s.max, "q1": s.q1, "q3": s.q3, "n": s.n}
