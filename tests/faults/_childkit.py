"""What every child process of the fault suite shares: its event log, its death with the test, its fault
points.

A child writes one JSON line per event to its event file as the event happens (``O_APPEND``, one
``write(2)`` per line, no buffering in the process), so a child killed with SIGKILL leaves every event it
had reached: what it acknowledged so far is on disk. Events carry ``t``, ``time.monotonic()``, which on
Linux is one clock for every process of the machine, so the test can order events of several children.

Fault points: a child given ``--die-at STEP[@N]`` kills itself with SIGKILL at the N-th time it reaches
``STEP`` (after logging ``{"ev": "at", "step": STEP}``), and one given ``--pause-at STEP[@N]`` stops itself
with SIGSTOP there (after logging ``{"ev": "paused", ...}``) until the test sends SIGCONT. Dying or stopping
at a named step is what makes "a kill at every step" exact; a test that wants a kill at an arbitrary time
sends the signal itself.

Every child asks the kernel to SIGKILL it when the test process dies (``PR_SET_PDEATHSIG``), so not even a
stopped child outlives a killed test run.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from collections import Counter
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux; a no-op elsewhere)."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the call took effect
        os.kill(os.getpid(), signal.SIGKILL)


class Events:
    """An append-only JSON-lines event log, one ``write(2)`` per event."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def emit(self, ev: str, **fields: Any) -> None:
        """Write ``{"ev": ev, "t": monotonic, **fields}`` as one line."""
        line = json.dumps({"ev": ev, "t": time.monotonic(), "pid": os.getpid(), **fields}, default=str)
        os.write(self._fd, (line + "\n").encode())


def _parse_points(specs: list[str] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for spec in specs or []:
        step, _, nth = spec.partition("@")
        out[step] = int(nth or 1)
    return out


class FaultPoints:
    """The steps at which this child kills or stops itself (``--die-at`` / ``--pause-at``)."""

    def __init__(self, events: Events, die_at: list[str] | None, pause_at: list[str] | None) -> None:
        self.events = events
        self.die = _parse_points(die_at)
        self.pause = _parse_points(pause_at)
        self.seen: Counter[str] = Counter()

    def reached(self, step: str, **fields: Any) -> bool:
        """Mark ``step``; die or stop here if asked. Returns True when the process was stopped and
        continued here (a zombie that woke up)."""
        self.seen[step] += 1
        n = self.seen[step]
        if self.die.get(step) == n:
            self.events.emit("at", step=step, n=n, action="die", **fields)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.pause.get(step) == n:
            self.events.emit("paused", step=step, n=n, **fields)
            os.kill(os.getpid(), signal.SIGSTOP)
            self.events.emit("continued", step=step, n=n)
            return True
        return False


def add_fault_arguments(parser: Any) -> None:
    """``--events``, ``--die-at`` and ``--pause-at``, which every child takes."""
    parser.add_argument("--events", required=True, help="JSON-lines event file (appended)")
    parser.add_argument("--die-at", action="append", help="STEP[@N]: SIGKILL self the N-th time at STEP")
    parser.add_argument("--pause-at", action="append", help="STEP[@N]: SIGSTOP self the N-th time at STEP")


def error_name(exc: BaseException) -> str:
    """``ClassName: message`` cut to 300 characters, for event logs."""
    return f"{type(exc).__name__}: {exc}"[:300]


def fail(events: Events, exc: BaseException) -> None:
    """Log an unexpected error of the child and exit with status 3."""
    events.emit("crash", error=error_name(exc))
    print(f"child failed: {error_name(exc)}", file=sys.stderr, flush=True)
    sys.exit(3)
