"""Fixtures of the archive tests: embedded data planes with an archive, a real S3 API on loopback.

The rich groups (every kind of column, nested top-p included) are the analytics tests' own
(``tests/analytics/conftest.py``), so both folders check the same data.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

import trajflight
from tests.analytics.conftest import SCHEMA, encoded, group_columns

__all__ = ["SCHEMA", "commit_all", "encoded", "put_groups", "wait_for", "written"]

_JOBS = itertools.count()


@pytest.fixture
def job() -> str:
    """A fresh job id per test."""
    return f"archive-{next(_JOBS)}"


def put_groups(client: trajflight.Client, job: str, count: int, *, epoch: int = 1) -> list[Any]:
    """Open ``job`` and put ``count`` rich groups (policy versions 0..2); returns their GroupInfos."""
    client.open_job(job, epoch=epoch)
    client.controller.announce_policy(job, 2)
    writer = client.writer(job, epoch=epoch)
    return [writer.put(**group_columns(i, seed=epoch)) for i in range(count)]


def commit_all(client: trajflight.Client, job: str, count: int, *, owner: str = "trainer-a") -> None:
    """Lease, read and commit ``count`` groups of ``job`` (in as many leases as it takes)."""
    trainer = client.trainer(job, owner=owner)
    done = 0
    while done < count:
        with trainer.lease(count - done, wait=20.0) as batch:
            batch.fetch_table()
            done += len(batch.partitions)


def written(job: str, count: int, *, epoch: int = 1) -> pa.Table:
    """What was put: the encoded rows of groups ``0..count-1``, in group order."""
    return pa.Table.from_batches([encoded(job, epoch, g) for g in range(count)])


def wait_for(check: Callable[[], bool], timeout: float = 30.0, what: str = "the condition") -> None:
    """Poll ``check`` until it holds; the deadline only bounds a hang."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout:g}s")
        time.sleep(0.05)


@pytest.fixture(scope="package")
def s3() -> Iterator[tuple[pafs.S3FileSystem, str]]:
    """A real S3 API (moto's stand-alone server on loopback, port 0) and a fresh bucket on it."""
    server_mod = pytest.importorskip("moto.server", reason="needs moto[server] (the test extra)")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        fs = pafs.S3FileSystem(
            access_key="testing",
            secret_key="testing",
            region="us-east-1",
            scheme="http",
            endpoint_override=f"{host}:{port}",
            allow_bucket_creation=True,
        )
        fs.create_dir("trajflight-archive")
        yield fs, "trajflight-archive"
    finally:
        server.stop()
