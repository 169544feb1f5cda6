"""Codec benchmark on the standard workload (``trajflight.workload``), against numpy memcpy in the same run.

Measures, per repetition, over the whole workload (G groups, one encode and one decode per group):

* encode from contiguous numpy (values + offsets), group by group and all groups in one
  ``encode_groups`` call (what ``Writer.put_many`` does), and from torch nested jagged tensors;
* ``validate_group(full=True)`` of every group as a storage server receives it (after an IPC stream);
* decode to torch jagged nested tensors, per group (zero-copy) and as one training batch of all groups
  (one copy joins the chunks), and to padded tensors;
* encode from per-sample Python lists against ``pyarrow.array`` on the same lists (the floor for a
  conversion from Python objects);
* the reference: one ``np.copyto`` of the same payload bytes into a pre-faulted buffer.

Usage::

    python bench/bench_codec.py                  # G=64, K=8, 7 repetitions
    python bench/bench_codec.py --scale 4        # responses 4x longer: the copy-free paths stay flat
    python bench/bench_codec.py --json out.json
    python bench/bench_codec.py --tiers --repeats 41   # each kept tier and memo switched off in turn
    python bench/bench_codec.py --against DIR --repeats 41   # against another tree's codec/ (git archive)

Prints medians with the spread (min..max) and ratios against memcpy / pyarrow.array.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import torch

from trajflight.codec import STANDARD_SCHEMA, decode, encode_group, encode_groups, validate_group
from trajflight.keys import Partition
from trajflight.workload import SyntheticGroup, make_workload

_CLOCK = time.perf_counter  # --clock cpu: time.process_time, what this process spends on every core


def _timed(fn: Callable[[], Any], repeats: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        start = _CLOCK()
        fn()
        out.append(_CLOCK() - start)
    return out


def _ipc(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` as a storage server receives it: written to an IPC stream and read back."""
    sink = io.BytesIO()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return ipc.open_stream(pa.BufferReader(sink.getvalue())).read_next_batch()


def _nested(values: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
    return torch.nested.nested_tensor_from_jagged(torch.from_numpy(values), torch.from_numpy(offsets).long())


def _encode_nested(
    groups: list[SyntheticGroup], nested: list[dict[str, torch.Tensor]]
) -> list[pa.RecordBatch]:
    return [
        encode_group(
            job_id="bench",
            epoch=0,
            group_id=g.group_id,
            prompt_ids=torch.from_numpy(g.prompt),
            response_ids=n["ids"],
            response_logprobs=n["logprobs"],
            loss_mask=n["mask"],
            reward=torch.from_numpy(g.reward),
            advantage=torch.from_numpy(g.advantage),
        )
        for g, n in zip(groups, nested, strict=True)
    ]


def _python_lists(g: SyntheticGroup) -> dict[str, Any]:
    o = g.response_offsets
    rows = range(g.num_samples)
    return {
        "prompt_ids": [g.prompt.tolist()] * g.num_samples,
        "response_ids": [g.response_values[o[i] : o[i + 1]].tolist() for i in rows],
        "response_logprobs": [g.logprobs[o[i] : o[i + 1]].tolist() for i in rows],
        "loss_mask": [g.loss_mask[o[i] : o[i + 1]].tolist() for i in rows],
        "reward": g.reward.tolist(),
        "advantage": g.advantage.tolist(),
    }


_LIST_TYPES = {
    "prompt_ids": pa.list_(pa.int32()),
    "response_ids": pa.list_(pa.int32()),
    "response_logprobs": pa.list_(pa.float32()),
    "loss_mask": pa.list_(pa.uint8()),
    "reward": pa.float32(),
    "advantage": pa.float32(),
}


def _summary(
    name: str, seconds: list[float], payload: int, reference: float | None, ref_name: str
) -> dict[str, Any]:
    median = statistics.median(seconds)
    row = {
        "name": name,
        "median_ms": median * 1e3,
        "min_ms": min(seconds) * 1e3,
        "max_ms": max(seconds) * 1e3,
        "gb_per_s": payload / median / 1e9,
    }
    if reference is not None:
        row[f"ratio_vs_{ref_name}"] = median / reference
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the median response length")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: the process's CPU seconds, which a machine shared with other work does not inflate by "
        "waits for a core (to compare two trees of the codec, not to quote throughput)",
    )
    parser.add_argument(
        "--tiers",
        nargs="*",
        metavar="NAME",
        help="instead: each kept tier and memo of the codec switched off in turn (all, or those whose name "
        "holds one of NAME), interleaved with it on; --repeats rounds each",
    )
    parser.add_argument(
        "--against",
        metavar="DIR",
        help="instead: this tree's codec against the codec folder DIR of another tree (git archive <commit> "
        "codec), loaded side by side and interleaved; --repeats rounds each",
    )
    args = parser.parse_args(argv)
    global _CLOCK
    _CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter

    groups = make_workload(args.groups, args.samples, seed=args.seed, response_median=1024 * args.scale)
    payload = sum(g.payload_bytes for g in groups)
    if args.tiers is not None:
        return _tiers(groups, args)
    if args.against is not None:
        return _against(groups, args)
    print(
        f"workload: G={args.groups} K={args.samples} payload={payload / 1e6:.1f} MB, repeats={args.repeats}"
    )

    src = np.random.default_rng(1).integers(0, 255, payload, dtype=np.uint8)
    dst = np.empty_like(src)
    dst[:] = 1  # pre-fault the destination: the reference is the copy, not the page faults
    memcpy = _timed(lambda: np.copyto(dst, src), args.repeats)
    memcpy_median = statistics.median(memcpy)

    batches = [g.encode("bench", 0) for g in groups]
    nested = [
        {
            "ids": _nested(g.response_values, g.response_offsets),
            "logprobs": _nested(g.logprobs, g.response_offsets),
            "mask": _nested(g.loss_mask, g.response_offsets),
        }
        for g in groups
    ]
    list_columns = ["prompt_ids", "response_ids", "response_logprobs", "loss_mask"]
    many = [{"group_id": g.group_id, **g.columns()} for g in groups]
    received = [_ipc(b) for b in batches]
    keys = [Partition("bench", 0, g.group_id) for g in groups]
    table = pa.Table.from_batches(batches)  # a training batch of every group: 64 chunks per column
    rows = [
        _summary("numpy memcpy (reference)", memcpy, payload, None, ""),
        _summary(
            "encode from numpy",
            _timed(lambda: [g.encode("bench", 0) for g in groups], args.repeats),
            payload,
            memcpy_median,
            "memcpy",
        ),
        _summary(
            "encode_groups, one call (joined, 1 copy)",
            _timed(lambda: encode_groups(job_id="bench", epoch=0, groups=many), args.repeats),
            payload,
            memcpy_median,
            "memcpy",
        ),
        _summary(
            "validate_group(full=True) after IPC",
            _timed(
                lambda: [
                    validate_group(b, STANDARD_SCHEMA, expect=k, full=True)
                    for b, k in zip(received, keys, strict=True)
                ],
                args.repeats,
            ),
            payload,
            memcpy_median,
            "memcpy",
        ),
        _summary(
            "encode from nested tensors",
            _timed(lambda: _encode_nested(groups, nested), args.repeats),
            payload,
            memcpy_median,
            "memcpy",
        ),
        _summary(
            "decode to jagged (list columns)",
            _timed(lambda: [decode(b, columns=list_columns) for b in batches], args.repeats),
            payload,
            memcpy_median,
            "memcpy",
        ),
        _summary(
            "decode to jagged (all columns)",
            _timed(lambda: [decode(b) for b in batches], args.repeats),
            payload,
            memcpy_median,
            "memcpy",
        ),
        _summary(
            "decode to ragged values+offsets (list columns)",
            _timed(lambda: [decode(b, columns=list_columns, layout="ragged") for b in batches], args.repeats),
            payload,
            memcpy_median,
            "memcpy",
        ),
        _summary(
            "decode workload as one batch (jagged, 1 copy)",
            _timed(lambda: decode(table, columns=list_columns), args.repeats),
            payload,
            memcpy_median,
            "memcpy",
        ),
        _summary(
            "decode to padded (list columns)",
            _timed(lambda: [decode(b, columns=list_columns, layout="padded") for b in batches], args.repeats),
            payload,
            memcpy_median,
            "memcpy",
        ),
        _summary(
            "decode workload as one batch (padded)",
            _timed(lambda: decode(table, columns=list_columns, layout="padded"), args.repeats),
            payload,
            memcpy_median,
            "memcpy",
        ),
    ]
    by_name = {r["name"]: r["median_ms"] for r in rows}
    for layout, decode_row in (
        ("jagged", "decode to jagged (list columns)"),
        ("ragged", "decode to ragged values+offsets (list columns)"),
    ):
        round_trip = (by_name["encode from numpy"] + by_name[decode_row]) / 1e3
        rows.append(
            {
                "name": f"encode + decode (numpy -> {layout})",
                "median_ms": round_trip * 1e3,
                "ratio_vs_memcpy": round_trip / memcpy_median,
                "gb_per_s": payload / round_trip / 1e9,
            }
        )

    lists = [_python_lists(g) for g in groups]
    pyarrow_floor = _timed(
        lambda: [[pa.array(v, _LIST_TYPES[k]) for k, v in d.items()] for d in lists], args.repeats
    )
    from_lists = _timed(
        lambda: [encode_group(job_id="bench", epoch=0, group_id=i, **d) for i, d in enumerate(lists)],
        args.repeats,
    )
    floor_median = statistics.median(pyarrow_floor)
    rows.append(_summary("pyarrow.array on the lists (reference)", pyarrow_floor, payload, None, ""))
    rows.append(_summary("encode from Python lists", from_lists, payload, floor_median, "pyarrow_array"))

    width = max(len(r["name"]) for r in rows)
    print(f"{'measure':<{width}}  {'median ms':>10}  {'min..max ms':>17}  {'GB/s':>7}  ratio")
    for r in rows:
        ratio = next((f"{v:.3f}x {k[9:]}" for k, v in r.items() if k.startswith("ratio_vs_")), "")
        spread = f"{r['min_ms']:.2f}..{r['max_ms']:.2f}" if "min_ms" in r else ""
        print(f"{r['name']:<{width}}  {r['median_ms']:>10.3f}  {spread:>17}  {r['gb_per_s']:>7.2f}  {ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"payload_bytes": payload, "args": vars(args), "rows": rows}, f, indent=2)
    return 0


def _against(groups: list[SyntheticGroup], args: argparse.Namespace) -> int:
    import trajflight.codec
    from trajflight.bench._codec_against import compare, format_comparison, load_codec

    other = load_codec(args.against)
    print(f"workload: G={args.groups} K={args.samples}, {args.repeats} interleaved rounds, {args.against}")
    rows = compare(trajflight.codec, other, groups, args.repeats)
    print(format_comparison(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "against": rows}, f, indent=2)
    return 0


def _tiers(groups: list[SyntheticGroup], args: argparse.Namespace) -> int:
    from trajflight.bench._codec_tiers import format_tiers, run_tiers

    print(f"workload: G={args.groups} K={args.samples}, {args.repeats} interleaved rounds per tier")
    results = run_tiers(groups, args.repeats, args.tiers)
    print(format_tiers(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "tiers": [r.row() for r in results]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
