"""``RayCluster(log_level=, log_json=)`` sets logging up in the Ray actors' own processes (their entry)."""

from __future__ import annotations

import glob
import os
import time

import pytest

from trajflight._ray_plane import RayCluster

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # about 5 s on the session's Ray runtime


def _lines_naming(ray, job: str) -> list[str]:
    """Lines of the Ray workers' stderr files (where actors' stderr goes) that name ``job`` in JSON."""
    logs = ray._private.worker._global_node.get_logs_dir_path()  # ray: no public accessor of the log dir
    out = []
    for path in glob.glob(os.path.join(logs, "worker-*.err")):
        with open(path, errors="replace") as f:
            out.extend(line.strip() for line in f if f'"job": "{job}"' in line)
    return out


def test_actors_log_json_lines_that_name_the_job(ray_runtime):
    job = f"ray-logs-{time.monotonic_ns()}"
    with RayCluster(servers=1, capacity="64MiB", log_level="INFO", log_json=True) as plane:
        plane.client().open_job(job, epoch=1)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            lines = _lines_naming(ray_runtime, job)
            loggers = {line.split('"logger": "')[1].split('"')[0] for line in lines}
            if {"trajflight.controller", "trajflight.flight_server"} <= loggers:
                break
            time.sleep(0.2)
    assert any('"message": "job opened at epoch 1"' in line for line in lines)  # the controller actor
    assert {"trajflight.controller", "trajflight.flight_server"} <= loggers  # and the storage server actor
