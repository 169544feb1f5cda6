"""The in-process host and the client over it: thread safety, long-poll, sweeper, deletes, recovery."""

from __future__ import annotations

import threading
import time

import pytest

from trajflight.controller import (
    ControllerClient,
    GroupDeletes,
    GroupState,
    JobConfig,
    LocalController,
    Publication,
)
from trajflight.errors import (
    CapacityExceededError,
    DeadlineExceededError,
    InvalidRequestError,
    LeaseExpiredError,
    NotFoundError,
    StaleFenceError,
    UnavailableError,
)

CONFIG = JobConfig(default_lease_ttl=10.0, max_lease_ttl=100.0, grant_ttl=5.0, max_group_bytes=1 << 20)


def _setup(client: ControllerClient, *, capacity_bytes: int = 10**9, config: JobConfig = CONFIG) -> None:
    client.register_server(
        "s0", node="n0", location="grpc://127.0.0.1:1", capacity_bytes=capacity_bytes, capacity_groups=10**6
    )
    client.open_job("j", 1, config)
    client.register_writer("j", 1, "w0", node="n0")


def _put(client: ControllerClient, n: int = 1, nbytes: int = 1000) -> list:
    out = []
    for _ in range(n):
        grant = client.allocate("j", 1, "w0", nbytes=nbytes)
        client.publish(
            grant.partition,
            token=grant.token,
            rows=8,
            nbytes=nbytes,
            tokens=10,
            policy_version=0,
            columns=("a",),
        )
        out.append(grant.partition)
    return out


def _train(client: ControllerClient, lease, batch: str = "b") -> None:
    client.prepare(lease.token, batch)
    client.start_training(lease.token, batch)
    client.finish_training(lease.token, batch)
    client.commit(lease.token, batch)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_client_drives_the_whole_lease_path_in_process():
    with LocalController() as host:
        client = ControllerClient(host, timeout=5.0)
        _setup(client)
        parts = _put(client, 3)
        lease = client.acquire("j", "trainer", max_groups=3)
        assert lease is not None
        assert lease.partitions == tuple(parts)
        _train(client, lease)
        assert client.counts("j")["COMMITTED"] + client.counts("j")["deleted"] == 3
        with pytest.raises(InvalidRequestError):
            client.acquire("j", "t", max_groups=1, ttl=0.0)  # a typed refusal travels as itself
        with pytest.raises(InvalidRequestError):
            client.acquire("j", "t", max_groups=1, wait=-1.0)


def test_long_poll_acquire_wakes_when_a_group_is_published():
    with LocalController() as host:
        client = ControllerClient(host, timeout=10.0)
        _setup(client)
        result = {}

        def trainer():
            t0 = time.monotonic()
            result["lease"] = client.acquire("j", "t", max_groups=1, wait=5.0)
            result["waited"] = time.monotonic() - t0

        thread = threading.Thread(target=trainer)
        thread.start()
        time.sleep(0.2)
        assert client.counts("j")["READY"] == 0  # other calls proceed while the trainer waits
        _put(client, 1)
        thread.join(5.0)
        assert result["lease"] is not None
        assert result["waited"] < 4.0


def test_a_parked_acquire_does_not_spin_while_a_slow_delete_holds_the_sweeper():
    """A delete that falls due while the sweeper is stuck in a slow one stays overdue until the sweeper
    comes back; a trainer parked meanwhile sleeps in the sweeper's interval, not 1 ms at a time (it used
    to wake about 500 times in half a second, each retry taking the host's lock)."""
    entered, unblock = threading.Event(), threading.Event()

    def slow_deleter(work):
        entered.set()
        unblock.wait(30.0)  # a storage server that answers late

    with LocalController(deleter=slow_deleter, sweep_interval=0.05) as host:
        client = ControllerClient(host, timeout=10.0)
        _setup(client)
        _put(client, 2)
        _train(client, client.acquire("j", "t", max_groups=1))
        assert entered.wait(10.0)  # the sweeper is now inside the slow delete
        _train(client, client.acquire("j", "t", max_groups=1))
        due = host._core.ledger.next_deadline()
        assert due is not None
        assert due <= time.time()  # the second delete is overdue
        applied = []
        real_apply = host._apply

        def counting_apply(command):
            applied.append(command.name)
            return real_apply(command)

        host._apply = counting_apply
        assert client.acquire("j", "t", max_groups=1, wait=0.5) is None
        unblock.set()
    acquires = applied.count("acquire")
    assert 1 <= acquires <= 20  # 0.5 s in 0.05 s sleeps, plus the first try and a wake or two


def test_long_poll_acquire_gives_up_after_wait():
    with LocalController() as host:
        client = ControllerClient(host)
        _setup(client)
        t0 = time.monotonic()
        assert client.acquire("j", "t", max_groups=1, wait=0.2) is None
        assert 0.15 <= time.monotonic() - t0 < 2.0


def test_call_past_its_deadline_raises_deadline_exceeded():
    with LocalController() as host:
        client = ControllerClient(host)
        _setup(client)
        with host._cond, pytest.raises(DeadlineExceededError):  # another caller holds the controller
            client.counts("j", timeout=0.05)


def test_closed_host_is_unavailable():
    host = LocalController()
    host.close()
    with pytest.raises(UnavailableError):
        ControllerClient(host).servers()


def test_sweeper_expires_leases_without_any_call():
    with LocalController(sweep_interval=0.02) as host:
        client = ControllerClient(host)
        _setup(client)
        _put(client, 2)
        training = client.acquire("j", "t", max_groups=1, ttl=0.3)
        client.prepare(training.token, "b")
        client.start_training(training.token, "b")
        leased = client.acquire("j", "t", max_groups=1, ttl=0.3)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            counts = host._core.ledger.counts("j")  # a query: no lazy expiry
            if counts["UNKNOWN"] == 1 and counts["READY"] == 1:
                break
            time.sleep(0.05)
        assert host._core.ledger.group(training.partitions[0]).state is GroupState.UNKNOWN
        assert host._core.ledger.group(leased.partitions[0]).state is GroupState.READY


def test_deletes_run_through_the_deleter_and_failures_are_retried():
    clock = FakeClock()
    calls, fail = [], {"on": True}

    def deleter(work):
        calls.append(work)
        if fail["on"]:
            raise ConnectionError("storage server down")

    host = LocalController(deleter=deleter, clock=clock, start=False)
    client = ControllerClient(host)
    _setup(client, capacity_bytes=1000)
    _put(client, 1)
    _train(client, client.acquire("j", "t", max_groups=1))
    assert host.sweep() == 1
    (entry,) = client.gc_list("j")
    assert "storage server down" in entry.last_error
    with pytest.raises(CapacityExceededError):  # capacity stays reserved until the delete is confirmed
        client.allocate("j", 1, "w0", nbytes=1000)
    assert host.sweep() == 0  # backing off
    clock.now += 1.0
    fail["on"] = False
    assert host.sweep() == 1
    assert [c.attempt for c in calls] == [1, 2]
    assert client.gc_list("j") == ()
    assert client.usage("j") == (0, 0)
    client.allocate("j", 1, "w0", nbytes=1000)
    host.close()


def test_group_deletes_send_a_pass_in_one_batch_and_a_raising_batch_is_retried():
    """GroupDeletes (the batch deleter of a plane without an archive): a pass's deletes in one call;
    a call that raises fails every item, which stays on the GC list and comes back after the back-off."""
    clock = FakeClock()
    batches, fail = [], {"on": True}

    def delete_groups(work):
        batches.append([w.partition.group_id for w in work])
        if fail["on"]:
            raise ConnectionError("storage server down")
        return [(w, True, None) for w in work]

    deletes = GroupDeletes(delete_groups)
    assert deletes([]) == []
    assert batches == []  # an empty pass calls nothing
    host = LocalController(batch_deleter=deletes, clock=clock, start=False)
    client = ControllerClient(host)
    _setup(client)
    _put(client, 2)
    _train(client, client.acquire("j", "t", max_groups=2))
    assert host.sweep() == 2
    assert {"storage server down" in e.last_error for e in client.gc_list("j")} == {True}
    clock.now += 1.0
    fail["on"] = False
    assert host.sweep() == 2
    assert [sorted(b) for b in batches] == [[0, 1], [0, 1]]  # both passes: one call of both groups
    assert client.gc_list("j") == ()
    assert client.usage("j") == (0, 0)
    host.close()


def test_restart_from_state_dir_recovers_with_larger_tokens_and_unknown_training(tmp_path):
    clock = FakeClock()
    host = LocalController(clock=clock, state_dir=tmp_path, start=False)
    client = ControllerClient(host)
    _setup(client)
    parts = _put(client, 4)
    training = client.acquire("j", "t", max_groups=1)
    client.prepare(training.token, "b")
    client.start_training(training.token, "b")
    leased = client.acquire("j", "t", max_groups=1)
    first_incarnation = host.incarnation
    host._core.close()  # the process dies: no clean shutdown, no final snapshot

    clock.now += 1.0
    again = LocalController(clock=clock, state_dir=tmp_path, start=False)
    client = ControllerClient(again)
    assert again.incarnation == first_incarnation + 1
    assert again._core.recovered_leases == 2
    counts = client.counts("j")
    assert counts["UNKNOWN"] == 1
    assert counts["READY"] == 3
    assert client.group(training.partitions[0]).state is GroupState.UNKNOWN
    lease = client.acquire("j", "t", max_groups=5)
    assert lease.token > leased.token
    assert set(lease.partitions) == set(parts) - set(training.partitions)
    with pytest.raises(LeaseExpiredError):
        client.finish_training(training.token, "b")
    with pytest.raises(StaleFenceError):
        client.release(leased.token, partitions=leased.partitions)
    again.close()


def test_torn_last_journal_record_is_ignored(tmp_path):
    clock = FakeClock()
    host = LocalController(clock=clock, state_dir=tmp_path, start=False)
    client = ControllerClient(host)
    _setup(client)
    _put(client, 2)
    host._core.close()
    (journal,) = tmp_path.glob("journal-*.log")
    journal.write_bytes(journal.read_bytes()[:-3])  # the last publish was torn mid-write
    again = LocalController(clock=clock, state_dir=tmp_path, start=False)
    counts = ControllerClient(again).counts("j")
    assert counts["READY"] == 1
    assert counts["ALLOCATED"] == 1
    again.close()


def test_checkpoint_and_restore_through_the_client(tmp_path):
    with LocalController() as host:
        client = ControllerClient(host)
        _setup(client)
        _put(client, 2)
        client.checkpoint("j", tmp_path / "j.ckpt")
    with LocalController() as host:
        client = ControllerClient(host)
        counts = client.restore(tmp_path / "j.ckpt", job_id="j", epoch=2, config=CONFIG)
        assert counts["READY"] == 2
        assert len(client.acquire("j", "t", max_groups=5).groups) == 2


def test_concurrent_trainers_never_share_a_group():
    with LocalController() as host:
        client = ControllerClient(host, timeout=10.0)
        _setup(client)
        parts = _put(client, 200, nbytes=10)
        got: list = []
        lock = threading.Lock()

        def trainer(i):
            while True:
                lease = client.acquire("j", f"t{i}", max_groups=7)
                if lease is None:
                    return
                _train(client, lease)
                with lock:
                    got.extend(lease.partitions)

        threads = [threading.Thread(target=trainer, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30.0)
        assert sorted(got) == sorted(parts)


def test_strict_on_policy_long_poll_wakes_when_the_last_writer_acks():
    with LocalController() as host:
        client = ControllerClient(host, timeout=10.0)
        _setup(client, config=JobConfig(strict_on_policy=True))
        client.announce_policy("j", 1)
        client.ack_policy("j", 1, "w0", 1)
        grant = client.allocate("j", 1, "w0", nbytes=10)
        client.publish(
            grant.partition, token=grant.token, rows=1, nbytes=10, tokens=1, policy_version=1, columns=()
        )
        client.register_writer("j", 1, "w1", node="n0", policy_version=0)  # a writer still on old weights
        result = {}
        thread = threading.Thread(
            target=lambda: result.update(lease=client.acquire("j", "t", max_groups=1, wait=5.0))
        )
        thread.start()
        time.sleep(0.2)
        assert "lease" not in result  # held: w1 has not acknowledged version 1
        client.ack_policy("j", 1, "w1", 1)
        thread.join(5.0)
        assert result["lease"].partitions == (grant.partition,)


def test_unknown_method_and_bad_arguments_are_invalid_requests():
    with LocalController() as host:
        with pytest.raises(InvalidRequestError):
            host.call("drop_everything", {})
        with pytest.raises(InvalidRequestError):
            host.call("counts", {"job": "j"})


def test_batched_allocation_through_the_in_process_client_stops_at_capacity_and_resumes_after_deletes():
    clock = FakeClock()
    host = LocalController(clock=clock, start=False)
    client = ControllerClient(host, timeout=5.0)
    _setup(client, capacity_bytes=1000)
    grants = client.allocate_many("j", 1, "w0", nbytes=[300, 300, 300, 300, 300])
    assert [g.partition.group_id for g in grants] == [0, 1, 2]  # a prefix, in order, each whole
    assert [g.token for g in grants] == sorted({g.token for g in grants})
    assert client.usage("j") == (900, 3)
    with pytest.raises(CapacityExceededError) as err:  # not even the first fits: nothing granted
        client.allocate_many("j", 1, "w0", nbytes=[300, 300])
    assert err.value.retry_after > 0
    with pytest.raises(InvalidRequestError, match="nbytes is empty"):
        client.allocate_many("j", 1, "w0", nbytes=[])
    clock.now += CONFIG.grant_ttl  # never published: the grants expire, their deletes free the capacity
    assert host.sweep() == 3
    rest = client.allocate_many("j", 1, "w0", nbytes=[300, 300])
    assert [g.partition.group_id for g in rest] == [3, 4]
    host.close()


def test_batched_publication_through_the_in_process_client_wakes_a_waiting_trainer():
    with LocalController() as host:
        client = ControllerClient(host, timeout=5.0)
        _setup(client)
        grants = client.allocate_many("j", 1, "w0", nbytes=[1000, 1000, 1000])
        items = [Publication(g.partition, g.token, 8, 900, 10, 0, ("a",)) for g in grants]
        with pytest.raises(NotFoundError):  # one unknown partition: nothing is published
            client.publish_many([*items[:2], Publication(("j", 1, 99), 1, 8, 900, 10, 0, ("a",))])
        assert client.counts("j")["READY"] == 0
        leased = []
        waiter = threading.Thread(
            target=lambda: leased.append(client.acquire("j", "t", max_groups=3, wait=5))
        )
        waiter.start()
        time.sleep(0.05)  # the trainer is long-polling; publish_many wakes it
        infos = client.publish_many(items)
        waiter.join(5)
        assert [i.partition for i in infos] == [g.partition for g in grants]
        assert client.usage("j") == (2700, 3)
        (lease,) = leased
        assert lease is not None
        assert lease.partitions == tuple(g.partition for g in grants)
