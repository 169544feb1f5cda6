"""The fault suite's harness: a data plane of real processes that a scenario can kill, stop and restart.

:class:`Plane` runs N ``trajflight server`` processes (shared-memory arenas under a private directory in
``/dev/shm``) and the controller in a process of its own (``proc_controller.py``: ``LocalController``
behind ``ControlServer``, journaling to a state directory), all on 127.0.0.1 with ports picked by the
kernel. Each can be killed (SIGKILL), stopped and continued (SIGSTOP/SIGCONT: a hung process, or one cut
off by a network partition: its sockets accept but nothing answers) and started again on the same port
and directory. :class:`Proc` is one child process with its log and its JSON-lines event file.

Every child dies with the test process (``PR_SET_PDEATHSIG``), every wait is bounded (a bound that runs
out raises :class:`Hang`: a hang is a finding, never a wait forever), and :meth:`Plane.close` kills every
process it started, stopped or not, even when the scenario failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

import trajflight
from trajflight.flight_server import StorageClient, host_id

HERE = Path(__file__).resolve().parent
PY = sys.executable

# Short times so faults play out quickly; every wait on them is a poll with a generous deadline.
FAST = {
    "default_lease_ttl": "2s",
    "grant_ttl": "2s",
    "capacity_retry_after": "200ms",
    "delete_retry_initial": "100ms",
    "delete_retry_max": "1s",
    "delete_timeout": "5s",
}

# Exec the command after asking the kernel to SIGKILL it when the test dies (works for stopped processes
# too). The process that forks must outlive the child: start children from the test's main thread.
_DEATHSIG_EXEC = "import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 9); os.execv(sys.argv[1], sys.argv[1:])"


class Hang(AssertionError):
    """A bounded wait ran out: something that must happen did not (a hang, as the suite counts it)."""


def wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Poll ``check`` until it returns something truthy, for at most ``timeout`` seconds.

    Raises:
        Hang: it never did; the message says what was awaited and what ``check`` last returned.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except Exception as exc:  # a transient error while a process restarts: keep polling
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise Hang(f"{what}: not within {timeout:g}s (last seen: {last!r})"[:2000])
        time.sleep(interval)


class Proc:
    """One child process: its ``Popen``, stderr log, event file, and the faults done to it.

    Args:
        name: Short name for messages.
        cmd: The command (run through the die-with-parent wrapper).
        log: Where stdout (unless piped) and stderr go.
        events: The child's JSON-lines event file, if it has one.
        pipe_stdout: Keep stdout on a pipe (servers and the controller print their address first).
    """

    def __init__(
        self, name: str, cmd: list[str], *, log: Path, events: Path | None = None, pipe_stdout: bool = False
    ) -> None:
        self.name = name
        self.log_path = log
        self.events_path = events
        self._log = open(log, "ab")  # noqa: SIM115 - closed in close()
        self.popen: subprocess.Popen[bytes] = subprocess.Popen(
            [PY, "-c", _DEATHSIG_EXEC, *cmd],
            stdout=subprocess.PIPE if pipe_stdout else self._log,
            stderr=self._log,
            cwd=str(HERE),
        )
        self.killed = False  # by the test: its death is no crash
        self.stopped = False
        self.checkpointing = False  # a trainer holding TRAINED batches until its next checkpoint

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def first_line(self, timeout: float = 60.0) -> str:
        """The first stdout line (an address), or :class:`Hang` with the log's tail."""
        found: list[bytes] = []
        stdout = self.popen.stdout
        reader = threading.Thread(target=lambda: found.append(stdout.readline() if stdout else b""))
        reader.daemon = True
        reader.start()
        reader.join(timeout)
        line = found[0].decode().strip() if found else ""
        if not line.startswith("grpc://"):
            self.kill()
            raise Hang(f"{self.name} did not print its address within {timeout:g}s:\n{self.log_tail()}")
        return line

    def kill(self) -> None:
        """SIGKILL (stopped or not) and reap."""
        self.killed = True
        if self.alive():
            with _no_such_process():
                os.kill(self.pid, signal.SIGKILL)
        self.popen.wait(10)
        self.stopped = False

    def stop(self) -> None:
        """SIGSTOP: the process hangs, its sockets still accept (a partition, as peers see it)."""
        os.kill(self.pid, signal.SIGSTOP)
        self.stopped = True

    def cont(self) -> None:
        """SIGCONT."""
        with _no_such_process():
            os.kill(self.pid, signal.SIGCONT)
        self.stopped = False

    def signal_term(self) -> None:
        """SIGCONT (a stopped process cannot act on it) and SIGTERM, without waiting."""
        if self.alive():
            self.cont()
            with _no_such_process():
                os.kill(self.pid, signal.SIGTERM)

    def terminate(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not exit in time (then returns None)."""
        if self.alive():
            self.cont()
            with _no_such_process():
                os.kill(self.pid, signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def wait(self, timeout: float) -> int:
        """The exit status, or :class:`Hang` if it is still running after ``timeout``."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise Hang(f"{self.name} still running after {timeout:g}s:\n{self.log_tail()}") from None

    def close(self) -> None:
        """Kill it if alive and close its files (idempotent)."""
        if self.alive():
            self.kill()
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        self._log.close()

    def events(self) -> list[dict[str, Any]]:
        """Every event the child logged so far (a torn last line, from a kill mid-write, is skipped)."""
        if self.events_path is None or not self.events_path.exists():
            return []
        out = []
        for line in self.events_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def wait_event(self, ev: str, timeout: float = 30.0, **match: Any) -> dict[str, Any]:
        """The first event ``ev`` whose fields include ``match``, waiting up to ``timeout`` seconds.

        Raises:
            Hang: it did not come (the child's log tail says why, if it died).
        """

        def find() -> dict[str, Any] | None:
            for e in self.events():
                if e["ev"] == ev and all(e.get(k) == v for k, v in match.items()):
                    return e
            if not self.alive():
                raise Hang(f"{self.name} exited ({self.popen.returncode}) before {ev} {match}")
            return None

        deadline = time.monotonic() + timeout
        while True:
            try:
                found = find()
            except Hang as exc:
                raise Hang(f"{exc}:\n{self.log_tail()}") from None
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise Hang(f"{self.name}: no {ev} {match} within {timeout:g}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, chars: int = 2500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def held_by(stats: dict[str, Any]) -> dict[str, Any]:
    """What a storage server's ``stats`` say it still holds: groups, bytes, reservations, pending puts and
    appends, live shared-memory segments (empty when it holds nothing). Draining segments (freed, waiting
    for a reader's lock to go before reuse) are the server's pool, not the run's data."""
    keys = ("groups", "bytes", "reserved_bytes", "pending_puts", "pending_appends", "pending_shm_puts")
    out = {k: stats.get(k) for k in keys if stats.get(k)}
    shm = stats.get("shm") or {}
    if shm.get("live_segments"):
        out["shm.live_segments"] = shm["live_segments"]
    return out


def _no_such_process() -> contextlib.suppress:
    return contextlib.suppress(ProcessLookupError)  # it exited meanwhile


class Children:
    """Child processes of one scenario (writers, trainers, raw clients, drivers), killed at close."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[Proc] = []

    def spawn(self, name: str, script: str, *args: str) -> Proc:
        """Start a child script of this folder with an event file of its own (``{root}/{name}.events``)."""
        events = self.root / f"{name}.events"
        cmd = [PY, str(HERE / script), "--events", str(events), *args]
        proc = Proc(name, cmd, log=self.root / f"{name}.log", events=events)
        self.procs.append(proc)
        return proc

    def run(self, name: str, cmd: list[str], *, pipe_stdout: bool = False) -> Proc:
        """Start any command (``python -m trajflight up``...) as a child."""
        proc = Proc(name, cmd, log=self.root / f"{name}.log", pipe_stdout=pipe_stdout)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        """Kill every child and what it started (a driver's storage servers), and remove the arena
        directories those left behind (a killed ``trajflight up`` leaves its deployment directory)."""
        for proc in self.procs:
            descendants = _descendants(proc.pid) if proc.alive() else []
            arenas = {os.path.dirname(d) for d in _shm_dirs(descendants)}
            proc.close()
            _, alive = psutil.wait_procs(descendants, timeout=5)
            for straggler in alive:
                with _no_such_process(), contextlib.suppress(psutil.Error):
                    straggler.kill()
            for arena in arenas:
                if os.path.basename(arena).startswith("trajflight-"):
                    shutil.rmtree(arena, ignore_errors=True)
        self.procs.clear()


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _shm_dirs(procs: list[psutil.Process]) -> list[str]:
    """The ``--shm-dir`` arguments of storage server processes."""
    out = []
    for p in procs:
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        out += [cmd[i + 1] for i, a in enumerate(cmd[:-1]) if a == "--shm-dir"]
    return out


class Server:
    """One storage server process of a plane, restartable on the same port and arena directory."""

    def __init__(self, plane: Plane, index: int) -> None:
        self.plane = plane
        self.index = index
        self.server_id = f"server-{index}"
        self.port = 0
        self.location = ""
        self.proc: Proc | None = None
        self.incarnations = 0
        self.shm_dir = None if plane.deploy_dir is None else str(plane.deploy_dir / self.server_id)

    def spawn(self) -> Proc:
        """Start the process (the first time on a free port, later on the same one)."""
        p = self.plane
        cmd = [
            PY,
            "-m",
            "trajflight",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--capacity",
            str(p.capacity),
            "--max-groups",
            str(p.max_groups),
            "--retry-after",
            "200ms",
            "--shutdown-grace",
            "2s",
            "--shm-ttl",
            p.shm_ttl,
            "--exit-with-parent",
        ]
        if self.shm_dir is not None:
            cmd += ["--shm-dir", self.shm_dir]
        self.incarnations += 1
        self.proc = Proc(
            f"{self.server_id}#{self.incarnations}",
            cmd,
            log=p.root / f"{self.server_id}.log",
            pipe_stdout=True,
        )
        return self.proc

    def started(self, proc: Proc) -> None:
        location = proc.first_line()
        if self.port == 0:
            self.port = int(location.rsplit(":", 1)[1])
        elif location != self.location:
            raise Hang(f"{self.server_id} came back at {location}, not {self.location}")
        self.location = location


class Plane:
    """Storage servers and a controller as real processes on loopback (see the module docstring).

    Args:
        root: A fresh directory for logs, event files, journals and checkpoints.
        servers: Storage servers.
        capacity: Bytes each server holds at most.
        max_groups: Groups each server holds at most.
        shm: Give each server a shared-memory arena (same-host clients then use it).
        shm_ttl: The servers' ``--shm-ttl`` (how long a same-host put may take to publish).
    """

    def __init__(
        self,
        root: Path,
        *,
        servers: int = 2,
        capacity: int = 256 << 20,
        max_groups: int = 100_000,
        shm: bool = True,
        shm_ttl: str = "30s",
    ) -> None:
        self.root = root
        self.capacity = capacity
        self.max_groups = max_groups
        self.shm_ttl = shm_ttl
        # Not "trajflight-<uuid>": other planes on the machine sweep such directories when unlocked.
        self.deploy_dir: Path | None = Path("/dev/shm") / f"tfaults-{uuid.uuid4().hex}" if shm else None
        if self.deploy_dir is not None:
            self.deploy_dir.mkdir(mode=0o700)
        self.servers = [Server(self, i) for i in range(servers)]
        self.controller: Proc | None = None
        self.controller_port = 0
        self.address = ""
        self.state_dir = root / "controller-state-1"
        self._states = 1
        self.children = Children(root)  # writers, trainers, raw clients: killed at close
        self.retired: list[Proc] = []  # plane processes replaced by a restart
        self._client: trajflight.Client | None = None
        self._storage: dict[str, StorageClient] = {}
        self.shared = False  # serves several scenarios: a scenario leaves it running

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Plane:
        """Start the servers and the controller side by side, then register the servers."""
        procs = [s.spawn() for s in self.servers]
        controller = self.spawn_controller(register=False)
        for server, proc in zip(self.servers, procs, strict=True):
            server.started(proc)
        self.controller_started(controller)
        for s in self.servers:
            self.client().controller.register_server(
                s.server_id,
                node=host_id(),
                location=s.location,
                capacity_bytes=self.capacity,
                capacity_groups=self.max_groups,
            )
        return self

    def spawn_controller(self, *, register: bool = True) -> Proc:
        """Start the controller process; ``register``: it registers the known servers itself."""
        cmd = [
            PY,
            str(HERE / "proc_controller.py"),
            "--port",
            str(self.controller_port),
            "--state-dir",
            str(self.state_dir),
            "--capacity",
            str(self.capacity),
            "--max-groups",
            str(self.max_groups),
        ]
        if register:
            for s in self.servers:
                cmd += ["--server", f"{s.server_id}={s.location}"]
        return Proc("controller", cmd, log=self.root / "controller.log", pipe_stdout=True)

    def controller_started(self, proc: Proc) -> None:
        location = proc.first_line()
        if self.controller is not None:
            self.retired.append(self.controller)
        self.controller = proc
        self.controller_port = int(location.rsplit(":", 1)[1])
        self.address = location

    def start_controller(self) -> None:
        """Start the controller again (on its port), registering the servers it had."""
        self.controller_started(self.spawn_controller())

    def kill_controller(self) -> None:
        assert self.controller is not None
        self.controller.kill()

    def restart_controller(self, *, fresh: bool = False) -> None:
        """Start the controller again on the same port: on its journal (recovery), or with ``fresh`` on
        an empty state directory (a job is then restored from a checkpoint). Kills the old one first."""
        if self.controller is not None and self.controller.alive():
            self.controller.kill()
        if fresh:
            self._states += 1
            self.state_dir = self.root / f"controller-state-{self._states}"
        self.start_controller()

    def kill_server(self, index: int) -> None:
        proc = self.servers[index].proc
        assert proc is not None
        proc.kill()

    def restart_server(self, index: int) -> None:
        """Start server ``index`` again on its port and arena directory (it sweeps what the dead one
        left there); it comes back empty. Kills the old one first."""
        server = self.servers[index]
        old = server.proc
        if old is not None:
            if old.alive():
                old.kill()
            self.retired.append(old)
        self._storage.pop(server.location, None)
        server.started(server.spawn())

    def close(self) -> None:
        """Kill every process this plane started and remove its directory in /dev/shm (idempotent)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        for c in self._storage.values():
            c.close()
        self._storage.clear()
        self.children.close()
        procs = [*self.retired, *(s.proc for s in self.servers if s.proc is not None)]
        if self.controller is not None:
            procs.append(self.controller)
        for proc in procs:
            proc.close()
        if self.deploy_dir is not None:
            shutil.rmtree(self.deploy_dir, ignore_errors=True)

    def stop_cleanly(self) -> list[str]:
        """Stop the controller and every server with SIGTERM (as an operator would); return what the run
        left in /dev/shm afterwards (every file under the plane's directory: there must be none)."""
        procs = [s.proc for s in self.servers if s.proc is not None]
        if self.controller is not None:
            procs.insert(0, self.controller)
        procs = [p for p in procs if p.alive()]
        for proc in procs:  # all at once, then wait for each: they stop in parallel
            proc.killed = True
            proc.signal_term()
        for proc in procs:
            proc.terminate()
        if self.deploy_dir is None or not self.deploy_dir.exists():
            return []
        return sorted(str(p.relative_to(self.deploy_dir)) for p in self.deploy_dir.rglob("*") if p.is_file())

    def close_children(self) -> None:
        """Kill the writers, trainers and raw clients of the last scenario."""
        self.children.close()

    def dirty(self) -> str | None:
        """Why this plane cannot serve another scenario as it is (None: it can): a plane process was
        killed, stopped or restarted, or a server still holds something."""
        procs = [s.proc for s in self.servers]
        if self.controller is None or any(p is None for p in procs) or self.retired:
            return "a plane process was restarted"
        for proc in [self.controller, *procs]:
            if proc is None or not proc.alive() or proc.stopped or proc.killed:
                return f"{proc.name if proc else '?'} is not running as started"
        for i in range(len(self.servers)):
            try:
                held = held_by(self.storage(i).stats())
            except Exception as exc:
                return f"server-{i} did not answer: {exc}"
            if held:
                return f"server-{i} holds {held}"
        return None

    def crashed(self) -> list[str]:
        """Plane processes that died without the test killing them, with their log tails."""
        procs = [s.proc for s in self.servers if s.proc is not None]
        if self.controller is not None:
            procs.append(self.controller)
        return [
            f"{p.name} exited with {p.popen.returncode}:\n{p.log_tail(1500)}"
            for p in procs
            if not p.alive() and not p.killed
        ]

    # ------------------------------------------------------------------ access
    def client(self) -> trajflight.Client:
        """The test's own client (an operator's), reconnecting by itself after a controller restart."""
        if self._client is None:
            self._client = trajflight.connect(self.address, timeout=10.0)
        return self._client

    def storage(self, index: int) -> StorageClient:
        """A plain Flight client of server ``index`` (no shared memory), for what a bare client sees."""
        location = self.servers[index].location
        found = self._storage.get(location)
        if found is None:
            found = self._storage[location] = StorageClient(location, timeout=5.0)
        return found

    def spawn(self, name: str, script: str, *args: str) -> Proc:
        """Start a child script of this folder (see :meth:`Children.spawn`)."""
        return self.children.spawn(name, script, *args)
