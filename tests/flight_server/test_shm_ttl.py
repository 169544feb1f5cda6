"""A same-host reservation lives at most the server's own ``--shm-ttl``, whatever its writer asked for.

Regression for issue 14, item 10: a killed writer's shared-memory reservation came back only at the
writer's put deadline (15-60 s: the trajflight client asks for ``ttl = its timeout``), not at the
server's ``--shm-ttl``, because the server took the ``ttl`` of the request as it was.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time

import pytest
from flight_testkit import make_group
from shm_testkit import killed_writer, shm_serving

from trajflight.errors import InvalidRequestError
from trajflight.flight_server import StorageServer
from trajflight.keys import Partition

KEY = Partition("job-a", 1, 5)
SHM_TTL = 0.5
ASKED = 600.0  # a writer with a long put deadline asks for as long


def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


def test_a_killed_writer_s_reservation_is_swept_at_the_server_s_ttl_not_its_own():
    """Regression: the reservation lived for the ``ttl`` the (dead) writer asked for."""
    ctx = multiprocessing.get_context("spawn")  # gRPC is not fork-safe
    with shm_serving(shm_ttl=SHM_TTL) as (server, client):
        ready = ctx.Event()
        child = ctx.Process(target=killed_writer, args=(server.location, KEY, ready, ASKED), daemon=True)
        child.start()
        try:
            assert ready.wait(60), "the writer never reserved its segment"
            (put,) = server.store.shm._reserved.values()
            assert put.deadline - time.monotonic() <= SHM_TTL
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.join(10)
        _wait_for(lambda: client.stats()["pending_shm_puts"] == 0)  # bounds a hang only
        stats = client.stats()
        assert (stats["reserved_bytes"], stats["pending_puts"], stats["shm"]["live_segments"]) == (0, 0, 0)
        client.shm_put_groups([(KEY, make_group(KEY))])  # the partition is free again
        assert client.get([KEY]).num_rows == 8


def test_a_batch_reservation_is_bounded_by_the_server_s_ttl_too():
    with shm_serving(shm_ttl=SHM_TTL) as (server, client):
        body = {
            "v": 1,
            "ttl": ASKED,
            "batch_bytes": 1 << 16,
            "batch": {"job_id": "j", "epoch": 0, "group_ids": [1, 2], "rows": [4, 4]},
        }
        client._action("shm_reserve", json.dumps(body).encode(), None)
        (batch,) = server.store.shm._reserved.values()
        assert batch.deadline - time.monotonic() <= SHM_TTL
        _wait_for(lambda: client.stats()["pending_shm_puts"] == 0)
        assert client.stats()["reserved_bytes"] == 0


def test_a_writer_may_ask_for_less_than_the_server_s_ttl():
    with shm_serving(shm_ttl=60.0) as (server, client):
        group = {"job_id": "j", "epoch": 0, "group_id": 1, "num_rows": 8}
        body = {"v": 1, "ttl": 0.25, "batch_bytes": 4096, "groups": [group]}
        client._action("shm_reserve", json.dumps(body).encode(), None)
        (put,) = server.store.shm._reserved.values()
        assert put.deadline - time.monotonic() <= 0.25
        _wait_for(lambda: client.stats()["pending_shm_puts"] == 0)


@pytest.mark.parametrize("ttl", [0, -1.0, True, "30s"])
def test_the_server_s_ttl_must_be_a_positive_number(ttl):
    with pytest.raises(InvalidRequestError, match="shm_ttl"):
        StorageServer(shm_ttl=ttl)
