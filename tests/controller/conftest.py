"""Fixtures for the controller tests: a fake clock and a ledger with one job, one server and one writer."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from trajflight.controller import JobConfig, Lease, Ledger, PutGrant


@dataclass
class FakeClock:
    """Time that moves only when a test says so."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@dataclass
class World:
    """A ledger with job ``j`` (epoch 1), server ``s0`` on node ``n0`` and writer ``w0`` on ``n0``."""

    ledger: Ledger
    clock: FakeClock
    job: str = "j"
    epoch: int = 1
    grants: list[PutGrant] = field(default_factory=list)

    @property
    def now(self) -> float:
        return self.clock.now

    def put(
        self,
        n: int = 1,
        *,
        nbytes: int = 1000,
        tokens: int = 100,
        policy_version: int = 0,
        columns: tuple[str, ...] = ("response_ids",),
        writer: str = "w0",
    ) -> list[PutGrant]:
        out = []
        for _ in range(n):
            grant = self.ledger.allocate(self.job, self.epoch, writer, nbytes=nbytes, now=self.now)
            self.ledger.publish(
                grant.partition,
                token=grant.token,
                rows=8,
                nbytes=nbytes,
                tokens=tokens,
                policy_version=policy_version,
                columns=columns,
                now=self.now,
            )
            out.append(grant)
        self.grants.extend(out)
        return out

    def lease(self, n: int = 1, **kwargs: object) -> Lease:
        lease = self.ledger.acquire(self.job, "trainer", max_groups=n, now=self.now, **kwargs)  # type: ignore[arg-type]
        assert lease is not None
        return lease

    def train(self, lease: Lease, batch: str = "b0") -> None:
        L, t = self.ledger, lease.token
        L.prepare(t, batch, now=self.now)
        L.start_training(t, batch, now=self.now)
        L.finish_training(t, batch, now=self.now)
        L.commit(t, batch, now=self.now)

    def state(self, grant: PutGrant) -> str:
        return self.ledger.group(grant.partition).state.value

    def confirm_deletes(self) -> int:
        work = self.ledger.take_deletes(now=self.now)
        for item in work:
            self.ledger.delete_done(item.partition, ok=True, now=self.now)
        return len(work)


CONFIG = JobConfig(default_lease_ttl=10.0, max_lease_ttl=100.0, grant_ttl=5.0, max_group_bytes=1 << 20)


def make_world(
    config: JobConfig = CONFIG, *, capacity_bytes: int = 10**9, capacity_groups: int = 10**6
) -> World:
    clock = FakeClock()
    ledger = Ledger()
    ledger.register_server(
        "s0",
        node="n0",
        location="grpc://127.0.0.1:9000",
        capacity_bytes=capacity_bytes,
        capacity_groups=capacity_groups,
        now=clock.now,
    )
    ledger.open_job("j", 1, config, now=clock.now)
    ledger.register_writer("j", 1, "w0", node="n0", now=clock.now)
    return World(ledger, clock)


@pytest.fixture
def world() -> World:
    return make_world()


@pytest.fixture
def world_factory():
    return make_world
