"""Test helpers for the storage server: seeded groups built with pyarrow, servers as context managers.

Importable by name (``tests/flight_server`` is put on ``sys.path`` by this folder's conftest) so that
``spawn`` child processes can import their targets from here too.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from trajflight.flight_server import StorageClient, StorageServer, StoreLimits
from trajflight.keys import Partition


def _ragged(rng: np.random.Generator, lengths: np.ndarray, dtype: str) -> pa.ListArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if dtype == "int32":
        values = pa.array(rng.integers(0, 50_000, total, dtype=np.int32))
    elif dtype == "float32":
        values = pa.array(-rng.random(total, dtype=np.float32))
    else:
        values = pa.array(rng.integers(0, 2, total, dtype=np.uint8))
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def make_group(
    key: Partition, k: int = 8, *, seed: int = 0, response_len: int = 64, fixed: bool = False
) -> pa.RecordBatch:
    """One valid trajectory group of ``k`` samples for ``key`` (standard columns, seeded).

    Response lengths are uniform in ``1..response_len``, or all ``response_len`` when ``fixed``.
    """
    rng = np.random.default_rng([seed, key.group_id, key.epoch])
    prompt = 16 if fixed else int(rng.integers(8, 32))
    lengths = np.full(k, response_len) if fixed else rng.integers(1, response_len + 1, k)
    reward = rng.integers(0, 2, k).astype(np.float32)
    return pa.record_batch(
        {
            "job_id": pa.array([key.job_id] * k, pa.string()),
            "epoch": pa.array([key.epoch] * k, pa.int64()),
            "group_id": pa.array([key.group_id] * k, pa.int64()),
            "sample_index": pa.array(np.arange(k, dtype=np.int32)),
            "sample_id": pa.array([f"{key.job_id}-{key.epoch}-{key.group_id}-{i}" for i in range(k)]),
            "policy_version": pa.array(np.full(k, 3, dtype=np.int64)),
            "prompt_ids": _ragged(rng, np.full(k, prompt), "int32"),
            "response_ids": _ragged(rng, lengths, "int32"),
            "response_logprobs": _ragged(rng, lengths, "float32"),
            "loss_mask": _ragged(rng, lengths, "uint8"),
            "reward": pa.array(reward),
            "advantage": pa.array(reward - reward.mean(), pa.float32()),
        }
    )


@contextlib.contextmanager
def serving(
    limits: StoreLimits | None = None, **kwargs: object
) -> Iterator[tuple[StorageServer, StorageClient]]:
    """A storage server on loopback port 0 and a client to it (with ``credential``, when given); both
    always closed."""
    credential = kwargs.pop("credential", None)
    with (
        StorageServer(limits=limits, **kwargs) as server,  # type: ignore[arg-type]
        StorageClient(server.location, timeout=20, credential=credential) as client,  # type: ignore[arg-type]
    ):
        yield server, client


@contextlib.contextmanager
def server_process(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``python -m trajflight server`` on loopback port 0; killed if a test leaves it running."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trajflight", "server", "--host", "127.0.0.1", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        location = proc.stdout.readline().strip()  # type: ignore[union-attr]
        assert location.startswith("grpc://127.0.0.1:"), (location, proc.stderr.read() if proc.poll() else "")  # type: ignore[union-attr]
        yield proc, location
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


def slow_writer(location: str, key: Partition, rows_first: int, ready: object) -> None:
    """Child process target: starts a put, sends part of the group, then hangs until killed.

    The client is created here, after the process started (gRPC is not fork-safe).
    """
    import pyarrow.flight as flight

    from trajflight.flight_server._wire import PutDescriptor, encode

    group = make_group(key, k=16, response_len=256)
    client = flight.FlightClient(location)
    descriptor = flight.FlightDescriptor.for_command(encode(PutDescriptor(key, "doomed", num_rows=16)))
    writer, _ = client.do_put(descriptor, group.schema)
    writer.write_batch(group.slice(0, rows_first))
    ready.set()  # type: ignore[attr-defined]
    while True:
        time.sleep(1)
        os.getpid()


def dying_writer(
    location: str, key: Partition, descriptor: tuple[str, object], rows: int, ready: object
) -> None:
    """Child process target: a raw Flight put that sends ``rows`` of an 8-row group one row per batch
    (until the server refuses it), without ``done_writing()``, then hangs until killed (a writer that
    dies mid-stream).

    ``descriptor`` is ``("command", bytes)`` or ``("path", [parts])``. The client is created here, after
    the process started (gRPC is not fork-safe).
    """
    import pyarrow.flight as flight

    group = make_group(key, k=8)
    kind, value = descriptor
    if kind == "command":
        target = flight.FlightDescriptor.for_command(value)
    else:
        target = flight.FlightDescriptor.for_path(*value)  # type: ignore[misc]
    client = flight.FlightClient(location)
    writer, _ = client.do_put(target, group.schema)
    try:
        for i in range(rows):
            writer.write_batch(group.slice(i, 1))
    except flight.FlightError:
        pass  # the server refused the put already: nothing to send, die all the same
    ready.set()  # type: ignore[attr-defined]
    while True:
        time.sleep(1)
        os.getpid()
