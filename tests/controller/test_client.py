"""The client: one interface for both hosts, a deadline on every call, and no Ray unless asked for."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from trajflight.controller import ControllerClient, Partition, Publication


class RecordingTransport:
    """Records the deadline every call carries."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def invoke(self, method, kwargs, timeout):
        self.calls.append((method, timeout))

    def acquire(self, kwargs, wait, timeout):
        self.calls.append(("acquire", timeout))
        assert wait <= timeout

    def checkpoint(self, job_id, path, timeout):
        self.calls.append(("checkpoint", timeout))
        return b""

    def restore(self, source, kwargs, timeout):
        self.calls.append(("restore", timeout))
        return {}


ARGS = {
    "server_id": "s",
    "node": "n",
    "location": "grpc://x",
    "capacity_bytes": 1,
    "capacity_groups": 1,
    "job_id": "j",
    "epoch": 1,
    "writer_id": "w",
    "version": 1,
    "nbytes": 1,
    "partition": Partition("j", 1, 0),
    "token": 1,
    "rows": 1,
    "tokens": 1,
    "policy_version": 0,
    "columns": (),
    "owner": "t",
    "max_groups": 1,
    "batch_id": "b",
    "partitions": [Partition("j", 1, 0)],
    "action": "drop",
    "source": b"",
    "checkpoint": 1,
    "config": None,
    "calls": [("counts", {"job_id": "j"})],
    "items": [Publication(Partition("j", 1, 0), 1, 1, 1, 1, 0, ())],
}

OPERATIONS = sorted(
    name for name, fn in inspect.getmembers(ControllerClient, inspect.isfunction) if not name.startswith("_")
)


@pytest.mark.parametrize("name", OPERATIONS)
def test_every_operation_carries_a_deadline(name):
    transport = RecordingTransport()
    client = ControllerClient(transport, timeout=7.0)
    method = getattr(client, name)
    params = inspect.signature(method).parameters
    kwargs = {p: ARGS[p] for p, spec in params.items() if spec.default is inspect.Parameter.empty}
    method(**kwargs)
    method(**kwargs, timeout=0.5)
    assert [t for _, t in transport.calls] == [7.0, 0.5]


def test_importing_the_controller_does_not_import_ray():
    code = "import sys, trajflight.controller; sys.exit('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
