"""Shared-memory test helpers: child-process targets (importable by name, like ``flight_testkit``) and a
server with an arena."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from flight_testkit import make_group

from trajflight.flight_server import ShmArena, StorageClient, StorageServer, StoreLimits
from trajflight.flight_server._wire import PutDescriptor, ShmReserveRequest, encode
from trajflight.keys import Partition


def killed_writer(location: str, key: Partition, ready: object, ttl: float = 1.0) -> None:
    """Reserve a segment for ``key`` asking for a ``ttl`` s deadline, write half a group's worth of
    bytes, hang.

    The client is created here, after the process started (gRPC is not fork-safe).
    """
    client = StorageClient(location, timeout=20)
    put = PutDescriptor(key, "doomed", num_rows=16)
    reply = client._action("shm_reserve", encode(ShmReserveRequest((put,), "doomed", ttl, 1 << 20)), None)
    path = reply["segments"][0]["path"]
    payload = make_group(key, k=16, response_len=4096, fixed=True).column("response_ids").values
    with open(path, "r+b") as f:
        f.write(memoryview(payload.buffers()[1])[: 1 << 19])
    ready.set()  # type: ignore[attr-defined]
    while True:
        time.sleep(1)


@contextlib.contextmanager
def shm_serving(
    limits: StoreLimits | None = None, **kwargs: object
) -> Iterator[tuple[StorageServer, StorageClient]]:
    """A storage server with a fresh shared-memory arena (and its fence board) and a client to it."""
    with (
        StorageServer(limits=limits, arena=ShmArena(), **kwargs) as server,  # type: ignore[arg-type]
        StorageClient(server.location, timeout=20) as client,
    ):
        yield server, client
