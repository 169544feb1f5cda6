"""The ledger's log lines name the job, the partition and the lease token (``extra=`` of trajflight.logs)."""

from __future__ import annotations

import logging


def test_an_expired_lease_and_each_group_it_left_unknown_are_logged_with_job_partition_and_token(
    world, caplog
):
    first, _ = world.put(2)
    lease = world.lease(2)
    world.ledger.prepare(lease.token, "b", partitions=[first.partition], now=world.now)
    world.ledger.start_training(lease.token, "b", now=world.now)
    with caplog.at_level(logging.INFO, logger="trajflight.controller"):
        world.ledger.tick(world.clock.advance(100))  # past the TTL: one group to READY, one to UNKNOWN
    unknown = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [(r.job, r.partition, r.token) for r in unknown] == [
        ("j", f"j/1/{first.partition.group_id}", lease.token)
    ]
    assert "became UNKNOWN" in unknown[0].getMessage()
    (ended,) = [r for r in caplog.records if r.levelno == logging.INFO]
    assert (ended.job, ended.token) == ("j", lease.token)
    assert "ended (expired): 1 groups back to READY, 1 UNKNOWN" in ended.getMessage()


def test_a_job_opened_and_moved_to_a_new_epoch_is_logged_with_its_job_and_epoch(world, caplog):
    with caplog.at_level(logging.INFO, logger="trajflight.controller"):
        world.ledger.open_job("j", 2, now=world.now)
        world.ledger.open_job("other", 5, now=world.now)
    assert [(r.job, r.epoch) for r in caplog.records] == [("j", 2), ("other", 5)]
    assert "epoch 1 and older are fenced" in caplog.records[0].getMessage()
