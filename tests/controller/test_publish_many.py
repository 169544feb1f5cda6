"""Ledger.publish_many: repeated publish in one operation, all or nothing, with a fake clock."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trajflight.controller import GroupState, JobConfig, Ledger, Partition, Publication, PutGrant
from trajflight.errors import (
    AlreadyExistsError,
    InvalidRequestError,
    LeaseExpiredError,
    NotFoundError,
    StaleFenceError,
    TrajflightError,
)

CONFIG = JobConfig(default_lease_ttl=10.0, max_lease_ttl=100.0, grant_ttl=5.0, max_group_bytes=1 << 20)


def _item(grant: PutGrant, **changes: object) -> Publication:
    """The publication of a stored group under ``grant``: 8 rows, 600 bytes, 77 tokens, columns b, a."""
    item = Publication(grant.partition, grant.token, 8, 600, 77, 0, ("b", "a"))
    return dataclasses.replace(item, **changes)


def _publish_one(ledger: Ledger, item: Publication, now: float):
    return ledger.publish(
        item.partition, token=item.token, rows=item.rows, nbytes=item.nbytes, tokens=item.tokens,
        policy_version=item.policy_version, columns=item.columns, now=now,
    )  # fmt: skip


def _unchanged(world):
    """What a refused call must leave as it was: usage, every group, READY order, reservations."""
    L = world.ledger
    return L.usage("j"), L.counts("j"), L.snapshot(), L.ready_version


# ---------------------------------------------------------------- the same as repeated publish


def _twin_world() -> tuple[Ledger, list[PutGrant]]:
    """A ledger at t=1006 (grant_ttl 5 s) with targets for every outcome of publish.

    Grants 0-5 are ALLOCATED (1000 bytes reserved each), 6-7 already published (600 bytes, 8 rows,
    77 tokens), and grant 8 was made at t=1000, so it expires (lazily) when the batch arrives.
    """
    L = Ledger()
    L.register_server("s0", node="n0", location="grpc://s0", capacity_bytes=10**9, capacity_groups=100,
                      now=1000.0)  # fmt: skip
    L.open_job("j", 1, CONFIG, now=1000.0)
    L.register_writer("j", 1, "w0", node="n0", now=1000.0)
    expiring = L.allocate("j", 1, "w0", nbytes=1000, now=1000.0)
    grants = L.allocate_many("j", 1, "w0", nbytes=[1000] * 8, now=1004.0)
    for grant in grants[6:]:
        _publish_one(L, _item(grant), 1004.0)
    return L, [*grants, expiring]


_GOOD = {
    "as stored": {},
    "smaller": {"nbytes": 1, "rows": 1, "tokens": 0},
    "whole reservation": {"nbytes": 1000},
    "other columns": {"columns": ("c",)},
    "columns as a list": {"columns": ["a", "b"]},
}
_BAD = {
    "wrong token": {"token": 1},
    "over the reservation": {"nbytes": 1001},
    "negative rows": {"rows": -1},
    "unannounced policy": {"policy_version": 3},
    "bad column name": {"columns": ("a", "")},
    "unknown partition": {"partition": Partition("j", 1, 999)},
    "unopened epoch": {"partition": Partition("j", 2, 0)},
    "unknown job": {"partition": Partition("nope", 1, 0)},
}
# Mostly acceptable items, so that whole batches succeed often; grant 8 is the one that expires.
_variants = st.sampled_from(sorted(_GOOD) * 8 + sorted(_BAD))
_targets = st.sampled_from(list(range(8)) * 4 + [8])


@settings(max_examples=300, deadline=None)
@given(picks=st.lists(st.tuples(_targets, _variants), min_size=1, max_size=8))
def test_publish_many_is_repeated_publish_or_changes_nothing(picks):
    """Whatever the items, publish_many answers what publish answers item by item, and leaves the same
    ledger; where publish refuses an item, publish_many raises that error and leaves the ledger as the
    lazy expiries alone would (all or nothing)."""
    many, grants = _twin_world()
    one_by_one, _ = _twin_world()
    untouched, _ = _twin_world()
    items = [_item(grants[i], **{**_GOOD, **_BAD}[v]) for i, v in picks]
    expected, refusal = [], None
    for item in items:
        try:
            expected.append(_publish_one(one_by_one, item, 1006.0))
        except TrajflightError as exc:
            refusal = exc
            break
    got: list | TrajflightError
    try:
        got = many.publish_many(items, now=1006.0)
    except TrajflightError as exc:
        got = exc
    if refusal is not None:
        assert isinstance(got, TrajflightError), f"accepted where publish refused {refusal!r}"
        assert (type(got), got.message) == (type(refusal), refusal.message)
        untouched.tick(1006.0)
        assert many.snapshot() == untouched.snapshot()
        assert many.ready_version == untouched.ready_version
        return
    assert got == expected
    assert many.snapshot() == one_by_one.snapshot()  # reservations, states and READY order
    assert many.ready_version == one_by_one.ready_version


# ---------------------------------------------------------------- what it does


def test_publish_many_makes_groups_ready_in_order_and_gives_back_unused_reservations(world):
    L = world.ledger
    grants = L.allocate_many("j", 1, "w0", nbytes=[1000, 1000, 1000], now=world.now)
    items = [_item(g, nbytes=n) for g, n in zip(grants, (600, 700, 800), strict=True)]
    infos = L.publish_many(items, now=world.now)
    assert [i.partition for i in infos] == [g.partition for g in grants]
    assert all(i.state is GroupState.READY and i.columns == ("a", "b") for i in infos)
    assert [i.nbytes for i in infos] == [600, 700, 800]
    assert L.usage("j") == (2100, 3)
    assert L.servers()[0].used_bytes == 2100
    assert world.lease(3).partitions == tuple(g.partition for g in grants)  # READY in the order given


def test_publish_many_spans_jobs(world):
    L = world.ledger
    L.open_job("k", 4, CONFIG, now=world.now)
    L.register_writer("k", 4, "w0", node="n0", now=world.now)
    a = L.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    b = L.allocate("k", 4, "w0", nbytes=1000, now=world.now)
    infos = L.publish_many([_item(a), _item(b)], now=world.now)
    assert [i.partition for i in infos] == [a.partition, b.partition]
    assert L.usage("j") == L.usage("k") == (600, 1)


def test_publish_many_repeated_is_idempotent_and_mixes_with_new_groups(world):
    L = world.ledger
    first, second = L.allocate_many("j", 1, "w0", nbytes=[1000, 1000], now=world.now)
    once = L.publish_many([_item(first)], now=world.now)
    both = L.publish_many([_item(first), _item(second)], now=world.now)
    assert both[0] == once[0]
    assert L.publish_many([_item(first), _item(second)], now=world.now) == both  # a retry is answered
    assert L.usage("j") == (1200, 2)
    same = L.publish_many([_item(first, columns=("other",))], now=world.now)  # columns are not compared,
    assert same == once  # as for publish


def test_publish_many_accepts_one_group_twice_with_the_same_values(world):
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    a, b = world.ledger.publish_many([_item(grant), _item(grant)], now=world.now)
    assert a == b
    assert world.ledger.counts("j")["READY"] == 1
    assert world.ledger.usage("j") == (600, 1)


# ---------------------------------------------------------------- refusals: raise and publish none


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (lambda w, g: _item(g, partition=Partition("j", 1, 999)), NotFoundError, "never allocated"),
        (lambda w, g: _item(g, partition=Partition("j", 2, 0)), NotFoundError, "call open_job"),
        (lambda w, g: _item(g, token=g.token + 100), StaleFenceError, "not the put grant"),
        (lambda w, g: _item(g, nbytes=1001), InvalidRequestError, "exceeds the 1000 bytes reserved"),
        (lambda w, g: _item(g, rows=-1), InvalidRequestError, "rows must be an int >= 0"),
        (lambda w, g: _item(g, policy_version=2), InvalidRequestError, "never announced"),
        (lambda w, g: _item(g, columns=("a", "")), InvalidRequestError, "column name"),
        (lambda w, g: _item(w.put(1)[0], rows=9), AlreadyExistsError, "already published"),
        (lambda w, g: _item(w.grants[0], rows=9), AlreadyExistsError, "already published"),
        (lambda w, g: {"partition": g.partition}, InvalidRequestError, r"items\[1\] must be a Publication"),
    ],
    ids=[
        "unknown partition",
        "unopened epoch",
        "wrong token",
        "nbytes over the reservation",
        "negative rows",
        "unannounced policy",
        "bad column name",
        "published with other values",
        "same group twice with other values",
        "not a Publication",
    ],
)
def test_a_refused_item_publishes_none_of_the_batch(world, bad, error, match):
    """The good item comes first: repeated publish would have published it before the refusal."""
    L = world.ledger
    good, other = L.allocate_many("j", 1, "w0", nbytes=[1000, 1000], now=world.now)
    world.grants.append(good)
    last = bad(world, other)
    before = _unchanged(world)
    with pytest.raises(error, match=match):
        L.publish_many([_item(good), last], now=world.now)
    assert _unchanged(world) == before
    assert world.state(good) == "ALLOCATED"
    assert L.publish_many([_item(good)], now=world.now)[0].state is GroupState.READY  # nothing stuck


@pytest.mark.parametrize("field", ["rows", "nbytes", "tokens", "policy_version"])
def test_a_bad_count_names_the_group_whose_publication_holds_it(world, field):
    """Among a batch's many publications, the error says which one holds the bad count."""
    L = world.ledger
    good, other = L.allocate_many("j", 1, "w0", nbytes=[1000, 1000], now=world.now)
    with pytest.raises(InvalidRequestError) as refused:
        L.publish_many([_item(good), _item(other, **{field: -1})], now=world.now)
    message = str(refused.value)
    assert message.startswith(f"{field} must be an int >= 0, got -1")
    assert f"the publication of {tuple(other.partition)}" in message


def test_an_expired_grant_is_refused_and_the_others_stay_unpublished(world):
    L = world.ledger
    expiring = L.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    world.clock.advance(CONFIG.grant_ttl - 1)
    fresh = L.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    world.clock.advance(1)  # the first grant expires lazily, in the call itself
    with pytest.raises(LeaseExpiredError, match="expired before publish"):
        L.publish_many([_item(fresh), _item(expiring)], now=world.now)
    assert (world.state(fresh), world.state(expiring)) == ("ALLOCATED", "DROPPED")
    assert L.usage("j") == (2000, 2)  # the dropped grant's bytes come back with its confirmed delete


def test_a_fenced_epoch_is_refused_as_stale(world):
    L = world.ledger
    grant = L.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    L.open_job("j", 2, CONFIG, now=world.now)
    with pytest.raises(StaleFenceError, match="fenced by epoch 2"):
        L.publish_many([_item(grant)], now=world.now)


@pytest.mark.parametrize(
    ("items", "match"),
    [
        ([], "items is empty"),
        ("abc", "must be a list of Publication records"),
        (None, "must be a list of Publication records"),
    ],
)
def test_bad_item_lists_are_refused(world, items, match):
    before = _unchanged(world)
    with pytest.raises(InvalidRequestError, match=match):
        world.ledger.publish_many(items, now=world.now)
    assert _unchanged(world) == before


def test_a_publication_alone_is_not_a_list(world):
    grant = world.ledger.allocate("j", 1, "w0", nbytes=1000, now=world.now)
    with pytest.raises(InvalidRequestError, match="call publish for a single group"):
        world.ledger.publish_many(_item(grant), now=world.now)  # type: ignore[arg-type]


def test_a_refused_column_tuple_is_refused_again_in_a_later_item_and_call(world):
    """Column tuples are checked once per call and remembered; a refusal must not be remembered as a pass."""
    L = world.ledger
    a, b = L.allocate_many("j", 1, "w0", nbytes=[1000, 1000], now=world.now)
    bad = ("a", "")
    for _ in range(2):
        with pytest.raises(InvalidRequestError, match="column name"):
            L.publish_many([_item(a, columns=("a",)), _item(b, columns=bad)], now=world.now)
    infos = L.publish_many([_item(a, columns=("a",)), _item(b, columns=("a",))], now=world.now)
    assert [i.columns for i in infos] == [("a",), ("a",)]


def test_strict_on_policy_jobs_publish_announced_versions(world_factory):
    w = world_factory(JobConfig(strict_on_policy=True))
    L = w.ledger
    grant = L.allocate("j", 1, "w0", nbytes=1000, now=w.now)
    L.announce_policy("j", 1, now=w.now)  # announced after the grant: the group may carry it
    (info,) = L.publish_many([_item(grant, policy_version=1)], now=w.now)
    assert info.policy_version == 1
