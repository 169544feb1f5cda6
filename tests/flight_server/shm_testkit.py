"""Child-process targets of the shared-memory tests (importable by name, like ``flight_testkit``)."""

from __future__ import annotations

import time

from flight_testkit import make_group

from trajflight.codec import GroupKey
from trajflight.flight_server import StorageClient
from trajflight.flight_server._wire import PutDescriptor, ShmReserveRequest, encode


def killed_writer(location: str, key: GroupKey, ready: object) -> None:
    """Reserve a segment for ``key`` with a 1 s deadline, write half a group's worth of bytes, hang.

    The client is created here, after the process started (gRPC is not fork-safe).
    """
    client = StorageClient(location, timeout=20)
    put = PutDescriptor(key, "doomed", nbytes=1 << 20, num_rows=16)
    reply = client._action("shm_reserve", encode(ShmReserveRequest((put,), "doomed", 1.0)), None)
    path = reply["segments"][0]["path"]
    payload = make_group(key, k=16, response_len=4096, fixed=True).column("response_ids").values
    with open(path, "r+b") as f:
        f.write(memoryview(payload.buffers()[1])[: 1 << 19])
    ready.set()  # type: ignore[attr-defined]
    while True:
        time.sleep(1)
