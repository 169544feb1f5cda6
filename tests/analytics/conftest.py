"""Fixtures of the analytics tests: one embedded data plane for the whole folder, rich groups, archives.

Starting a data plane costs seconds on CI's two cores, so every test of ``tests/analytics`` shares one
(``plane``) and keeps to a job of its own (``job``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trajflight
from trajflight.codec import STANDARD_SCHEMA, encode_group

pytest.importorskip("duckdb", reason="needs duckdb (the test or analytics extra)")
pytest.importorskip("polars", reason="needs polars (the test or analytics extra)")

_JOBS = itertools.count()
SCHEMA = STANDARD_SCHEMA.extend(("ref_logprobs", pa.list_(pa.float32())))


@pytest.fixture(scope="package")
def plane() -> Iterator[trajflight.LocalCluster]:
    """Two storage servers and the controller on loopback, shared by the folder's tests."""
    with trajflight.LocalCluster(servers=2, capacity="256MiB", timeout=20.0) as cluster:
        yield cluster


@pytest.fixture(scope="package")
def client(plane: trajflight.LocalCluster) -> Iterator[trajflight.Client]:
    """One client of the shared plane."""
    with plane.client() as c:
        yield c


@pytest.fixture
def job() -> str:
    """A fresh job id per test."""
    return f"analytics-{next(_JOBS)}"


def group_columns(group: int, *, samples: int = 3, seed: int = 0) -> dict[str, Any]:
    """A group's columns with every kind of column: ragged, doubly ragged top-p, dictionary, struct,
    a user column; the first sample's response is empty (edge case of every derived column)."""
    rng = np.random.default_rng(seed * 1000 + group)
    lengths = [0, *rng.integers(1, 6, size=samples - 1).tolist()]
    ids = [rng.integers(0, 100, size=n).astype(np.int32).tolist() for n in lengths]
    logprobs = [(-rng.exponential(size=n)).astype(np.float32).tolist() for n in lengths]
    cands = [[int(rng.integers(1, 4)) for _ in range(n)] for n in lengths]
    top_ids = [[rng.integers(0, 100, size=c).astype(np.int32).tolist() for c in row] for row in cands]
    top_probs = [[rng.dirichlet(np.ones(c)).astype(np.float32).tolist() for c in row] for row in cands]
    return {
        "prompt_ids": rng.integers(0, 100, size=int(rng.integers(1, 5))).astype(np.int32),
        "response_ids": ids,
        "response_logprobs": logprobs,
        "loss_mask": [[1] * n for n in lengths],
        "reward": rng.random(samples).astype(np.float32).tolist(),
        "policy_version": group % 3,
        "top_p_ids": top_ids,
        "top_p_probs": top_probs,
        "finish_reason": ["stop" if i % 2 else "length" for i in range(samples)],
        "telemetry": [{"ttft_ms": float(i), "engine": "vllm"} for i in range(samples)],
        "extra": {"ref_logprobs": logprobs},
        "schema": SCHEMA,
    }


def put_rich(client: trajflight.Client, job: str, count: int, *, epoch: int = 1) -> list[Any]:
    """Open ``job`` and put ``count`` rich groups; returns their GroupInfos."""
    client.open_job(job, epoch=epoch)
    client.controller.announce_policy(job, 2)  # the groups carry versions 0..2
    writer = client.writer(job, epoch=epoch)
    return [writer.put(**group_columns(i, seed=epoch)) for i in range(count)]


def encoded(job: str, epoch: int, group: int) -> pa.RecordBatch:
    """What the archive holds for a group: its encoded record batch (rich columns, nested included)."""
    columns = group_columns(group, seed=epoch)
    columns.pop("schema")
    extra = columns.pop("extra")
    return encode_group(job_id=job, epoch=epoch, group_id=group, extra=extra, schema=SCHEMA, **columns)


def write_archive(
    root: Path, job: str, epochs: dict[int, int], *, keep_keys: bool = True, facts: bool = True
) -> pa.Table:
    """Write an archive of ``job`` as the archive writer lays it out: ``job_id=<job>/epoch=<n>/`` of
    zstd Parquet files, many groups per file, with lease facts columns; ``epochs`` maps an epoch to
    its group count. ``keep_keys`` False leaves ``job_id`` and ``epoch`` to the path. Returns every
    row written (keys included), in order."""
    written = []
    for epoch, count in epochs.items():
        table = pa.Table.from_batches([encoded(job, epoch, g) for g in range(count)])
        if facts:
            n = table.num_rows
            table = table.append_column("trained_by", pa.array(["trainer-0"] * n))
            table = table.append_column("staleness", pa.array(np.arange(n) % 2, pa.int64()))
        written.append(table)
        folder = root / f"job_id={job}" / f"epoch={epoch}"
        os.makedirs(folder, exist_ok=True)
        stored = table if keep_keys else table.drop_columns(["job_id", "epoch"])
        pq.write_table(stored, folder / "part-0.parquet", compression="zstd", row_group_size=4)
    return pa.concat_tables(written)
