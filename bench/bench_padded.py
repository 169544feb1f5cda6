"""Padded gets, before and after the one-pass padder, against Ray's padded form, in one process.

On ``trajflight bench``'s setup (``LocalCluster(servers=2, processes=True)``, the standard workload with
its two user columns moved with one ``Writer.put_many``, one lease of every group), each round times
``LeasedBatch.fetch(columns, layout="padded")`` with the codec's padder (``after``) and with the padder
it replaced (``before``: :func:`_pad_torch_before`, torch's jagged -> dense kernel from 1M padded
elements, else a boolean-mask scatter, one column at a time, kept here as the reference), in the order
ABBA (``after`` first on even rounds, ``before`` first on odd ones), and, where Ray is installed, Ray's
strongest form (one object per batch, ``bench/_peer_ray.py``: ``ray.get`` + ``to_padded_tensor``) at
the same point of every round. Each arm's call is timed alone (``fetch``) and followed by a read of one
element per page of every padded tensor (``fetch+read``): a zero-padded tensor of the padder leaves its
padding pages untouched until read, so the second figure charges that first touch to the get, for every
system alike.

    python bench/bench_padded.py [--rounds 20] [--calls 3] [--no-ray] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any
from unittest import mock

import numpy as np

from trajflight.bench._stats import Stats
from trajflight.bench._system import GET_VARIANTS, SUBSET_COLUMNS, SystemUnavailable, payload_of
from trajflight.bench._system_trajflight import TrajflightSystem
from trajflight.codec import Padded, _decode
from trajflight.codec._jagged import jagged
from trajflight.workload import make_workload

VARIANTS = [v for v in GET_VARIANTS if v.layout == "padded"]


def _pad_torch_before(values: Any, offsets: Any, max_len: int, pad: Any) -> Padded[Any]:
    """The padder before this change (checks left out: the timed inputs are valid), one column."""
    import torch

    lengths = (offsets[1:] - offsets[:-1]).to(torch.int64)
    if len(lengths) * max_len >= 1 << 20:
        nested = jagged(values, offsets, max_len)
        return Padded(
            torch.nested.to_padded_tensor(nested, pad, output_size=(len(lengths), max_len)), lengths
        )
    out = torch.full((len(lengths), max_len), pad, dtype=values.dtype)
    out[torch.arange(max_len) < lengths[:, None]] = values
    return Padded(out, lengths)


def _padded_before(plans: Mapping[str, Any], pad: Any) -> dict[str, tuple[Any, Any]]:
    """``_decode._padded`` as it was: every ``list<T>`` column padded on its own."""
    from torch.utils.dlpack import from_dlpack

    out = {}
    for name, plan in plans.items():
        if isinstance(plan, _decode._List):
            got = _pad_torch_before(from_dlpack(plan.values), from_dlpack(plan.offsets), plan.max_len, pad)
            out[name] = (got.values, got.lengths)
    return out


def _read(result: Any) -> None:
    """A read of one element per 4 KiB page of every padded tensor: the first touch a consumer's first
    pass pays (page faults), without that pass's own arithmetic."""
    tensors = result.padded.values() if hasattr(result, "padded") else result.values()
    for t in tensors:
        t = t.values if isinstance(t, Padded) else t
        if t.dim() == 2:
            t.reshape(-1)[:: max(1, 4096 // t.element_size())].sum()


def _timed(fn: Callable[[], Any], read: bool) -> float:
    start = time.perf_counter()
    result = fn()
    if read:
        _read(result)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print (and optionally write) the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=3, help="timed calls per arm and figure per round")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    groups = make_workload(64, 8, seed=0)
    ours = TrajflightSystem(groups, controller=False)
    ray = None
    if not args.no_ray:
        try:
            from trajflight.bench._peer_ray import RaySystem

            ray = RaySystem(groups, samples=8, seed=0, response_median=1024.0)
            ray.setup()
            ray.put_all()
        except SystemUnavailable as exc:
            print(f"ray: {exc.reason} ({exc.hint})", file=sys.stderr)
            ray = None
    ours.setup()
    ours.put_batched_all()
    ours.prepare_get()
    arms: dict[str, Callable[[Any], Any]] = {
        "after": lambda v: ours.get(v),
        "before": lambda v: _with_before(lambda: ours.get(v)),
    }
    if ray is not None:
        arms["ray"] = lambda v: ray.get(v)
    times: dict[str, list[float]] = {}
    loads = [os.getloadavg()[0]]
    try:
        for arm in arms.values():  # warm every arm and figure once
            for v in VARIANTS:
                _read(arm(v))
        for r in range(args.rounds):
            order = ["after", "before"] if r % 2 == 0 else ["before", "after"]
            if ray is not None:  # between the two: the same distance from either arm in every round
                order.insert(1, "ray")
            for name in order:
                for v in VARIANTS:
                    for read in (False, True):
                        key = f"{v.name}/{'fetch+read' if read else 'fetch'}/{name}"
                        for _ in range(args.calls):
                            times.setdefault(key, []).append(_timed(lambda n=name, v=v: arms[n](v), read))
            loads.append(os.getloadavg()[0])
    finally:
        ours.finish_get()
        ours.close()
        if ray is not None:
            ray.close()
    report = _report(times, groups, loads)
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def _with_before(fn: Callable[[], Any]) -> Any:
    with mock.patch.object(_decode, "_padded", _padded_before):
        return fn()


def _report(times: dict[str, list[float]], groups: Any, loads: list[float]) -> dict[str, Any]:
    payload = {
        "get_all_padded": payload_of(groups),
        "get_subset_padded": payload_of(groups, SUBSET_COLUMNS),
    }
    rows: dict[str, Any] = {}
    for key, values in times.items():
        variant = key.split("/")[0]
        s = Stats.of([v * 1e3 for v in values])
        rows[key] = {
            "ms_median": round(s.median, 3),
            "ms_q1_q3": [round(s.q1, 3), round(s.q3, 3)],
            "ms_min_max": [round(s.min, 3), round(s.max, 3)],
            "gb_s_median": round(payload[variant] / s.median / 1e6, 3),
            "n": s.n,
        }
    ratios = {}
    for key in rows:
        variant, figure, arm = key.split("/")
        if arm == "after":
            for other in ("before", "ray"):
                ref = rows.get(f"{variant}/{figure}/{other}")
                if ref:
                    ratios[f"{variant}/{figure}: {other} / after (speed-up)"] = round(
                        ref["ms_median"] / rows[key]["ms_median"], 2
                    )
    return {
        "rows": rows,
        "ratios": ratios,
        "load_1min": {"min": min(loads), "median": float(np.median(loads)), "max": max(loads)},
    }


if __name__ == "__main__":
    sys.exit(main())
