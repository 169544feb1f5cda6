"""A writer's grants made ahead through the public client (issue 16): a steady-state put makes one
controller call, and the grant it holds is charged, given back by ``close``, not used when too small or
stale, and refused after a new epoch."""

from __future__ import annotations

import time
from collections.abc import Iterator
from unittest import mock

import pytest

import trajflight
from trajflight.errors import StaleFenceError
from trajflight.workload import make_workload

from .conftest import put_groups


@pytest.fixture(scope="module")
def cluster() -> Iterator[trajflight.LocalCluster]:
    """One storage server process and an in-process controller (plain: the planes are covered elsewhere)."""
    with trajflight.LocalCluster(servers=1, capacity="64MiB", processes=True, timeout=20.0) as c:
        yield c


def _calls(client: trajflight.Client) -> tuple[mock.MagicMock, mock.MagicMock]:
    """Spies on the controller's allocate and publish_ahead (calls pass through)."""
    controller = client.controller
    allocate = mock.patch.object(controller, "allocate", wraps=controller.allocate).start()
    publish = mock.patch.object(controller, "publish_ahead", wraps=controller.publish_ahead).start()
    return allocate, publish


@pytest.fixture(autouse=True)
def _stop_spies() -> Iterator[None]:
    yield
    mock.patch.stopall()


def _drain(client: trajflight.Client, job: str, n: int) -> None:
    with client.trainer(job).lease(n, wait=5) as batch:
        assert len(batch.partitions) == n


def _close_and_drain(cluster: trajflight.LocalCluster, writer: trajflight.Writer, job: str, n: int) -> None:
    """Close the writer, lease and commit its ``n`` groups: the job's usage is then back to zero."""
    writer.close()
    _drain(cluster.client(), job, n)
    assert cluster.wait_idle(job) == (0, 0)


def test_a_steady_state_put_makes_one_controller_call(cluster, job):
    client = cluster.client()
    client.open_job(job, 1)
    writer = client.writer(job, 1, grant_ahead=True)
    allocate, publish = _calls(client)
    batches = [g.encode(job, 1) for g in make_workload(4, 4, seed=1, response_median=64)]
    batches.sort(key=lambda b: b.get_total_buffer_size(), reverse=True)  # each fits the one before's grant
    metas = [writer.put(b) for b in batches]
    assert allocate.call_count == 1  # the first put only; the others used the grant held ahead
    assert publish.call_count == 4
    assert len({m.partition for m in metas}) == 4
    _close_and_drain(cluster, writer, job, 4)


def test_the_grant_held_ahead_is_charged_until_close_gives_it_back(cluster, job):
    client = cluster.client()
    client.open_job(job, 1)
    writer = client.writer(job, 1, grant_ahead=True)
    (meta,) = put_groups(writer, 1)
    nbytes, groups = client.controller.usage(job)
    assert groups == 2
    assert nbytes > meta.nbytes
    assert client.controller.counts(job)["ALLOCATED"] == 1
    _drain(client, job, 1)
    assert client.controller.counts(job)["ALLOCATED"] == 1  # held past the commit of every group
    writer.close()
    assert cluster.wait_idle(job) == (0, 0)
    writer.close()  # nothing held: harmless
    put_groups(writer, 1, first=1)  # still usable: allocates, and holds a grant again
    assert client.controller.counts(job)["ALLOCATED"] == 1
    client.close()  # closes its writers
    other = cluster.client()
    _drain(other, job, 1)
    assert cluster.wait_idle(job) == (0, 0)


def test_a_grant_held_ahead_too_small_for_the_group_is_kept_and_the_put_allocates(cluster, job):
    client = cluster.client()
    client.open_job(job, 1)
    writer = client.writer(job, 1, grant_ahead=True)
    (small,) = (g.encode(job, 1) for g in make_workload(1, 4, seed=2, response_median=16))
    (large,) = (g.encode(job, 1) for g in make_workload(1, 4, seed=2, response_median=4096))
    assert large.get_total_buffer_size() > 4 * small.get_total_buffer_size()
    writer.put(small)
    allocate, publish = _calls(client)
    meta = writer.put(large)
    assert allocate.call_count == 1  # the held grant was too small
    assert publish.call_args.kwargs["ahead"] == []  # it is still held: nothing more asked for
    assert client.controller.group(meta.partition).nbytes == meta.nbytes
    writer.put(small)
    assert allocate.call_count == 1  # the kept grant served the next small group
    _close_and_drain(cluster, writer, job, 3)


def test_a_stale_grant_held_ahead_is_not_used(cluster, job):
    client = cluster.client()
    client.open_job(job, 1, {"grant_ttl": 0.05})
    writer = client.writer(job, 1, grant_ahead=True)
    put_groups(writer, 1)
    time.sleep(0.2)  # past the held grant's lifetime: the controller expired it
    allocate, _ = _calls(client)
    (meta,) = put_groups(writer, 1, first=1)
    assert allocate.call_count == 1
    assert client.controller.group(meta.partition).state.value == "READY"
    _close_and_drain(cluster, writer, job, 2)


def test_a_new_epoch_drops_the_grant_held_ahead_and_the_fenced_writer_is_refused(cluster, job):
    client = cluster.client()
    client.open_job(job, 1)
    old = client.writer(job, 1, grant_ahead=True)
    put_groups(old, 1)
    client.open_job(job, 2)
    with pytest.raises(StaleFenceError):
        put_groups(old, 1, first=1)
    old.close()  # its grant was dropped by the new epoch: nothing to give back, no error
    assert client.controller.counts(job)["ALLOCATED"] == 0
