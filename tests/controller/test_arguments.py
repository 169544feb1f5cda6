"""Every number and name the ledger takes is range-checked before it touches state (issue 14 item 11).

``open_job(epoch=2**63)`` was accepted and fenced the storage servers at an epoch their int64 columns
cannot hold (every put then failed); floats passed for ints, bools for numbers, NaN for seconds, ints
beyond int64 for tokens and group ids got through or raised untyped errors, and a 10 MB name was echoed
into the error. Each row below is refused with InvalidRequestError naming the argument, the ledger is
unchanged afterwards, and no message repeats more than about 100 characters of the input.
"""

from __future__ import annotations

import re

import pytest

from trajflight.controller import JobConfig, Partition, Publication
from trajflight.controller._entries import check_int, check_seconds
from trajflight.errors import ConfigError, InvalidRequestError, brief

BIG = 2**63
HUGE = "x" * 10_000_000


def _observed(world):
    ledger = world.ledger
    return (
        ledger.counts("j"),
        ledger.usage("j"),
        ledger.servers(),
        ledger.live_leases(),
        ledger.fence_list(),
        ledger.last_token,
    )


def _cases(world):
    (grant,) = world.put(1)
    lease = world.lease(1)
    p = grant.partition
    ok_pub = Publication(p, grant.token, 8, 1000, 100, 0, ("a",))
    return [
        ("open_job", {"job_id": "k", "epoch": BIG}, "epoch"),
        ("open_job", {"job_id": "k", "epoch": -1}, "epoch"),
        ("open_job", {"job_id": "k", "epoch": 1.0}, "epoch"),
        ("open_job", {"job_id": "k", "epoch": True}, "epoch"),
        ("open_job", {"job_id": HUGE, "epoch": 1}, "job_id"),
        ("open_job", {"job_id": "", "epoch": 1}, "job_id"),
        ("open_job", {"job_id": "k", "epoch": 1, "config": {"capacity_bytes": BIG}}, "capacity_bytes"),
        ("open_job", {"job_id": "k", "epoch": 1, "config": {"grant_ttl": float("nan")}}, "grant_ttl"),
        ("open_job", {"job_id": "k", "epoch": 1, "config": {HUGE: 1}}, "unknown controller setting"),
        ("register_server", _server(capacity_bytes=BIG), "capacity_bytes"),
        ("register_server", _server(capacity_groups=-5), "capacity_groups"),
        ("register_server", _server(location=HUGE), "location"),
        ("register_writer", {"job_id": "j", "epoch": BIG, "writer_id": "w9", "node": "n0"}, "epoch"),
        ("register_writer", {"job_id": "j", "epoch": 1, "writer_id": 7, "node": "n0"}, "writer_id"),
        (
            "register_writer",
            {"job_id": "j", "epoch": 1, "writer_id": "w9", "node": "n0", "policy_version": 1.0},
            "policy_version",
        ),
        ("announce_policy", {"job_id": "j", "version": BIG}, "version"),
        ("announce_policy", {"job_id": "j", "version": 1.0}, "version"),
        ("ack_policy", {"job_id": "j", "epoch": 1, "writer_id": ["w0"], "version": 0}, "writer_id"),
        ("allocate", {"job_id": "j", "epoch": 1, "writer_id": "w0", "nbytes": BIG}, "nbytes"),
        ("allocate", {"job_id": "j", "epoch": 1, "writer_id": "w0", "nbytes": 10.0}, "nbytes"),
        ("allocate", {"job_id": 5, "epoch": 1, "writer_id": "w0", "nbytes": 10}, "job_id"),
        (
            "allocate_many",
            {"job_id": "j", "epoch": 1, "writer_id": "w0", "nbytes": [10, BIG]},
            r"nbytes\[1\]",
        ),
        ("publish", _publish(grant, rows=BIG), "rows"),
        ("publish", _publish(grant, token=BIG), "token"),
        ("publish", _publish(grant, token=float(grant.token)), "token"),
        ("publish", _publish(grant, partition=Partition("j", 1, BIG)), "group_id"),
        ("publish", _publish(grant, partition=("j", 1.0, p.group_id)), "epoch"),
        ("publish", _publish(grant, partition=(HUGE, 1, 0)), "job_id"),
        ("publish_many", {"items": [ok_pub, Publication(p, grant.token, 8, BIG, 1, 0, ())]}, "nbytes"),
        ("publish_many", {"items": [Publication(Partition("j", BIG, 0), 1, 1, 1, 1, 0, ())]}, "epoch"),
        ("acquire", {"job_id": "j", "owner": "t", "max_groups": BIG}, "max_groups"),
        ("acquire", {"job_id": "j", "owner": "t", "max_groups": 1, "ttl": float("inf")}, "ttl"),
        ("acquire", {"job_id": "j", "owner": "t", "max_groups": 1, "ttl": True}, "ttl"),
        ("acquire", {"job_id": "j", "owner": "t", "max_groups": 1, "max_tokens": BIG}, "max_tokens"),
        ("acquire", {"job_id": "j", "owner": HUGE, "max_groups": 1}, "owner"),
        ("acquire", {"job_id": "j", "owner": "t", "max_groups": 1, "require": [["a"]]}, "require"),
        ("renew", {"token": BIG}, "token"),
        ("renew", {"token": "1"}, "token"),
        ("renew", {"token": lease.token, "ttl": float("nan")}, "ttl"),
        ("prepare", {"token": lease.token, "batch_id": HUGE}, "batch_id"),
        ("prepare", {"token": lease.token, "batch_id": "b", "partitions": [("j", 1, -1)]}, "group_id"),
        ("start_training", {"token": lease.token, "batch_id": ["b"]}, "batch_id"),
        ("commit", {"token": float(lease.token), "batch_id": "b"}, "token"),
        ("release", {"token": lease.token, "partitions": "j/1/0"}, "partitions"),
        ("resolve", {"job_id": "j", "partitions": [p], "action": HUGE}, "action"),
        ("group", {"partition": ("j", 1, BIG)}, "group_id"),
        ("lease_groups", {"token": -1}, "token"),
        ("counts", {"job_id": HUGE}, "job_id"),
        ("groups_in", {"job_id": "j", "state": HUGE}, "group state"),
    ]


def _server(**kwargs):
    base = {"server_id": "s9", "node": "n", "location": "grpc://x", "capacity_bytes": 1, "capacity_groups": 1}
    return {**base, **kwargs}


def _publish(grant, **kwargs):
    base = {
        "partition": grant.partition,
        "token": grant.token,
        "rows": 8,
        "nbytes": 1000,
        "tokens": 100,
        "policy_version": 0,
        "columns": ("a",),
    }
    return {**base, **kwargs}


QUERIES = {"group", "lease_groups", "counts", "groups_in"}


def test_out_of_range_and_mistyped_arguments_are_refused_naming_them(world):
    cases = _cases(world)
    before = _observed(world)
    for method, kwargs, named in cases:
        call = getattr(world.ledger, method)
        try:
            call(**kwargs) if method in QUERIES else call(**kwargs, now=world.now)
        except InvalidRequestError as exc:
            message = str(exc)
        else:
            pytest.fail(f"{method} accepted a bad {named}")
        assert re.search(named, message), (method, named, message)
        assert len(message) < 1000, (method, named, len(message))  # never the 10 MB input
        assert _observed(world) == before, (method, named)
    assert len(cases) >= 45


def test_an_epoch_beyond_int64_never_fences_anything(world):
    """The bug: ``open_job(epoch=2**63)`` was accepted (and the client then fenced every server at it)."""
    with pytest.raises(InvalidRequestError, match="epoch"):
        world.ledger.open_job("j", BIG, now=world.now)
    assert world.ledger.open_job("j", 2**63 - 1, now=world.now).max_group_bytes > 0  # the largest is fine


def test_check_helpers():
    assert check_int(2**63 - 1, "x") == 2**63 - 1
    for bad in (2**63, -1, 1.0, True, "1", None):
        with pytest.raises(InvalidRequestError, match="x must be an int"):
            check_int(bad, "x")
    assert check_seconds(0, "w") == 0.0
    for bad in (float("nan"), float("inf"), -0.5, True, "1s", 10**400):
        with pytest.raises(InvalidRequestError, match="w "):
            check_seconds(bad, "w")
    assert len(brief(HUGE)) < 140
    assert len(brief([[[[[[HUGE]]]]]])) < 140
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    assert len(brief(nested)) < 140


def test_job_config_refuses_ints_beyond_int64():
    with pytest.raises(ConfigError, match="max_group_bytes"):
        JobConfig(max_group_bytes=BIG)
