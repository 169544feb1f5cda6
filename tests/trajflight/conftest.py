"""Fixtures of the end-to-end tests: one embedded data plane per module, child processes as scripts."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import trajflight
from trajflight.workload import make_workload

_JOBS = itertools.count()

# A child process that puts groups, given: address, job, epoch, first prompt number, count.
WRITER = textwrap.dedent(
    """
    import json, sys
    import trajflight
    from trajflight.workload import make_workload
    address, job = sys.argv[1], sys.argv[2]
    epoch, first, count = (int(a) for a in sys.argv[3:6])
    client = trajflight.connect(address, timeout=20)
    writer = client.writer(job, epoch, writer_id=f"child-{first}")
    out = []
    for g in make_workload(count, 4, seed=first, response_median=64, first_group_id=first):
        meta = writer.put(**g.columns(sample_ids=[f"p{g.group_id}/{i}" for i in range(4)]))
        out.append(list(meta.partition))
    print(json.dumps(out), flush=True)
    """
)


SECRET = "e2e:trajflight-e2e-secret-0123456789"
PLANES = ("plain", "secure")
"""The two planes every shared end-to-end fixture runs: as it is, and with tokens and mutual TLS on."""


@contextlib.contextmanager
def plane(
    mode: str,
    tmp: pytest.TempPathFactory,
    factory: Callable[..., Any] = trajflight.LocalCluster,
    **kwargs: Any,
) -> Iterator[Any]:
    """A started plane, ``factory(**kwargs)`` (a LocalCluster, or a RayCluster); ``"secure"``: with a
    deployment secret and mutual TLS on every endpoint, and this process's environment (so the child
    processes of the tests too) holding an admin credential and the client's TLS files
    (``TRAJFLIGHT_TOKEN``, ``TRAJFLIGHT_TLS_*``), restored after."""
    if mode == "plain":
        with factory(**kwargs) as c:
            yield c
        return
    from trajflight.devcerts import make_dev_certs

    certs = make_dev_certs(tmp.mktemp("certs"))
    with factory(**kwargs, secret=SECRET, tls=certs.server, client_tls=certs.client) as c:
        env = {
            "TRAJFLIGHT_TOKEN": c.mint("admin", sub="e2e").reveal(),
            "TRAJFLIGHT_TLS_CA": str(certs.directory / "ca.pem"),
            "TRAJFLIGHT_TLS_CERT": str(certs.directory / "client.pem"),
            "TRAJFLIGHT_TLS_KEY": str(certs.directory / "client.key"),
        }
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield c
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture(scope="module", params=PLANES)
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[trajflight.LocalCluster]:
    """Two storage server processes and an in-process controller, for the whole module; once plain and
    once secure (tokens and mutual TLS, see :func:`plane`)."""
    with plane(request.param, tmp_path_factory, servers=2, capacity="256MiB", timeout=20.0) as c:
        yield c


@pytest.fixture
def job() -> str:
    """A fresh job id per test (tests share the module's cluster)."""
    return f"job-{next(_JOBS)}"


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.02)


def put_groups(writer: trajflight.Writer, count: int, *, seed: int = 0, first: int = 0) -> list[Any]:
    """Put ``count`` small groups (4 samples); sample ids name their prompt ``p{n}/{i}``."""
    metas = []
    for g in make_workload(count, 4, seed=seed, response_median=64, first_group_id=first):
        metas.append(writer.put(**g.columns(sample_ids=[f"p{g.group_id}/{i}" for i in range(4)])))
    return metas


def run_child(code: str, *args: object, timeout: float = 60.0) -> Any:
    """Run a Python child process to completion and return the JSON it printed last."""
    result = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise AssertionError(f"child failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def start_child(code: str, *args: object) -> subprocess.Popen[str]:
    """Start a Python child process with piped stdout (for tests that kill it)."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_up(
    *args: str, scheme: str = "grpc", env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """Start ``trajflight up ARGS`` (in ``env``, default this process's) and return it with the address it
    printed (``scheme://127.0.0.1:P``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trajflight", "up", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    address = proc.stdout.readline().strip() if proc.stdout else ""
    assert address.startswith(f"{scheme}://127.0.0.1:"), proc.stderr.read() if proc.stderr else ""
    return proc, address


def stop_up(proc: subprocess.Popen[str]) -> str:
    """SIGTERM ``proc``, check it exits 0, and return its stderr."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    err = proc.stderr.read() if proc.stderr else ""
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()
    return err
