"""The ledger, one test per transition and per refusal, with a fake clock."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trajflight.controller import GroupState, JobConfig, Ledger, Partition
from trajflight.errors import (
    AlreadyExistsError,
    CapacityExceededError,
    ConfigError,
    InvalidRequestError,
    InvalidStateError,
    LeaseExpiredError,
    NotFoundError,
    StaleFenceError,
)

# ---------------------------------------------------------------- jobs and epochs


def test_open_job_same_epoch_same_config_is_idempotent(world):
    assert world.ledger.open_job("j", 1, world.ledger._jobs["j"].config, now=world.now).grant_ttl == 5.0


def test_open_job_same_epoch_other_config_names_the_setting(world):
    with pytest.raises(ConfigError) as err:
        world.ledger.open_job(
            "j", 1, {**world.ledger._jobs["j"].config.to_mapping(), "grant_ttl": "7s"}, now=world.now
        )
    assert err.value.setting == "grant_ttl"


def test_open_job_smaller_epoch_is_fenced(world):
    with pytest.raises(StaleFenceError):
        world.ledger.open_job("j", 0, None, now=world.now)


def test_new_epoch_fences_old_allocations_puts_and_leases(world):
    (g_leased, g_training, g_ready) = world.put(3)
    grant = world.ledger.allocate("j", 1, "w0", nbytes=10, now=world.now)
    lease1 = world.lease(1)
    lease2 = world.lease(1)
    world.ledger.prepare(lease2.token, "b", now=world.now)
    world.ledger.start_training(lease2.token, "b", now=world.now)
    world.ledger.open_job("j", 2, world.ledger._jobs["j"].config, now=world.now)
    with pytest.raises(StaleFenceError):
        world.ledger.allocate("j", 1, "w0", nbytes=10, now=world.now)
    with pytest.raises(StaleFenceError):
        world.ledger.publish(
            grant.partition,
            token=grant.token,
            rows=1,
            nbytes=10,
            tokens=1,
            policy_version=0,
            columns=(),
            now=world.now,
        )
    with pytest.raises(StaleFenceError):
        world.ledger.prepare(lease1.token, "b", now=world.now)
    with pytest.raises(StaleFenceError):
        world.ledger.finish_training(lease2.token, "b", now=world.now)
    assert world.state(g_ready) == "READY"  # re-offered by default
    assert world.state(g_leased) == "READY"
    assert world.state(g_training) == "UNKNOWN"
    assert world.ledger.group(grant.partition).state is GroupState.DROPPED  # abandoned grant -> GC
    with pytest.raises(NotFoundError):  # writers register again under the new epoch
        world.ledger.allocate("j", 2, "w0", nbytes=10, now=world.now)


def test_new_epoch_can_drop_old_ready_groups(world):
    (g,) = world.put(1)
    world.ledger.open_job("j", 2, world.ledger._jobs["j"].config, now=world.now, old_ready="drop")
    assert world.state(g) == "DROPPED"
    assert world.confirm_deletes() == 1
    assert world.ledger.usage("j") == (0, 0)


def test_unopened_epoch_and_job_are_not_found(world):
    with pytest.raises(NotFoundError):
        world.ledger.allocate("j", 2, "w0", nbytes=10, now=world.now)
    with pytest.raises(NotFoundError):
        world.ledger.acquire("nope", "t", max_groups=1, now=world.now)


# ---------------------------------------------------------------- partitions and capacity


def test_allocate_places_on_writer_node_then_least_loaded(world):
    L = world.ledger
    L.register_server(
        "s1", node="n1", location="grpc://b", capacity_bytes=10**9, capacity_groups=100, now=world.now
    )
    L.register_server(
        "s2", node="n1", location="grpc://c", capacity_bytes=10**9, capacity_groups=100, now=world.now
    )
    L.register_writer("j", 1, "w1", node="n1", now=world.now)
    L.register_writer("j", 1, "w9", node="elsewhere", now=world.now)
    assert L.allocate("j", 1, "w0", nbytes=100, now=world.now).server_id == "s0"
    a = L.allocate("j", 1, "w1", nbytes=100, now=world.now).server_id
    b = L.allocate("j", 1, "w1", nbytes=100, now=world.now).server_id
    assert {a, b} == {"s1", "s2"}  # same node, least loaded first
    assert L.allocate("j", 1, "w9", nbytes=50, now=world.now).server_id in {"s0", "s1", "s2"}
    c = L.allocate("j", 1, "w9", nbytes=1, now=world.now).server_id
    used = {s.server_id: s.used_bytes for s in L.servers()}
    assert used[c] == min(used.values()) + 1 or used[c] <= 151


def test_allocate_refused_when_servers_full_with_retry_hint(world_factory):
    w = world_factory(capacity_bytes=2500)
    w.put(2)
    with pytest.raises(CapacityExceededError) as err:
        w.ledger.allocate("j", 1, "w0", nbytes=1000, now=w.now)
    assert err.value.retry_after > 0


def test_allocate_refused_at_job_group_capacity(world_factory):
    w = world_factory(JobConfig(capacity_groups=2))
    w.put(2)
    with pytest.raises(CapacityExceededError):
        w.put(1)


def test_allocate_refuses_oversized_group_and_unknown_writer(world):
    with pytest.raises(InvalidRequestError):
        world.ledger.allocate("j", 1, "w0", nbytes=(1 << 20) + 1, now=world.now)
    with pytest.raises(NotFoundError):
        world.ledger.allocate("j", 1, "ghost", nbytes=1, now=world.now)


def _placement_world(servers, job_caps, preload):
    """Servers ((node, bytes, groups) each), writer ``w0`` on ``n0``, and ``preload`` already granted."""
    L = Ledger()
    for i, (node, cap_bytes, cap_groups) in enumerate(servers):
        L.register_server(
            f"s{i}", node=node, location=f"grpc://s{i}", capacity_bytes=cap_bytes, capacity_groups=cap_groups,
            now=0.0,
        )  # fmt: skip
    cap_bytes, cap_groups = job_caps
    L.open_job(
        "j", 1, JobConfig(max_group_bytes=1000, capacity_bytes=cap_bytes, capacity_groups=cap_groups), now=0.0
    )
    L.register_writer("j", 1, "w0", node="n0", now=0.0)
    for nbytes in preload:
        with contextlib.suppress(CapacityExceededError):
            L.allocate("j", 1, "w0", nbytes=nbytes, now=0.0)
    return L


_sizes = st.integers(1, 1000)


@settings(max_examples=200, deadline=None)
@given(
    servers=st.lists(
        st.tuples(st.sampled_from(["n0", "n1"]), st.integers(0, 6000), st.integers(0, 8)),
        min_size=1,
        max_size=3,
    ),
    job_caps=st.tuples(st.none() | st.integers(1000, 8000), st.none() | st.integers(1, 12)),
    preload=st.lists(_sizes, max_size=6),
    sizes=st.lists(_sizes, min_size=1, max_size=20),
)
def test_allocate_many_grants_exactly_what_repeated_allocate_grants(servers, job_caps, preload, sizes):
    """The grants of repeated allocate (partitions, tokens, sizes, expiries, the refusal), with every
    group on one server where the batch fits one: the server placement picks for the batch's total
    (writer's node first, then least loaded; off the node only where the first group's would be too)."""
    many = _placement_world(servers, job_caps, preload)
    one_by_one = _placement_world(servers, job_caps, preload)
    together = _one_server_for(many, job_caps, sizes)
    try:
        got: list | CapacityExceededError = many.allocate_many("j", 1, "w0", nbytes=sizes, now=1.0)
    except CapacityExceededError as exc:
        got = exc
    expected: list = []
    refusal = None
    for nbytes in sizes:
        try:
            expected.append(one_by_one.allocate("j", 1, "w0", nbytes=nbytes, now=1.0))
        except CapacityExceededError as exc:
            refusal = exc
            break
    if together is not None:
        assert len(expected) == len(sizes)  # a batch one server holds fits group by group too
        assert got == [
            dataclasses.replace(g, server_id=together.server_id, location=together.location) for g in expected
        ]
        assert many.usage("j") == one_by_one.usage("j")
        used = {s.server_id: s.used_bytes for s in many.servers()}
        before = {s.server_id: s.used_bytes for s in _placement_world(servers, job_caps, preload).servers()}
        assert used == {k: v + (sum(sizes) if k == together.server_id else 0) for k, v in before.items()}
        return
    if expected:
        assert got == expected
    else:  # not even the first fits: the batch raises exactly what the first allocate raises
        assert isinstance(got, CapacityExceededError)
        assert (got.message, got.retry_after) == (refusal.message, refusal.retry_after)
    assert many.snapshot() == one_by_one.snapshot()  # the same ledger afterwards, not only the same grants


def _one_server_for(ledger, job_caps, sizes):
    """The server a batch of ``sizes`` from ``w0`` (node ``n0``) goes to as a whole, or None, worked out
    from the servers' and the job's usage (the rule of ``Ledger.allocate_many``)."""
    if len(sizes) < 2:
        return None
    cap_bytes, cap_groups = job_caps
    used_bytes, used_groups = ledger.usage("j")
    if (cap_bytes is not None and used_bytes + sum(sizes) > cap_bytes) or (
        cap_groups is not None and used_groups + len(sizes) > cap_groups
    ):
        return None

    def rank(s, nbytes, groups):
        fits = s.used_bytes + nbytes <= s.capacity_bytes and s.used_groups + groups <= s.capacity_groups
        return (s.node != "n0", s.used_bytes, s.server_id) if fits else None

    def best(nbytes, groups):
        ranked = [(r, s) for s in ledger.servers() if (r := rank(s, nbytes, groups)) is not None]
        return min(ranked, key=lambda rs: rs[0])[1] if ranked else None

    server = best(sum(sizes), len(sizes))
    if server is None or server.node == "n0":
        return server
    first = best(sizes[0], 1)
    return server if first is None or first.node != "n0" else None


def test_a_batch_one_server_holds_goes_to_that_server_whole():
    """Two servers on the writer's node: a batch both could share goes to the less loaded one whole, so
    that a lease of it reads one slice; the next batch goes to the other."""
    L = _placement_world([("n0", 3_000, 100), ("n0", 3_000, 100)], (None, None), [])
    first = L.allocate_many("j", 1, "w0", nbytes=[100] * 8, now=1.0)
    second = L.allocate_many("j", 1, "w0", nbytes=[100] * 8, now=1.0)
    assert {g.server_id for g in first} == {"s0"}
    assert {g.server_id for g in second} == {"s1"}
    split = L.allocate_many("j", 1, "w0", nbytes=[900, 900, 900], now=1.0)  # no one server holds it
    assert sorted(g.server_id for g in split) == ["s0", "s0", "s1"]


def test_allocate_many_returns_the_grants_that_fit_at_the_capacity_limit(world_factory):
    w = world_factory(JobConfig(capacity_groups=3, capacity_retry_after=0.25))
    (first,) = w.put(1)
    grants = w.ledger.allocate_many("j", 1, "w0", nbytes=[100, 200, 300, 400], now=w.now)
    assert [g.nbytes for g in grants] == [100, 200]
    assert [g.partition.group_id for g in grants] == [
        first.partition.group_id + 1,
        first.partition.group_id + 2,
    ]
    assert all(g.expires_at == w.now + JobConfig().grant_ttl for g in grants)
    assert w.ledger.usage("j") == (1000 + 300, 3)  # nothing is reserved for the groups not granted
    with pytest.raises(CapacityExceededError, match="wait for trainers to commit") as err:
        w.ledger.allocate_many("j", 1, "w0", nbytes=[300, 400], now=w.now)
    assert err.value.retry_after == 0.25


def test_allocate_many_never_grants_a_later_group_ahead_of_one_that_did_not_fit(world_factory):
    w = world_factory(capacity_bytes=1500)
    grants = w.ledger.allocate_many("j", 1, "w0", nbytes=[1000, 600, 10], now=w.now)
    assert [g.nbytes for g in grants] == [1000]  # 10 bytes would fit, but not before the 600
    assert w.ledger.usage("j") == (1000, 1)


def test_allocate_many_grants_expire_and_are_collected_like_single_grants(world):
    grants = world.ledger.allocate_many("j", 1, "w0", nbytes=[10, 20], now=world.now)
    world.clock.advance(5.0)
    world.ledger.tick(world.now)
    assert [world.state(g) for g in grants] == ["DROPPED", "DROPPED"]
    assert world.confirm_deletes() == 2
    assert world.ledger.usage("j") == (0, 0)


@pytest.mark.parametrize(
    ("nbytes", "match"),
    [
        ([], "nbytes is empty"),
        ([10, 0], r"nbytes\[1\] must be an int >= 1"),
        ([10, -5], r"nbytes\[1\] must be an int >= 1"),
        ([True], r"nbytes\[0\] must be an int"),
        ([10, (1 << 20) + 1], r"nbytes\[1\]=1048577 exceeds max_group_bytes"),
        (10, "must be a list of group sizes"),
        ("10", "must be a list of group sizes"),
    ],
)
def test_allocate_many_refuses_bad_sizes_and_grants_nothing(world, nbytes, match):
    before = (world.ledger.usage("j"), world.ledger.last_token)
    with pytest.raises(InvalidRequestError, match=match):
        world.ledger.allocate_many("j", 1, "w0", nbytes=nbytes, now=world.now)
    assert (world.ledger.usage("j"), world.ledger.last_token) == before


def test_allocate_many_refuses_like_allocate_for_writer_epoch_and_policy(world_factory):
    w = world_factory(JobConfig(strict_on_policy=True))
    L = w.ledger
    with pytest.raises(NotFoundError, match="register_writer"):
        L.allocate_many("j", 1, "ghost", nbytes=[1], now=w.now)
    with pytest.raises(NotFoundError):
        L.allocate_many("j", 2, "w0", nbytes=[1], now=w.now)
    L.announce_policy("j", 1, now=w.now)
    with pytest.raises(InvalidStateError, match="ack_policy") as err:
        L.allocate_many("j", 1, "w0", nbytes=[1], now=w.now)
    assert err.value.retry_after > 0
    L.open_job("j", 2, L._jobs["j"].config, now=w.now)
    with pytest.raises(StaleFenceError):
        L.allocate_many("j", 1, "w0", nbytes=[1], now=w.now)
    assert L.usage("j") == (0, 0)


def test_publish_makes_ready_and_gives_back_unused_reservation(world):
    L = world.ledger
    grant = L.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    assert world.state(grant) == "ALLOCATED"
    assert L.usage("j") == (1000, 1)
    info = L.publish(
        grant.partition,
        token=grant.token,
        rows=8,
        nbytes=600,
        tokens=77,
        policy_version=0,
        columns=("b", "a"),
        now=world.now,
    )
    assert info.state is GroupState.READY
    assert info.columns == ("a", "b")
    assert info.tokens == 77
    assert L.usage("j") == (600, 1)


def test_publish_repeat_is_idempotent_and_other_values_refused(world):
    L = world.ledger
    grant = L.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    kw = dict(
        token=grant.token, rows=8, nbytes=600, tokens=77, policy_version=0, columns=("a",), now=world.now
    )
    first = L.publish(grant.partition, **kw)
    assert L.publish(grant.partition, **kw) == first
    with pytest.raises(AlreadyExistsError):
        L.publish(grant.partition, **{**kw, "rows": 9})


@pytest.mark.parametrize("columns", [("a", ""), ["a", ""], ("a", 3)])
def test_publish_refuses_bad_column_names_every_time(world, columns):
    """Column tuples are checked once and remembered; a refusal must not be remembered as a pass."""
    L = world.ledger
    grant = L.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    kw = dict(token=grant.token, rows=8, nbytes=600, tokens=7, policy_version=0, now=world.now)
    for _ in range(2):
        with pytest.raises(InvalidRequestError, match="column name"):
            L.publish(grant.partition, columns=columns, **kw)
    assert L.publish(grant.partition, columns=("a", "b"), **kw).columns == ("a", "b")


def test_publish_with_wrong_token_is_stale(world):
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    with pytest.raises(StaleFenceError):
        world.ledger.publish(
            grant.partition,
            token=grant.token + 1,
            rows=1,
            nbytes=1,
            tokens=1,
            policy_version=0,
            columns=(),
            now=world.now,
        )


def test_publish_larger_than_reserved_refused(world):
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    with pytest.raises(InvalidRequestError):
        world.ledger.publish(
            grant.partition,
            token=grant.token,
            rows=1,
            nbytes=1001,
            tokens=1,
            policy_version=0,
            columns=(),
            now=world.now,
        )


def test_expired_grant_is_garbage_collected_and_publish_refused(world):
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    world.clock.advance(5.0)
    world.ledger.tick(world.now)
    assert world.state(grant) == "DROPPED"
    with pytest.raises(LeaseExpiredError):
        world.ledger.publish(
            grant.partition,
            token=grant.token,
            rows=1,
            nbytes=1,
            tokens=1,
            policy_version=0,
            columns=(),
            now=world.now,
        )
    assert world.ledger.usage("j") == (1000, 1)  # not released before the delete is confirmed
    assert world.confirm_deletes() == 1
    assert world.ledger.usage("j") == (0, 0)


# ---------------------------------------------------------------- the lease path


def test_acquire_ready_to_leased_with_fresh_token(world):
    grants = world.put(3)
    lease = world.lease(2)
    assert [g.partition for g in lease.groups] == [grants[0].partition, grants[1].partition]
    assert all(g.state is GroupState.LEASED and g.generation == lease.token for g in lease.groups)
    assert lease.token > grants[-1].token
    assert world.ledger.counts("j")["READY"] == 1


def test_acquire_returns_none_when_nothing_ready(world):
    assert world.ledger.acquire("j", "t", max_groups=4, now=world.now) is None


def test_acquire_refuses_bad_limits(world):
    with pytest.raises(InvalidRequestError):
        world.ledger.acquire("j", "t", max_groups=0, now=world.now)
    with pytest.raises(InvalidRequestError):
        world.ledger.acquire("j", "t", max_groups=1, ttl=1000.0, now=world.now)


def test_acquire_token_budget(world):
    world.put(5, tokens=100)
    lease = world.lease(5, max_tokens=250)
    assert len(lease.groups) == 2
    assert lease.total_tokens == 200


def test_acquire_token_budget_takes_one_oversized_group_alone(world):
    world.put(2, tokens=1000)
    assert len(world.lease(5, max_tokens=10).groups) == 1


def test_prepare_leased_to_prepared(world):
    world.put(2)
    lease = world.lease(2)
    keys = world.ledger.prepare(lease.token, "b0", now=world.now)
    assert len(keys) == 2
    assert all(
        world.ledger.group(k).state is GroupState.PREPARED and world.ledger.group(k).batch_id == "b0"
        for k in keys
    )


def test_prepare_subset_then_rest(world):
    world.put(3)
    lease = world.lease(3)
    first = world.ledger.prepare(lease.token, "b0", partitions=lease.partitions[:1], now=world.now)
    rest = world.ledger.prepare(lease.token, "b1", now=world.now)
    assert first == lease.partitions[:1]
    assert rest == lease.partitions[1:]


def test_prepare_repeat_identical_is_idempotent_and_other_groups_refused(world):
    world.put(2)
    lease = world.lease(2)
    keys = world.ledger.prepare(lease.token, "b0", partitions=lease.partitions[:1], now=world.now)
    assert world.ledger.prepare(lease.token, "b0", partitions=lease.partitions[:1], now=world.now) == keys
    with pytest.raises(InvalidStateError):
        world.ledger.prepare(lease.token, "b0", partitions=lease.partitions[1:], now=world.now)


def test_prepare_refuses_group_not_leased(world):
    world.put(2)
    lease = world.lease(1)
    other = next(g for g in world.grants if g.partition not in lease.partitions)
    with pytest.raises(NotFoundError):
        world.ledger.prepare(lease.token, "b0", partitions=[other.partition], now=world.now)
    world.ledger.prepare(lease.token, "b0", now=world.now)
    with pytest.raises(InvalidStateError):
        world.ledger.prepare(lease.token, "b1", partitions=lease.partitions, now=world.now)


def test_start_training_prepared_to_training(world):
    world.put(1)
    lease = world.lease(1)
    world.ledger.prepare(lease.token, "b", now=world.now)
    keys = world.ledger.start_training(lease.token, "b", now=world.now)
    assert world.ledger.group(keys[0]).state is GroupState.TRAINING
    assert world.ledger.start_training(lease.token, "b", now=world.now) == keys  # identical repeat


def test_start_training_refused_unless_prepared(world):
    world.put(1)
    lease = world.lease(1)
    with pytest.raises(NotFoundError):
        world.ledger.start_training(lease.token, "b", now=world.now)
    world.ledger.prepare(lease.token, "b", now=world.now)
    world.ledger.start_training(lease.token, "b", now=world.now)
    world.ledger.finish_training(lease.token, "b", now=world.now)
    with pytest.raises(InvalidStateError):
        world.ledger.start_training(lease.token, "b", now=world.now)


def test_finish_training_training_to_trained(world):
    world.put(1)
    lease = world.lease(1)
    world.ledger.prepare(lease.token, "b", now=world.now)
    with pytest.raises(InvalidStateError):
        world.ledger.finish_training(lease.token, "b", now=world.now)
    world.ledger.start_training(lease.token, "b", now=world.now)
    keys = world.ledger.finish_training(lease.token, "b", now=world.now)
    assert world.ledger.group(keys[0]).state is GroupState.TRAINED
    assert world.ledger.finish_training(lease.token, "b", now=world.now) == keys


def test_commit_trained_to_committed_and_gc(world):
    (g,) = world.put(1)
    lease = world.lease(1)
    world.ledger.prepare(lease.token, "b", now=world.now)
    world.ledger.start_training(lease.token, "b", now=world.now)
    with pytest.raises(InvalidStateError):
        world.ledger.commit(lease.token, "b", now=world.now)
    world.ledger.finish_training(lease.token, "b", now=world.now)
    world.ledger.commit(lease.token, "b", now=world.now)
    assert world.state(g) == "COMMITTED"
    assert [w.partition for w in world.ledger.gc_list("j")] == [g.partition]
    assert world.ledger.commit(lease.token, "b", now=world.now) == (g.partition,)  # repeat after lease ended
    assert world.ledger.counts("j")["committed_total"] == 1


def test_commit_releases_capacity_only_after_confirmed_delete(world):
    (g,) = world.put(1)
    world.train(world.lease(1))
    assert world.ledger.usage("j") == (1000, 1)
    (work,) = world.ledger.take_deletes(now=world.now)
    assert work.token == world.ledger.group(g.partition).generation
    assert world.ledger.usage("j") == (1000, 1)
    assert world.ledger.delete_done(work.partition, ok=True, now=world.now)
    assert world.ledger.usage("j") == (0, 0)
    with pytest.raises(NotFoundError):
        world.ledger.group(g.partition)


def test_failed_delete_stays_on_gc_list_and_is_retried_never_retrained(world):
    (g,) = world.put(1)
    world.train(world.lease(1))
    (work,) = world.ledger.take_deletes(now=world.now)
    assert not world.ledger.delete_done(work.partition, ok=False, error="server down", now=world.now)
    assert world.ledger.take_deletes(now=world.now) == []  # backing off
    (entry,) = world.ledger.gc_list("j")
    assert entry.last_error == "server down"
    assert entry.attempt == 1
    assert world.ledger.acquire("j", "t", max_groups=10, now=world.now) is None
    world.clock.advance(0.5)
    (again,) = world.ledger.take_deletes(now=world.now)
    assert again.attempt == 2
    assert again.last_error == "server down"
    assert world.state(g) == "COMMITTED"


def test_unreported_delete_is_handed_out_again_after_timeout(world):
    world.put(1)
    world.train(world.lease(1))
    assert len(world.ledger.take_deletes(now=world.now)) == 1
    world.clock.advance(29.0)
    assert world.ledger.take_deletes(now=world.now) == []
    world.clock.advance(1.0)
    assert len(world.ledger.take_deletes(now=world.now)) == 1


def test_late_duplicate_delete_report_is_ignored(world):
    world.put(1)
    world.train(world.lease(1))
    (work,) = world.ledger.take_deletes(now=world.now)
    assert world.ledger.delete_done(work.partition, ok=True, now=world.now)
    assert not world.ledger.delete_done(work.partition, ok=True, now=world.now)
    assert world.ledger.usage("j") == (0, 0)


# ---------------------------------------------------------------- renew and expiry


def test_renew_extends_the_whole_lease(world):
    world.put(2)
    lease = world.lease(2)
    world.clock.advance(9.0)
    assert world.ledger.renew(lease.token, now=world.now) == world.now + 10.0
    world.clock.advance(9.0)
    world.ledger.prepare(lease.token, "b", now=world.now)  # still alive


def test_expiry_leased_and_prepared_go_back_to_ready(world):
    world.put(2)
    lease = world.lease(2)
    world.ledger.prepare(lease.token, "b", partitions=lease.partitions[:1], now=world.now)
    world.clock.advance(10.0)
    assert world.ledger.counts("j")["READY"] == 0  # lazy: nothing happens without a call
    world.ledger.tick(world.now)
    assert all(world.ledger.group(p).state is GroupState.READY for p in lease.partitions)
    again = world.lease(2)
    assert again.token > lease.token
    assert set(again.partitions) == set(lease.partitions)


def test_expiry_training_and_trained_go_to_unknown_and_stay(world):
    world.put(2)
    lease = world.lease(2)
    L = world.ledger
    L.prepare(lease.token, "b0", partitions=lease.partitions[:1], now=world.now)
    L.prepare(lease.token, "b1", partitions=lease.partitions[1:], now=world.now)
    L.start_training(lease.token, "b0", now=world.now)
    L.start_training(lease.token, "b1", now=world.now)
    L.finish_training(lease.token, "b1", now=world.now)
    world.clock.advance(10.0)
    with pytest.raises(LeaseExpiredError):  # lazy expiry on the call itself
        L.commit(lease.token, "b1", now=world.now)
    assert [L.group(p).state for p in lease.partitions] == [GroupState.UNKNOWN, GroupState.UNKNOWN]
    world.clock.advance(1000.0)
    assert L.acquire("j", "t", max_groups=5, now=world.now) is None
    assert L.counts("j")["UNKNOWN"] == 2


def test_every_call_on_an_expired_lease_is_refused(world):
    world.put(1)
    lease = world.lease(1)
    world.clock.advance(10.0)
    for call in (
        lambda: world.ledger.renew(lease.token, now=world.now),
        lambda: world.ledger.prepare(lease.token, "b", now=world.now),
        lambda: world.ledger.release(lease.token, now=world.now),
    ):
        with pytest.raises(LeaseExpiredError):
            call()


def test_old_token_refused_after_regrant(world):
    world.put(1)
    old = world.lease(1)
    world.ledger.prepare(old.token, "b", now=world.now)
    world.clock.advance(10.0)
    new = world.lease(1)
    assert new.token > old.token
    with pytest.raises(LeaseExpiredError):
        world.ledger.start_training(old.token, "b", now=world.now)
    with pytest.raises(StaleFenceError):
        world.ledger.release(old.token, partitions=old.partitions, now=world.now)


def test_unknown_and_forgotten_tokens(world):
    with pytest.raises(NotFoundError):
        world.ledger.renew(10**15, now=world.now)
    world.put(1)
    lease = world.lease(1)
    world.ledger._leases.forget_ended()
    world.clock.advance(10.0)
    world.ledger.tick(world.now)
    world.ledger._leases.forget_ended()  # forgotten tombstone: still refused as stale
    with pytest.raises(StaleFenceError):
        world.ledger.renew(lease.token, now=world.now)


# ---------------------------------------------------------------- release and pipeline stages


def test_release_records_columns_and_requires_lack(world):
    world.put(3, columns=("response_ids",))
    stage = world.lease(3, lack=("advantage",))
    done = world.ledger.release(
        stage.token, partitions=stage.partitions[:2], columns=("advantage",), now=world.now
    )
    assert (
        world.ledger.release(
            stage.token, partitions=stage.partitions[:2], columns=("advantage",), now=world.now
        )
        == done
    )  # identical repeat
    world.ledger.release(stage.token, now=world.now)  # the rest, without columns
    trainer = world.ledger.acquire("j", "t", max_groups=10, require=("advantage",), now=world.now)
    assert trainer is not None
    assert set(trainer.partitions) == set(done)
    assert all("advantage" in g.columns for g in trainer.groups)
    assert world.ledger.acquire("j", "s", max_groups=10, lack=("advantage",), now=world.now).partitions == (
        stage.partitions[2],
    )


def test_release_refused_for_training_groups(world):
    world.put(1)
    lease = world.lease(1)
    world.ledger.prepare(lease.token, "b", now=world.now)
    world.ledger.start_training(lease.token, "b", now=world.now)
    with pytest.raises(InvalidStateError):
        world.ledger.release(lease.token, partitions=lease.partitions, now=world.now)


def test_release_of_prepared_group_leaves_its_batch(world):
    world.put(2)
    lease = world.lease(2)
    world.ledger.prepare(lease.token, "b", now=world.now)
    world.ledger.release(lease.token, partitions=lease.partitions[:1], now=world.now)
    assert world.ledger.start_training(lease.token, "b", now=world.now) == lease.partitions[1:]


# ---------------------------------------------------------------- operator resolve


def _unknown(world):
    world.put(1)
    lease = world.lease(1)
    world.ledger.prepare(lease.token, "b", now=world.now)
    world.ledger.start_training(lease.token, "b", now=world.now)
    world.clock.advance(10.0)
    world.ledger.tick(world.now)
    return lease


def test_resolve_requeue_unknown_to_ready(world):
    lease = _unknown(world)
    world.ledger.resolve("j", lease.partitions, "requeue", now=world.now)
    again = world.lease(1)
    assert again.partitions == lease.partitions
    assert again.token > lease.token


def test_resolve_drop_unknown_to_gc(world):
    lease = _unknown(world)
    world.ledger.resolve("j", lease.partitions, "drop", now=world.now)
    world.ledger.resolve("j", lease.partitions, "drop", now=world.now)  # repeat is a no-op
    assert world.confirm_deletes() == 1
    assert world.ledger.usage("j") == (0, 0)


def test_resolve_refuses_groups_not_unknown_and_bad_action(world):
    (g,) = world.put(1)
    with pytest.raises(InvalidStateError):
        world.ledger.resolve("j", [g.partition], "requeue", now=world.now)
    with pytest.raises(InvalidRequestError):
        world.ledger.resolve("j", [g.partition], "replay", now=world.now)
    with pytest.raises(NotFoundError):
        world.ledger.resolve("j", [Partition("j", 1, 999)], "drop", now=world.now)


# ---------------------------------------------------------------- policy versions


def test_staleness_bound_skips_old_groups(world):
    world.put(2, policy_version=0)
    world.ledger.announce_policy("j", 3, now=world.now)
    world.put(1, policy_version=3)
    lease = world.lease(5, max_staleness=1)
    assert [g.policy_version for g in lease.groups] == [3]
    assert len(world.lease(5).groups) == 2  # no bound: the old ones too


def test_announce_must_not_go_back_and_publish_not_from_the_future(world):
    world.ledger.announce_policy("j", 2, now=world.now)
    with pytest.raises(InvalidRequestError):
        world.ledger.announce_policy("j", 1, now=world.now)
    with pytest.raises(InvalidRequestError):
        world.put(1, policy_version=5)


def test_strict_on_policy_holds_until_every_writer_acked(world_factory):
    w = world_factory(JobConfig(strict_on_policy=True))
    L = w.ledger
    L.register_writer("j", 1, "w1", node="n0", now=w.now)
    w.put(1, policy_version=0)
    status = L.announce_policy("j", 1, now=w.now)
    assert status.held
    assert status.pending == ("w0", "w1")
    with pytest.raises(InvalidStateError):  # an unacknowledged writer may not start the next round
        L.allocate("j", 1, "w0", nbytes=10, now=w.now)
    L.ack_policy("j", 1, "w0", 1, now=w.now)
    w.put(1, policy_version=1)
    assert L.acquire("j", "t", max_groups=5, now=w.now) is None  # held: w1 still pending
    assert not L.ack_policy("j", 1, "w1", 1, now=w.now).held
    lease = w.lease(5)
    assert [g.policy_version for g in lease.groups] == [1]  # only the current version
    with pytest.raises(InvalidRequestError):
        L.ack_policy("j", 1, "w1", 2, now=w.now)


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("settings", "setting"),
    [
        ({"capacity_groups": 0}, "capacity_groups"),
        ({"default_lease_ttl": "20m", "max_lease_ttl": "10m"}, "default_lease_ttl"),
        ({"strict_on_policy": True, "max_staleness": 2}, "max_staleness"),
        ({"capacity_bytes": "1MiB", "max_group_bytes": "2MiB"}, "capacity_bytes"),
        ({"grant_ttl": "-1s"}, "grant_ttl"),
        ({"grant_ttl": 0}, "grant_ttl"),
        ({"lease_ttl": "30s"}, "lease_ttl"),
        ({"max_groups_per_lease": 0}, "max_groups_per_lease"),
        ({"capacity_bytes": "lots"}, "capacity_bytes"),
        ({"delete_retry_initial": "1m", "delete_retry_max": "1s"}, "delete_retry_initial"),
    ],
)
def test_open_job_validates_config_naming_the_setting(settings, setting):
    ledger = Ledger()
    with pytest.raises(ConfigError) as err:
        ledger.open_job("j", 1, settings, now=0.0)
    assert err.value.setting == setting
    assert setting in str(err.value)


def test_config_from_human_values():
    cfg = JobConfig.from_mapping({"capacity_bytes": "8GiB", "grant_ttl": "250ms", "max_staleness": 2})
    assert cfg.capacity_bytes == 8 * 2**30
    assert cfg.grant_ttl == 0.25
    assert JobConfig.from_mapping(cfg.to_mapping()) == cfg


# ---------------------------------------------------------------- queries and clock


def test_queries_counts_lease_groups_gc_list(world):
    world.put(3)
    lease = world.lease(2)
    assert [g.partition for g in world.ledger.lease_groups(lease.token)] == list(lease.partitions)
    counts = world.ledger.counts("j")
    assert counts["READY"] == 1
    assert counts["LEASED"] == 2
    assert sum(counts[s.value] for s in GroupState) == 3
    assert world.ledger.gc_list() == ()
    assert world.ledger.live_leases("j") == (lease.token,)
    assert len(world.ledger.groups_in("j", "LEASED")) == 2


def test_time_never_goes_back(world):
    world.put(1)
    lease = world.lease(1)
    world.ledger.tick(world.now + 10.0)
    with pytest.raises(LeaseExpiredError):  # an older `now` does not revive the lease
        world.ledger.renew(lease.token, now=world.now)


def test_release_refuses_a_column_written_twice(world):
    world.put(1, columns=("response_ids", "advantage"))
    lease = world.lease(1)
    with pytest.raises(AlreadyExistsError, match="advantage"):
        world.ledger.release(lease.token, columns=("advantage",), now=world.now)
    assert world.ledger.counts("j")["LEASED"] == 1  # nothing released


def test_bad_choices_are_invalid_requests(world):
    with pytest.raises(InvalidRequestError, match="old_ready"):
        world.ledger.open_job("j", 2, None, now=world.now, old_ready="keep")
    with pytest.raises(InvalidRequestError, match="unknown group state"):
        world.ledger.groups_in("j", "DONE")


def test_malformed_partitions_and_column_sets_are_invalid_requests(world):
    world.put(1)
    lease = world.lease(1)
    with pytest.raises(InvalidRequestError, match="list of column names"):
        world.ledger.acquire("j", "t", max_groups=1, require="advantage", now=world.now)
    with pytest.raises(InvalidRequestError, match="partition"):
        world.ledger.prepare(lease.token, "b", partitions=[("j", 1)], now=world.now)
    with pytest.raises(InvalidRequestError, match="partition"):
        world.ledger.group(42)
    with pytest.raises(InvalidRequestError, match="column name"):
        world.ledger.release(lease.token, columns=[""], now=world.now)
