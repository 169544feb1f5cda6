"""The ``trajflight bench`` run: every system on the same workload, interleaved, summarised as JSON.

Order of a run (each step shown as a progress line):

1. Generate the seeded workload once; every system is fed the same groups.
2. Start each system. A missing optional peer is *skipped* with its install hint; one that fails to start
   or breaks mid-run is *failed* with the error, and the others go on.
3. Warm-up, untimed. Per system: 3 small round trips (first use: imports, connections); then its first
   full round (put the workload, one get of each variant) on its still-fresh servers, recording the peak
   RSS growth of the client (this process) and of the servers (their processes) per payload byte; then
   one more full round to warm allocators and caches. Before each memory round the client hands freed
   memory back to the OS (``malloc_trim``, Arrow's pool), so one system's leftovers do not hide the
   next one's growth.
4. ``repeats`` timed rounds. Each round visits every system (the order rotates per round so a slow spell
   of the shared machine does not land on one system): put the workload, grant, each get variant, release,
   delete; then, where the system's API has one, a batched put of the whole workload in one call, and
   delete.
5. Small-group latency: put one group + grant + get to torch, ``latency_iters`` times per system, in
   interleaved blocks of 10 after 3 warm-up round trips; p50 and p99.
6. The cross-process handoff, where the system measures it (trajflight, Ray one object, the raw
   shared-memory ceiling): one group from a writer process to a trainer process already waiting for it,
   ``handoff_iters`` times after 3 warm-up ones; p50 and p99.
7. trajflight's controller lease cycles per second.

It does not pin CPUs or isolate the machine: quote the spread, and compare ratios from one run.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trajflight.workload import SyntheticGroup, make_workload

from ._names import SYSTEMS
from ._stats import PeakMemory, Progress, Stats, cpu_count, percentile, release_free_memory, timed
from ._system import GET_VARIANTS, SUBSET_COLUMNS, USER_COLUMNS, System, SystemUnavailable, payload_of

__all__ = ["ALL_SYSTEMS", "BenchConfig", "run_bench"]

AFTER_SINGLE_PUTS = "_after_single_puts"
"""Suffix of the gets timed after one put per group, where the main gets follow the batched put."""


ALL_SYSTEMS = SYSTEMS
SCHEMA_VERSION = 2


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """What to run. The defaults are the standard workload (G=64, K=8, seed 0; ``trajflight.workload``).

    Attributes:
        groups: G, groups in the workload.
        samples: K, samples per group.
        seed: Workload seed.
        response_median: Median response length in tokens (lognormal, sigma 1).
        repeats: Timed rounds (after one warm-up round).
        latency_iters: Small-group round trips per system.
        handoff_iters: Cross-process handoffs per system that measures them.
        controller_groups: Groups cycled per controller measurement.
        systems: Systems to run, by name (``ALL_SYSTEMS``).
        quick: Whether this is the CI mode (recorded in the JSON).
    """

    groups: int = 64
    samples: int = 8
    seed: int = 0
    response_median: float = 1024.0
    repeats: int = 7
    latency_iters: int = 200
    handoff_iters: int = 100
    controller_groups: int = 20_000
    systems: tuple[str, ...] = ALL_SYSTEMS
    quick: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def quick_config(cls, **overrides: Any) -> BenchConfig:
        """CI mode: tiny data (8 groups of 8 short responses), 2 rounds, seconds not minutes."""
        base: dict[str, Any] = {
            "groups": 8,
            "samples": 8,
            "response_median": 64.0,
            "repeats": 2,
            "latency_iters": 10,
            "handoff_iters": 5,
            "controller_groups": 500,
            "quick": True,
        }
        base.update(overrides)
        return cls(**base)


def _make_system(name: str, groups: Sequence[SyntheticGroup], cfg: BenchConfig) -> System:
    if name == "memcpy":
        from ._references import MemcpySystem

        return MemcpySystem(groups)
    if name == "shm-ceiling":
        from ._shm_ceiling import ShmCeilingSystem

        return ShmCeilingSystem(
            groups, samples=cfg.samples, seed=cfg.seed, response_median=cfg.response_median
        )
    if name == "flight":
        from ._references import FlightSystem

        return FlightSystem(groups)
    if name == "flight-per-group":
        from ._references import FlightPerGroupSystem

        return FlightPerGroupSystem(groups)
    if name == "trajflight":
        from ._system_trajflight import TrajflightSystem

        return TrajflightSystem(groups, controller_groups=cfg.controller_groups)
    if name == "trajflight-flight":
        from ._system_trajflight import TrajflightSystem

        return TrajflightSystem(groups, transport="flight", controller="trajflight" not in cfg.systems)
    if name == "ray":
        from ._peer_ray import RaySystem

        return RaySystem(groups, samples=cfg.samples, seed=cfg.seed, response_median=cfg.response_median)
    if name == "ray-per-group":
        from ._peer_ray import RayPerGroupSystem

        return RayPerGroupSystem(
            groups, samples=cfg.samples, seed=cfg.seed, response_median=cfg.response_median
        )
    if name == "transferqueue":
        from ._peer_tq import TransferQueueSystem

        return TransferQueueSystem(groups)
    raise ValueError(f"unknown system {name!r}; choose from {', '.join(ALL_SYSTEMS)}")


def _stats_dict(s: Stats) -> dict[str, float | int]:
    return {"median": s.median, "min": s.min, "max": s.max, "q1": s.q1, "q3": s.q3, "n": s.n}


def _op(times: Sequence[float], nbytes: int, groups: int) -> dict[str, Any]:
    s = Stats.of(times)
    return {
        "bytes": nbytes,
        "groups": groups,
        "seconds": _stats_dict(s),
        "GBps": nbytes / s.median / 1e9,
        "GBps_min": nbytes / s.max / 1e9,
        "GBps_max": nbytes / s.min / 1e9,
        "GBps_q1": nbytes / s.q3 / 1e9,
        "GBps_q3": nbytes / s.q1 / 1e9,
        "groups_per_s": groups / s.median,
    }


class _Entry:
    """One system's state through the run."""

    def __init__(self, name: str, system: System | None) -> None:
        self.name = name
        self.system = system
        self.status = "ok"
        self.reason: str | None = None
        self.hint: str | None = None
        self.times: dict[str, list[float]] = {}
        self.latency: list[float] = []
        self.handoff: list[float] | None = None
        self.memory: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}

    @property
    def active(self) -> bool:
        return self.status == "ok" and self.system is not None

    def fail(self, what: str, exc: BaseException, progress: Progress) -> None:
        self.status = "failed"
        self.reason = f"{what}: {type(exc).__name__}: {exc}"
        progress(f"{self.name}: FAILED during {what}: {exc!r}")
        self.extra["traceback"] = traceback.format_exc(limit=8)
        self.close()

    def close(self) -> None:
        if self.system is not None:
            with contextlib.suppress(Exception):  # closing a broken system must not hide the report
                self.system.close()


def _guard(entry: _Entry, what: str, progress: Progress, fn: Callable[[], None]) -> None:
    if not entry.active:
        return
    try:
        fn()
    except Exception as exc:
        entry.fail(what, exc, progress)


def run_bench(cfg: BenchConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Run the benchmark and return its result (the JSON document, see ``_schema.SCHEMA``).

    Args:
        cfg: What to run.
        progress: Where progress lines go (default: stderr).
    """
    progress = progress or Progress()
    started = time.time()
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    groups = make_workload(cfg.groups, cfg.samples, seed=cfg.seed, response_median=cfg.response_median)
    payload = payload_of(groups)
    subset_payload = payload_of(groups, SUBSET_COLUMNS)
    small_payload = [payload_of([g]) for g in groups]
    progress(
        f"workload G={cfg.groups} K={cfg.samples} seed={cfg.seed}: payload {payload / 1e6:.2f} MB "
        f"(2-column subset {subset_payload / 1e6:.2f} MB); systems: {', '.join(cfg.systems)}"
    )

    entries: list[_Entry] = []
    for name in cfg.systems:
        entry = _Entry(name, None)
        entries.append(entry)
        try:
            entry.system = _make_system(name, groups, cfg)
            progress(f"{name}: starting")
            entry.system.setup()
        except SystemUnavailable as exc:
            entry.status, entry.reason, entry.hint = "skipped", exc.reason, exc.hint
            progress(f"{name}: SKIPPED ({exc.reason}); to include it: {exc.hint}")
            entry.close()
        except Exception as exc:
            entry.fail("setup", exc, progress)

    try:
        for entry in entries:  # first use: imports, connections; nothing measured
            _guard(entry, "warm-up", progress, lambda e=entry: _first_use(e, progress))
        for entry in entries:  # the first full round of fresh servers, with peak memory measured
            _guard(entry, "memory round", progress, lambda e=entry: _memory_round(e, payload, progress))
        for entry in entries:  # warms allocators and caches; not timed
            _guard(entry, "warm-up round", progress, lambda e=entry: _round(e, record=False))
        for r in range(cfg.repeats):
            active = [e for e in entries if e.active]
            if not active:
                break
            shift = r % len(active)
            order = active[shift:] + active[:shift]
            progress(f"round {r + 1}/{cfg.repeats}: {', '.join(e.name for e in order)}")
            for entry in order:
                _guard(entry, f"round {r + 1}", progress, lambda e=entry: _round(e))
        _latency(entries, cfg.latency_iters, progress)
        _handoffs(entries, cfg.handoff_iters, progress)
        for entry in entries:
            if entry.active and entry.system is not None:
                progress(f"{entry.name}: extra figures")
                _guard(
                    entry,
                    "extra figures",
                    progress,
                    lambda e=entry: e.extra.update(e.system.extra_metrics(cfg.repeats)),  # type: ignore[union-attr]
                )
    finally:
        for entry in entries:
            entry.close()
        from ._peer_ray import shutdown_ray

        shutdown_ray()

    systems: dict[str, Any] = {}
    for entry in entries:
        out: dict[str, Any] = {
            "status": entry.status,
            "role": entry.system.role if entry.system is not None else "peer",
            "form": entry.system.form if entry.system is not None else "",
            "strongest": entry.system.strongest if entry.system is not None else True,
            "description": entry.system.description if entry.system is not None else "",
            "reason": entry.reason,
            "hint": entry.hint,
        }
        if entry.status == "ok":
            out["put"] = _op(entry.times["put"], payload, cfg.groups)
            if "put_batched" in entry.times:
                out["put_batched"] = _op(entry.times["put_batched"], payload, cfg.groups)
            for v in GET_VARIANTS:
                out[v.name] = _op(entry.times[v.name], subset_payload if v.subset else payload, cfg.groups)
            if entry.system is not None and entry.system.gets_after_batched:
                out["gets_after_single_puts"] = {
                    v.name: _op(
                        entry.times[v.name + AFTER_SINGLE_PUTS],
                        subset_payload if v.subset else payload,
                        cfg.groups,
                    )
                    for v in GET_VARIANTS
                }
            out["latency"] = {
                **_latency_figure(entry.latency, "put 1 group + grant + get to torch (jagged, all columns)"),
                "group_payload_bytes": int(sum(small_payload) / len(small_payload)),
            }
            if entry.handoff:
                out["handoff"] = _latency_figure(
                    entry.handoff,
                    "1 group: writer process put -> trainer process (waiting) holds it as torch tensors",
                )
            out["memory"] = entry.memory
            out.update({k: v for k, v in entry.extra.items() if k != "traceback"})
        elif "traceback" in entry.extra:
            out["traceback"] = entry.extra["traceback"]
        systems[entry.name] = out

    import numpy
    import pyarrow
    import torch

    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "trajflight bench",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": time.time() - started,
        "machine": {
            "cpus": cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "pyarrow": pyarrow.__version__,
            "torch": torch.__version__,
            "numpy": numpy.__version__,
            "loadavg_before": list(load_before),
            "loadavg_after": list(os.getloadavg()) if hasattr(os, "getloadavg") else [0.0, 0.0, 0.0],
        },
        "config": {
            **{k: v for k, v in asdict(cfg).items() if k != "extra"},
            "systems": list(cfg.systems),
            "payload_bytes": payload,
            "subset_payload_bytes": subset_payload,
            "subset_columns": list(SUBSET_COLUMNS),
            "user_columns": list(USER_COLUMNS),
            **cfg.extra,
        },
        "systems": systems,
    }


def _latency_figure(times: Sequence[float], what: str) -> dict[str, Any]:
    return {
        "what": what,
        "p50_ms": percentile(times, 50) * 1e3,
        "p99_ms": percentile(times, 99) * 1e3,
        "min_ms": min(times) * 1e3,
        "max_ms": max(times) * 1e3,
        "n": len(times),
    }


def _handoffs(entries: list[_Entry], iters: int, progress: Progress) -> None:
    """The cross-process handoff of every system that measures it (one after the other)."""
    for entry in entries:
        system = entry.system
        if not entry.active or system is None or type(system).handoff is System.handoff:
            continue
        progress(f"{entry.name}: cross-process handoff, {iters} groups")

        def measure(e: _Entry = entry, s: System = system) -> None:
            e.handoff = s.handoff(iters)

        _guard(entry, "handoff", progress, measure)


def _first_use(entry: _Entry, progress: Progress) -> None:
    system = entry.system
    assert system is not None  # guarded by _Entry.active
    progress(f"{entry.name}: warm-up (first use)")
    for i in range(3):
        system.small_roundtrip(i)
        system.small_cleanup()


def _memory_round(entry: _Entry, payload: int, progress: Progress) -> None:
    system = entry.system
    assert system is not None  # guarded by _Entry.active
    progress(f"{entry.name}: first full round, peak memory measured")
    release_free_memory()  # so memory freed by the systems before does not hide this one's growth
    pids = system.server_pids()
    with PeakMemory([os.getpid()]) as client, PeakMemory(pids, include_shmem=system.include_shmem) as servers:
        system.put_all()
        system.prepare_get()
        for v in GET_VARIANTS:
            system.get(v)
        system.finish_get()
    system.drain()
    entry.memory = {
        "payload_bytes": payload,
        "client_peak_bytes": client.peak,
        "client_growth_bytes": client.growth,
        "client_per_payload_byte": client.growth / payload,
        "servers_peak_bytes": servers.peak if system.has_servers else None,
        "servers_growth_bytes": servers.growth if system.has_servers else None,
        "servers_per_payload_byte": servers.growth / payload if system.has_servers else None,
        "server_processes": len(pids),
        "method": client.method,
        "servers_counted": system.memory_note or "no server",
    }


def _gets(system: System, times: dict[str, float], suffix: str = "") -> None:
    system.prepare_get()
    for v in GET_VARIANTS:
        times[v.name + suffix] = timed(lambda v=v: system.get(v))
    system.finish_get()
    system.drain()


def _round(entry: _Entry, *, record: bool = True) -> None:
    system = entry.system
    assert system is not None
    times = {"put": timed(system.put_all)}
    if system.gets_after_batched:
        _gets(system, times, AFTER_SINGLE_PUTS)
        times["put_batched"] = timed(system.put_batched_all)
        _gets(system, times)
    else:
        _gets(system, times)
        if system.supports_batched:
            times["put_batched"] = timed(system.put_batched_all)
            system.drain()
    if record:
        for key, value in times.items():
            entry.times.setdefault(key, []).append(value)


def _latency(entries: list[_Entry], iters: int, progress: Progress) -> None:
    active = [e for e in entries if e.active]
    progress(f"small-group latency: {iters} round trips per system ({', '.join(e.name for e in active)})")
    counter = 0

    def trip(entry: _Entry, record: bool) -> None:
        nonlocal counter
        system = entry.system
        assert system is not None
        counter += 1
        elapsed = timed(lambda: system.small_roundtrip(counter))
        system.small_cleanup()
        if record:
            entry.latency.append(elapsed)

    for entry in active:
        _guard(entry, "latency warm-up", progress, lambda e=entry: [trip(e, False) for _ in range(3)])
    done = 0
    while done < iters:
        block = min(10, iters - done)
        for entry in entries:
            _guard(entry, "latency", progress, lambda e=entry, b=block: [trip(e, True) for _ in range(b)])
        done += block
