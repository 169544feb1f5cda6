"""A zombie trainer cannot read or change its groups once its lease expired (issue 14 item 9).

The bug: a trainer stopped (SIGSTOP) past its lease's TTL, then continued (SIGCONT), could still
``fetch_table()`` and ``append()`` to its groups, which had become UNKNOWN, and the append changed the
stored data: storage servers fence by generation only, and nobody told them that the lease had expired.
Now the controller's sweeper raises the groups' generation on their servers (the fence list), which
refuses the old token for Flight and shared-memory reads and appends alike, while an operator can still
read the UNKNOWN groups and resolve them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pyarrow as pa
import pytest

import trajflight
from trajflight.controller import GroupState
from trajflight.errors import StaleFenceError
from trajflight.flight_server import GroupRead, LeaseToken
from trajflight.keys import Partition

from .conftest import put_groups, wait_until

pytestmark = pytest.mark.slow

# A trainer that leases every group (TTL 1 s, renewed in the background), starts training, reads them,
# says so, then waits for "go" on stdin and tries again to read and to append; it prints the outcomes.
ZOMBIE = textwrap.dedent(
    """
    import json, sys
    import pyarrow as pa
    import trajflight
    address, job, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    client = trajflight.connect(address, timeout=10)
    batch = client.trainer(job, ttl=1.0).lease(n, wait=10)
    batch.start_training()
    rows = batch.fetch_table(["sample_id"]).num_rows
    print(json.dumps({"leased": [list(p) for p in batch.partitions], "rows": rows}), flush=True)
    sys.stdin.readline()  # stopped (SIGSTOP) and continued (SIGCONT) before this returns
    out = {}
    try:
        batch.fetch_table(["sample_id"])
        out["fetch"] = "ok"
    except Exception as exc:
        out["fetch"] = type(exc).__name__
    meta = batch.handle.groups[0]
    try:
        batch.append(meta.partition, pa.table({"zombie": pa.array([1.0] * meta.rows, pa.float32())}))
        out["append"] = "ok"
    except Exception as exc:
        out["append"] = type(exc).__name__
    print(json.dumps(out), flush=True)
    """
)


@pytest.fixture
def plane() -> Iterator[trajflight.LocalCluster]:
    with trajflight.LocalCluster(servers=1, capacity="64MiB", timeout=20.0) as cluster:
        yield cluster


def _stored(plane: trajflight.LocalCluster, client: trajflight.Client, job: str) -> dict:
    """Every stored group as an analyst reads it (tokenless), with its columns."""
    storage = client.storage.client(plane.server_locations[0])
    out = {}
    for group in storage.list_groups(job):
        table = storage.get([GroupRead(group.key)])
        out[tuple(group.key)] = (table.schema.names, table.column("sample_id").to_pylist())
    return out


@pytest.mark.timeout(120)
def test_a_stopped_trainer_past_its_ttl_is_refused_reads_and_appends(plane):
    job = "zombie"
    client = plane.client()
    client.open_job(job, 1)
    put_groups(client.writer(job, 1), 2)
    before = _stored(plane, client, job)
    child = subprocess.Popen(
        [sys.executable, "-c", ZOMBIE, plane.address, job, "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = json.loads(child.stdout.readline() or "{}")
        assert first.get("rows") == 8, child.stderr.read() if child.poll() is not None else first
        leased = [tuple(p) for p in first["leased"]]
        os.kill(child.pid, signal.SIGSTOP)  # no more renewals: the lease runs out
        controller = client.controller
        wait_until(
            lambda: all(controller.group(p).state is GroupState.UNKNOWN for p in leased), "the lease expired"
        )
        wait_until(lambda: controller.fence_list() == (), "the servers were fenced")
        os.kill(child.pid, signal.SIGCONT)
        child.stdin.write("go\n")
        child.stdin.flush()
        outcome = json.loads(child.stdout.readline() or "{}")
    finally:
        child.kill()
        child.communicate(timeout=30)
    assert outcome["fetch"] in ("StaleFenceError", "LeaseExpiredError"), outcome
    assert outcome["append"] in ("StaleFenceError", "LeaseExpiredError"), outcome
    assert _stored(plane, client, job) == before  # nothing appended

    # The operator reads the UNKNOWN groups (tokenless, as any analyst) and resolves them.
    assert set(_stored(plane, client, job)) == {Partition(*p) for p in leased}
    controller.resolve(job, leased, "requeue")
    with client.trainer(job).lease(2, wait=10) as batch:
        table = batch.fetch_table()
        assert "zombie" not in table.schema.names
        assert sorted(table.column("sample_id").to_pylist()) == sorted(
            s for _, ids in before.values() for s in ids
        )
    assert plane.wait_idle(job) == (0, 0)


def test_an_expired_lease_is_fenced_on_the_server_even_before_anyone_leases_again(plane):
    """A lease taken straight from the controller (no client-side fencing at all): once it expires, the
    sweeper alone makes the server refuse its token."""
    job = "expired"
    client = plane.client()
    client.open_job(job, 1, {"default_lease_ttl": "1s"})
    put_groups(client.writer(job, 1), 1)
    lease = client.controller.acquire(job, "raw", max_groups=1)
    assert lease is not None
    (group,) = lease.groups
    storage = client.storage.client(group.location)
    read = GroupRead(Partition(*group.partition), LeaseToken(lease.token))
    assert storage.get([read]).num_rows == group.rows  # the holder reads while the lease lives
    wait_until(lambda: client.controller.group(group.partition).state is GroupState.READY, "it expired")
    wait_until(lambda: client.controller.fence_list() == (), "the server was fenced")
    with pytest.raises(StaleFenceError):
        storage.get([read])
    with pytest.raises(StaleFenceError):
        storage.append_columns(read.key, pa.table({"x": pa.array([0] * group.rows)}), read.token)
