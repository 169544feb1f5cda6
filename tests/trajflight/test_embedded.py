"""End to end on the embedded data plane: real storage server processes, writers in child processes,
trainers that die, restarts from checkpoints, a two-stage pipeline and backpressure."""

from __future__ import annotations

import asyncio
import json
import signal
import textwrap
import threading
import time
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
import torch

import trajflight
from trajflight.errors import (
    CapacityExceededError,
    DeadlineExceededError,
    InvalidRequestError,
    LeaseExpiredError,
    NotFoundError,
    StaleFenceError,
)
from trajflight.flight_server import GroupRead, LeaseToken
from trajflight.keys import Partition

from .conftest import WRITER, put_groups, run_child, start_child


def _prompts(table: pa.Table) -> list[int]:
    seen = dict.fromkeys(int(s.split("/")[0][1:]) for s in table.column("sample_id").to_pylist())
    return list(seen)


def test_writers_in_processes_a_trainer_commit_and_capacity_back_to_zero(cluster, job):
    client = cluster.client()
    client.open_job(job, 1)
    written = [run_child(WRITER, cluster.address, job, 1, first, 3) for first in (0, 100)]
    assert sum(len(w) for w in written) == 6
    trainer = client.trainer(job)
    seen: list[int] = []
    while len(seen) < 6:
        with trainer.lease(4, wait=5) as batch:
            tensors = batch.fetch(["response_ids", "response_logprobs", "reward", "sample_id"])
            assert tensors.tensors["response_ids"].is_nested
            assert tensors.tensors["reward"].dtype == torch.float32
            seen += _prompts(pa.table({"sample_id": tensors.arrow["sample_id"]}))
    assert sorted(seen) == [0, 1, 2, 100, 101, 102]
    assert cluster.wait_idle(job) == (0, 0)
    counts = client.controller.counts(job)
    assert (counts["committed_total"], counts["deleted"], counts["READY"]) == (6, 6, 0)
    for location in cluster.server_locations:  # the data is gone from the servers too
        assert not client.storage.client(location).list_groups(job)


def test_groups_are_spread_over_servers_and_read_in_parallel_in_lease_order(cluster, job):
    client = cluster.client()
    client.open_job(job, 1)
    metas = put_groups(client.writer(job, 1), 6)
    assert len({m.server_id for m in metas}) == 2  # least-loaded placement uses both servers
    with client.trainer(job).lease(6, wait=5) as batch:
        table = batch.fetch_table(["sample_id", "response_ids"])
        leased_order = [g.partition for g in batch.handle.groups]
        # Prompt n was put as metas[n]: the rows come back in the lease's group order.
        assert [metas[n].partition for n in _prompts(table)] == leased_order


def test_a_killed_trainer_loses_its_lease_and_its_token_is_refused_everywhere(cluster, job):
    client = cluster.client()
    client.open_job(job, 1, {"default_lease_ttl": "1s"})
    put_groups(client.writer(job, 1), 2)
    holder = textwrap.dedent(
        """
        import json, sys, time
        import trajflight
        client = trajflight.connect(sys.argv[1], timeout=20)
        batch = client.trainer(sys.argv[2], owner="doomed").lease(2, wait=5)
        batch.fetch_table(["reward"])
        batch.prepare("doomed-batch")
        gens = [g.generation for g in batch.handle.groups]
        print(json.dumps({"token": batch.token, "gens": gens}), flush=True)
        time.sleep(600)
        """
    )
    proc = start_child(holder, cluster.address, job)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        dead = json.loads(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()
    # The lease expires (PREPARED -> READY) and another trainer gets the same groups, newer token.
    batch = client.trainer(job, owner="survivor").lease(2, wait=10)
    assert batch.token > dead["token"]
    assert all(g.generation > old for g, old in zip(batch.handle.groups, dead["gens"], strict=True))
    # The dead trainer's token is refused by the controller ...
    with pytest.raises((LeaseExpiredError, StaleFenceError, NotFoundError)):
        client.controller.renew(dead["token"])
    with pytest.raises((LeaseExpiredError, StaleFenceError, NotFoundError)):
        client.controller.start_training(dead["token"], "doomed-batch")
    # ... and by the storage server, for reads and deletes.
    group = batch.handle.groups[0]
    storage = client.storage.client(group.location)
    stale = GroupRead(Partition(*group.partition), LeaseToken(dead["gens"][0]))
    with pytest.raises(StaleFenceError):
        storage.get([stale])
    with pytest.raises(StaleFenceError):
        storage.delete([stale])
    with batch:
        batch.fetch(["reward"])
    assert cluster.wait_idle(job) == (0, 0)


def test_restart_from_checkpoint_refuses_stale_writers_and_offers_each_uncommitted_group_once(
    cluster, job, tmp_path
):
    """Every group uncommitted at the checkpoint is offered exactly once after the restore, also the one
    the rolled-back incarnation committed after the checkpoint (issue 14: its model never trained it, so
    dropping it would lose it from the restored model's lineage); the group put after the checkpoint is
    purged, never offered."""
    client = cluster.client()
    client.open_job(job, 1)
    writer = client.writer(job, 1)
    put_groups(writer, 6)
    trainer = client.trainer(job)
    with trainer.lease(2, wait=5) as batch:
        committed = _prompts(batch.fetch_table(["sample_id"]))
    ckpt = tmp_path / "job.ckpt"
    client.checkpoint(job, ckpt)
    # After the checkpoint: one more batch trained and committed by the old incarnation (its training is
    # lost with it; its data is kept until a later checkpoint), and one group put by the old writer.
    with trainer.lease(1, wait=5) as batch:
        committed_after = _prompts(batch.fetch_table(["sample_id"]))
    put_groups(writer, 1, seed=7, first=6)
    deadline = time.monotonic() + 10
    while client.controller.gc_list(job) and time.monotonic() < deadline:  # the first commit's deletes
        time.sleep(0.02)
    assert not client.controller.gc_list(job)

    cluster.restart_controller()
    client = cluster.client()
    counts = client.restore(ckpt, job_id=job, epoch=2, config=None, old_ready="reoffer")
    assert (counts["READY"], counts["purged"], counts["lost"]) == (4, 1, 0)
    # Stale writers of epoch 1 are refused by the controller and by the storage servers.
    with pytest.raises(StaleFenceError):
        put_groups(client.writer(job, 1), 1, first=50)
    for location in cluster.server_locations:
        key = Partition(job, 1, 999)
        with pytest.raises(StaleFenceError, match="fenced"):
            client.storage.client(location).put_groups([(key, _one_group(job, 1, 999))])
    offered: list[int] = []
    new_trainer = client.trainer(job)
    while (batch := new_trainer.try_lease(3, wait=0.5)) is not None:
        with batch:
            offered += _prompts(batch.fetch_table(["sample_id"]))
    assert sorted(offered) == sorted(set(range(6)) - set(committed))
    assert set(committed_after) <= set(offered)
    assert Counter(offered).most_common(1)[0][1] == 1
    client.checkpoint(job, tmp_path / "after.ckpt")  # covers the new commits: their data goes
    assert cluster.wait_idle(job) == (0, 0)


def test_restore_issues_tokens_above_every_generation_the_servers_saw(cluster, job, tmp_path):
    """Regression: a restore started its tokens just above the checkpoint's newest, but the rolled-back
    incarnation may have issued larger ones (after a crash recovery of its own, a new incarnation): the
    servers then refused every lease and delete of the restored job as stale, for ever. The restore now
    asks the servers for the highest generation they saw."""
    client = cluster.client()
    client.open_job(job, 1)
    put_groups(client.writer(job, 1), 3)
    ckpt = tmp_path / "job.ckpt"
    client.checkpoint(job, ckpt)
    high = LeaseToken(40 << 32)  # a token of a later incarnation of the rolled-back controller
    for g in cluster.controller.call("groups_in", {"job_id": job, "state": "READY"}):
        client.storage.client(g.location).advance_generation([GroupRead(Partition(*g.partition), high)])
    cluster.restart_controller()
    client = cluster.client()
    client.restore(ckpt, job_id=job, epoch=2, config=None)
    trained: list[int] = []
    trainer = client.trainer(job)
    while (batch := trainer.try_lease(3, wait=0.5)) is not None:
        assert batch.token > high.generation
        with batch:
            trained += _prompts(batch.fetch_table(["sample_id"]))
    assert sorted(trained) == [0, 1, 2]
    client.checkpoint(job, tmp_path / "after.ckpt")
    assert cluster.wait_idle(job) == (0, 0)


@pytest.mark.parametrize("delete", ["swept", "failing"])
def test_restore_reoffers_groups_committed_after_the_checkpoint_deterministically(
    cluster, job, tmp_path, monkeypatch, delete
):
    """Regression (issue 14, item 2): ``ck = checkpoint(); lease(2); fetch; commit(); restart controller;
    restore(ck, epoch=2)`` re-offered the two groups when the commit's delete had not run yet and dropped
    them when it had. Now the commit keeps their data until a later checkpoint is durable, so the restore
    offers them again either way: with the sweeper forced to run every delete it is given before the
    restart ("swept"), and with every delete failing ("failing")."""
    client = cluster.client()
    client.open_job(job, 1)
    put_groups(client.writer(job, 1), 4)
    ckpt = tmp_path / "job.ckpt"
    client.checkpoint(job, ckpt)
    assert cluster.controller is not None
    if delete == "failing":

        def refuse(work):
            raise RuntimeError("the storage server is away")

        monkeypatch.setattr(cluster.controller, "_deleter", refuse)
    with client.trainer(job).lease(2, wait=5) as batch:
        committed = _prompts(batch.fetch_table(["sample_id"]))
    if delete == "swept":
        cluster.controller.sweep()  # every due delete runs now, before the restart
        assert not client.controller.gc_list(job)
    held = sum(len(client.storage.client(loc).list_groups(job)) for loc in cluster.server_locations)
    assert held == 4  # the committed groups' data is kept for a restore

    cluster.restart_controller()
    client = cluster.client()
    counts = client.restore(ckpt, job_id=job, epoch=2)
    assert (counts["READY"], counts["lost"], counts["purged"]) == (4, 0, 0)
    with client.trainer(job).lease(4, wait=5) as batch:
        ids = batch.fetch_table(["sample_id"]).column("sample_id").to_pylist()
    assert len(ids) == len(set(ids)) == 16  # each sample once
    assert set(committed) <= set(_prompts(pa.table({"sample_id": ids})))
    client.checkpoint(job, ckpt)
    assert cluster.wait_idle(job) == (0, 0)


def test_restore_purges_and_counts_puts_made_after_the_checkpoint(cluster, job, tmp_path):
    """Regression (issue 14, item 3): puts acknowledged READY after the checkpoint (and a put granted but
    never published) had no ledger state after the restore while their data stayed on the servers, whose
    capacity never came back. The restore purges them through the GC list and counts them; once
    everything is trained and checkpointed the servers hold no byte of the job."""
    client = cluster.client()
    client.open_job(job, 1)
    writer = client.writer(job, 1)
    put_groups(writer, 3)
    ckpt = tmp_path / "job.ckpt"
    client.checkpoint(job, ckpt)
    put_groups(writer, 2, seed=3, first=3)  # acknowledged READY after the checkpoint
    batch = _one_group(job, 1, 0)
    grant = client.controller.allocate(job, 1, writer.writer_id, nbytes=batch.get_total_buffer_size())
    key = Partition(*grant.partition)
    keyed = trajflight.codec.with_partitions(batch, [key])
    client.storage.put_groups(grant.location, [(key, keyed)], writer=writer.writer_id, timeout=10)
    assert sum(len(client.storage.client(loc).list_groups(job)) for loc in cluster.server_locations) == 6

    cluster.restart_controller()
    client = cluster.client()
    with trajflight.connect(cluster.address, timeout=20) as remote:  # the listings cross the wire
        counts = remote.restore(ckpt, job_id=job, epoch=2)
        assert remote.lost(job) == ()
    assert (counts["READY"], counts["purged"], counts["lost"]) == (3, 3, 0)
    offered: list[int] = []
    trainer = client.trainer(job)
    while (leased := trainer.try_lease(2, wait=0.5)) is not None:
        with leased:
            offered += _prompts(leased.fetch_table(["sample_id"]))
    assert sorted(offered) == [0, 1, 2]
    client.checkpoint(job, ckpt)
    assert cluster.wait_idle(job) == (0, 0)
    for location in cluster.server_locations:
        stats = client.storage.client(location).stats()
        assert stats["jobs"].get(job, {}).get("bytes", 0) == 0
        assert not client.storage.client(location).list_groups(job)
    assert client.controller.counts(job)["purged"] == 3


def _one_group(job: str, epoch: int, group_id: int) -> pa.RecordBatch:
    (g,) = trajflight.workload.make_workload(1, 2, response_median=64)
    batch = g.encode(job, epoch)
    index = batch.schema.get_field_index("group_id")
    return batch.set_column(index, batch.schema.field(index), pa.array([group_id] * 2, pa.int64()))


def test_two_stage_pipeline_reward_stage_then_trainer(cluster, job):
    client = cluster.client()
    client.open_job(job, 1)
    writer = client.writer(job, 1)
    for g in trajflight.workload.make_workload(4, 4, response_median=64):
        columns = g.columns()
        del columns["advantage"]  # the stage below computes it
        writer.put(**columns)
    trainer = client.trainer(job)
    assert trainer.try_lease(4, wait=0.2, require=["advantage"]) is None  # nothing has it yet
    stage = client.trainer(job, owner="advantage-stage")
    done = 0
    while (batch := stage.try_lease(2, wait=0.5, lack=["advantage"])) is not None:
        for meta in batch.handle.groups:
            part = trajflight.BatchHandle(batch.handle.job_id, batch.token, (meta,))
            reward = trajflight.fetch_table(part.select(["reward"]), pool=client.storage).column("reward")
            r = reward.to_numpy()
            advantage = (r - r.mean()) / (r.std() + 1e-6)
            batch.append(meta.partition, pa.table({"advantage": pa.array(advantage.astype(np.float32))}))
        batch.release(columns=["advantage"])
        done += len(batch)
    assert done == 4
    assert stage.try_lease(4, wait=0.2, lack=["advantage"]) is None
    with trainer.lease(4, wait=2, require=["advantage"]) as batch:
        tensors = batch.fetch(["advantage", "reward"])
        assert tensors.tensors["advantage"].shape == (16,)
    assert cluster.wait_idle(job) == (0, 0)


def test_full_capacity_makes_puts_wait_then_raise_and_a_commit_frees_it(cluster, job):
    client = cluster.client()
    client.open_job(job, 1, {"capacity_groups": 2, "capacity_retry_after": "100ms"})
    writer = client.writer(job, 1)
    put_groups(writer, 2)
    with pytest.raises(CapacityExceededError, match="deadline") as info:
        put_groups_with_timeout(writer, timeout=0.5)
    assert info.value.retry_after > 0
    with client.trainer(job).lease(1, wait=2) as batch:
        batch.fetch_table(["reward"])
    put_groups_with_timeout(writer, timeout=5.0)  # capacity came back after the delete


def put_groups_with_timeout(writer: trajflight.Writer, *, timeout: float) -> None:
    (g,) = trajflight.workload.make_workload(1, 4, response_median=64, seed=3)
    writer.put(**g.columns(), timeout=timeout)


def test_an_exception_inside_the_with_block_never_commits(cluster, job):
    client = cluster.client()
    client.open_job(job, 1)
    put_groups(client.writer(job, 1), 2)
    trainer = client.trainer(job)

    def fails_before_training() -> None:
        with trainer.lease(2, wait=5) as batch:
            batch.fetch_table(["reward"])
            raise RuntimeError("boom")

    def fails_in_training() -> None:
        with trainer.lease(2, wait=5) as batch:
            batch.start_training()
            raise RuntimeError("failed in training")

    with pytest.raises(RuntimeError, match="boom"):
        fails_before_training()
    assert client.controller.counts(job)["READY"] == 2  # untrained groups went back at once
    with pytest.raises(RuntimeError, match="in training"):
        fails_in_training()
    counts = client.controller.counts(job)
    assert counts["committed_total"] == 0
    assert counts["TRAINING"] == 2  # left to expire into UNKNOWN, for an operator to resolve


def test_shards_are_fetched_by_other_processes_under_the_lease(cluster, job):
    client = cluster.client()
    client.open_job(job, 1)
    put_groups(client.writer(job, 1), 4)
    reader = textwrap.dedent(
        """
        import json, pickle, sys
        import trajflight
        handle = pickle.loads(bytes.fromhex(sys.argv[1]))
        batch = trajflight.fetch(handle, layout="padded")
        print(json.dumps({"rows": batch.num_rows, "shape": list(batch.padded["response_ids"].values.shape)}))
        """
    )
    import pickle

    with client.trainer(job).lease(4, wait=5) as batch:
        shards = [s.select(["response_ids"]) for s in batch.shards(2)]
        results = [run_child(reader, pickle.dumps(s).hex()) for s in shards]
        assert sum(r["rows"] for r in results) == 16
        empty = batch.shards(8)[-1]  # more shards than groups: some are empty, and read as empty
        assert not empty.groups
        assert trajflight.fetch(empty, pool=client.storage).num_rows == 0
        assert abs(shards[0].tokens - shards[1].tokens) <= max(g.tokens for g in batch.handle.groups)


def test_put_async_is_the_twin_of_put(cluster, job):
    client = cluster.client()
    client.open_job(job, 1)
    writer = client.writer(job, 1)
    (g,) = trajflight.workload.make_workload(1, 4, response_median=64)

    async def main() -> list[trajflight.GroupInfo]:
        return await asyncio.gather(*[writer.put_async(**g.columns()) for _ in range(3)])

    metas = asyncio.run(main())
    assert len({m.partition for m in metas}) == 3
    assert all(m.state == "READY" and m.rows == 4 for m in metas)
    many = asyncio.run(writer.put_many_async([g.columns(), g.columns()]))
    assert [m.state for m in many] == ["READY"] * 2
    assert len({m.partition for m in [*metas, *many]}) == 5


def test_lease_raises_when_nothing_becomes_ready(cluster, job):
    client = cluster.client()
    client.open_job(job, 1)
    with pytest.raises(DeadlineExceededError, match="became READY"):
        client.trainer(job).lease(1, wait=0.2)


@pytest.mark.parametrize("address", ["http://x", "localhost:1234", "ray:/"])
def test_bad_addresses_say_what_to_use(address):
    with pytest.raises(InvalidRequestError):
        trajflight.connect(address)


def test_put_refuses_partition_keys_and_mixed_inputs(cluster, job):
    client = cluster.client()
    client.open_job(job, 1)
    writer = client.writer(job, 1)
    with pytest.raises(InvalidRequestError, match="assigns group_id"):
        writer.put(group_id=3, prompt_ids=[1], response_ids=[[1]], response_logprobs=[[0.0]], reward=[1.0])
    (g,) = trajflight.workload.make_workload(1, 2, response_median=64)
    with pytest.raises(InvalidRequestError, match="either a record batch"):
        writer.put(g.encode(job, 1), reward=[1.0, 0.0])


def test_held_leases_renew_themselves_past_their_ttl(cluster, job):
    client = cluster.client()
    client.open_job(job, 1, {"default_lease_ttl": "500ms"})
    put_groups(client.writer(job, 1), 2)
    trainer = client.trainer(job, ttl=0.5)
    first, second = trainer.lease(1, wait=5), trainer.lease(1, wait=5)  # one renewal thread serves both
    time.sleep(1.6)
    assert first.renewals >= 2
    assert second.renewals >= 2
    assert first.lost is None
    first.commit()
    second.commit()
    assert cluster.wait_idle(job) == (0, 0)


def test_a_lease_that_stops_renewing_is_lost_and_refuses_transitions(cluster, job):
    client = cluster.client()
    client.open_job(job, 1, {"default_lease_ttl": "300ms"})
    put_groups(client.writer(job, 1), 1)
    batch = client.trainer(job, ttl=0.3).lease(1, wait=5, renew=False)
    time.sleep(0.6)
    with pytest.raises((LeaseExpiredError, StaleFenceError, NotFoundError)):
        batch.commit()
    assert client.controller.counts(job)["READY"] == 1  # LEASED went back to READY on expiry


def test_put_many_from_another_process_view_publishes_every_group_in_order(cluster, job):
    """Through the controller's Flight endpoint (a rollout worker's view) a batch is published in one
    controller operation (publish_many); every group comes back READY, in the order given, and the
    control server's stats count each group and its bytes."""
    cluster.client().open_job(job, 1)
    with trajflight.connect(cluster.address, timeout=20) as remote:
        before = remote.controller.transport.info(5)["counters"]
        groups = trajflight.workload.make_workload(5, 4, response_median=64)
        infos = remote.writer(job, 1).put_many([g.encode(job, 1) for g in groups])
        assert [i.rows for i in infos] == [4] * 5
        assert all(i.state == "READY" for i in infos)
        assert [i.partition.group_id for i in infos] == sorted({i.partition.group_id for i in infos})
        after = remote.controller.transport.info(5)["counters"]
        published = {k: after.get(k, 0) - before.get(k, 0) for k in ("groups_published", "bytes_published")}
        assert published == {"groups_published": 5, "bytes_published": sum(i.nbytes for i in infos)}
        with remote.trainer(job).lease(5, wait=5) as batch:
            assert batch.fetch_table(["reward"]).num_rows == 20
    assert cluster.wait_idle(job) == (0, 0)


def test_put_many_of_no_groups_stores_nothing_and_returns_nothing(cluster, job):
    client = cluster.client()
    client.open_job(job, 1)
    assert client.writer(job, 1).put_many([]) == []
    assert client.trainer(job).try_lease(4, wait=0.0) is None


def test_put_many_s_publication_runs_under_the_put_s_deadline(cluster, job, monkeypatch):
    """The controller's publish_many gets what is left of the put's timeout, not a deadline of its own."""
    client = cluster.client()
    client.open_job(job, 1)
    writer = client.writer(job, 1, put_timeout=60.0)
    given: list[float] = []
    publish_many = client.controller.publish_many

    def spy(items, *, timeout=None):
        given.append(timeout)
        return publish_many(items, timeout=timeout)

    monkeypatch.setattr(client.controller, "publish_many", spy)
    groups = trajflight.workload.make_workload(3, 4, response_median=64, seed=7)
    started = time.monotonic()
    infos = writer.put_many([g.encode(job, 1) for g in groups], timeout=5.0)
    assert [i.state for i in infos] == ["READY"] * 3
    elapsed = time.monotonic() - started
    assert len(given) == 1
    assert 5.0 - elapsed <= given[0] < 5.0  # what was left when it was called, not 5 s (or 60) again


def test_put_many_larger_than_free_capacity_completes_as_a_trainer_commits(cluster, job):
    """A batch needing more than the free capacity takes what fits, waits, and asks for the rest as the
    trainer's commits free capacity; every group is published, in order."""
    client = cluster.client()
    client.open_job(job, 1, {"capacity_groups": 6, "capacity_retry_after": "50ms"})
    put_groups(client.writer(job, 1), 4)  # 2 of 6 slots free
    committed = threading.Event()

    def trainer() -> None:
        time.sleep(0.3)  # the batch has taken the free slots and is waiting
        with client.trainer(job).lease(4, wait=5) as batch:
            batch.fetch_table(["reward"])
        committed.set()

    thread = threading.Thread(target=trainer)
    thread.start()
    with trajflight.connect(cluster.address, timeout=20) as remote:  # allocate_many over Flight
        groups = trajflight.workload.make_workload(5, 4, response_median=64, seed=5)
        infos = remote.writer(job, 1).put_many([g.encode(job, 1) for g in groups], timeout=20)
    thread.join(10)
    assert committed.is_set()  # 5 groups never fit beside the 4 READY ones: the commit had to come first
    assert [i.state for i in infos] == ["READY"] * 5
    assert [i.partition.group_id for i in infos] == sorted(i.partition.group_id for i in infos)
    with client.trainer(job).lease(5, wait=5) as batch:
        assert batch.fetch_table(["reward"]).num_rows == 20
    assert cluster.wait_idle(job) == (0, 0)


def test_put_many_larger_than_the_whole_capacity_fails_at_its_deadline_and_publishes_nothing(cluster, job):
    client = cluster.client()
    client.open_job(job, 1, {"capacity_groups": 3, "capacity_retry_after": "100ms", "grant_ttl": "500ms"})
    groups = trajflight.workload.make_workload(5, 4, response_median=64, seed=6)
    with pytest.raises(CapacityExceededError, match="deadline") as info:
        client.writer(job, 1).put_many([g.encode(job, 1) for g in groups], timeout=0.5)
    assert info.value.retry_after > 0
    assert client.controller.counts(job)["READY"] == 0
    assert cluster.wait_idle(job) == (0, 0)  # the 3 grants it held expired and were collected


def test_groups_put_from_their_columns_get_the_sample_ids_of_their_own_partition(cluster, job):
    """Regression: ``put(**columns)`` encoded every group under the placeholder group id 0, and the ids it
    defaulted to (``job/epoch/0/i``) were the same for every group; sample ids are globally
    unique. Now they follow the partition the controller assigns, for put and for put_many of mappings."""
    client = cluster.client()
    client.open_job(job, 1)
    writer = client.writer(job, 1)
    groups = trajflight.workload.make_workload(5, 3, response_median=64, seed=11)
    singles = [writer.put(**g.columns()) for g in groups[:2]]
    mixed = [groups[2].columns(), groups[3].columns(sample_ids=["x", "y", "z"]), groups[4].columns()]
    many = writer.put_many(mixed)  # the writer's ids for two groups, the caller's for one
    many += writer.put_many([g.columns() for g in groups[2:]])  # the writer's for all
    given = writer.put(**groups[0].columns(sample_ids=["a", "b", "c"]))  # the caller's ids stay
    own = {given.partition.group_id: ["a", "b", "c"], many[1].partition.group_id: ["x", "y", "z"]}
    with client.trainer(job).lease(9, wait=5) as batch:
        table = batch.fetch_table(["group_id", "sample_index", "sample_id"])
    ids = table.column("sample_id").to_pylist()
    keys = zip(table.column("group_id").to_pylist(), table.column("sample_index").to_pylist(), strict=True)
    assert ids == [own[g][i] if g in own else f"{job}/1/{g}/{i}" for g, i in keys]
    assert sorted(i.partition.group_id for i in [*singles, *many, given]) == sorted(
        set(table.column("group_id").to_pylist())
    )
    assert len(set(ids)) == len(ids) == 27
    assert cluster.wait_idle(job) == (0, 0)


def test_groups_put_from_their_columns_are_encoded_once_under_their_partition_and_charged_exactly(
    cluster, job
):
    """Regression (issue 15): the writer encoded a group under the placeholder group id 0, reserved a
    guessed 18 bytes a sample (``ID_SLACK``) for the ids the real partition would give it, re-stamped the
    key columns and published the guess. Now the partition is granted first, for a bound of the inputs,
    the group is encoded once under it, and it is charged what it takes (the rest comes back)."""
    client = cluster.client()
    client.open_job(job, 1)
    writer = client.writer(job, 1)
    groups = trajflight.workload.make_workload(6, 4, response_median=64, seed=12)
    singles = [writer.put(**g.columns()) for g in groups[:3]]
    many = writer.put_many([g.columns() for g in groups[3:]])
    for info, g in zip(singles, groups[:3], strict=True):
        own = trajflight.encode_group(
            job_id=job, epoch=1, group_id=info.partition.group_id, policy_version=0, **g.columns()
        )
        assert info.nbytes == own.get_total_buffer_size()
    together = trajflight.codec.encode_groups(
        job_id=job,
        epoch=1,
        groups=[
            {**g.columns(), "policy_version": 0, "group_id": i.partition.group_id}
            for g, i in zip(groups[3:], many, strict=True)
        ],
    )
    assert [i.nbytes for i in many] == list(together.nbytes)
    assert client.controller.usage(job) == (sum(i.nbytes for i in [*singles, *many]), 6)
    with client.trainer(job).lease(6, wait=5) as batch:
        batch.fetch_table(["reward"])
    assert cluster.wait_idle(job) == (0, 0)


def test_put_many_of_mappings_decodes_as_the_groups_put_one_by_one(cluster, job):
    """Groups given as columns are encoded together; each is published with its own rows, response tokens
    and oldest policy version (read for all groups at once from the joined batch)."""
    client = cluster.client()
    client.open_job(job, 1)
    client.trainer(job).announce_policy(3)
    writer = client.writer(job, 1, policy_version=3)
    groups = trajflight.workload.make_workload(4, 2, response_median=64, seed=12)
    columns = [g.columns() for g in groups]
    columns[2]["policy_version"] = np.array([3, 1])  # per sample: the group's oldest is 1
    infos = writer.put_many(columns)
    assert [i.rows for i in infos] == [2] * 4
    assert [i.policy_version for i in infos] == [3, 3, 1, 3]  # the writer's version by default, as put
    assert [i.tokens for i in infos] == [len(g.response_values) for g in groups]
    with client.trainer(job).lease(4, wait=5) as batch:
        table = batch.fetch_table(["group_id", "response_ids", "reward", "policy_version"])
    by_id = {i.partition.group_id: g for i, g in zip(infos, groups, strict=True)}
    for gid in set(table.column("group_id").to_pylist()):
        rows = table.filter(pa.compute.equal(table.column("group_id"), gid))
        assert np.array_equal(rows.column("response_ids").combine_chunks().values, by_id[gid].response_values)
        assert rows.column("reward").to_pylist() == by_id[gid].reward.tolist()
    assert cluster.wait_idle(job) == (0, 0)


def test_put_many_mixing_record_batches_and_mappings_is_refused(cluster, job):
    client = cluster.client()
    client.open_job(job, 1)
    (g,) = trajflight.workload.make_workload(1, 2, response_median=64)
    with pytest.raises(InvalidRequestError, match="all as mappings"):
        client.writer(job, 1).put_many([g.columns(), g.encode(job, 1)])
    with pytest.raises(InvalidRequestError, match="assigns group_id"):
        client.writer(job, 1).put_many([g.columns(group_id=3)])
    assert client.controller.counts(job)["READY"] == 0


def test_a_group_sliced_from_encoded_groups_asks_capacity_for_its_own_rows(cluster, job):
    """A slice's buffers are its parent's: counting them whole would ask capacity for every group."""
    client = cluster.client()
    client.open_job(job, 1)
    groups = trajflight.workload.make_workload(8, 4, response_median=256, seed=13)
    encoded = trajflight.codec.encode_groups(
        job_id=job, epoch=1, groups=[{**g.columns(), "group_id": g.group_id} for g in groups]
    )
    writer = client.writer(job, 1)
    for i in (0, 5):  # the first slice has no offset, but its buffers are the parent's
        info = writer.put(encoded[i])
        own = groups[i].encode(job, 1).nbytes
        assert own <= info.nbytes < own + 1024
    with client.trainer(job).lease(2, wait=5) as batch:
        assert batch.fetch_table(["reward"]).num_rows == 8
    assert cluster.wait_idle(job) == (0, 0)
