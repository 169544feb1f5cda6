"""GPU handoff benchmark: ``decode(..., device="cuda")`` against torch's own ``pin_memory().to("cuda")``.

On a machine with CUDA: decodes the standard workload (one training batch of all groups, the list
columns and the per-sample scalars) to the GPU, checks every tensor bit for bit against the CPU decode,
and reports host-to-device GB/s for trajflight's path (one pinned staging copy + one non-blocking copy
on a side stream) and for torch's reference (``t.pin_memory().to("cuda", non_blocking=True)`` per
tensor, the same bytes). Exits 2 without CUDA.

Usage::

    python bench/bench_codec_gpu.py --repeats 10 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import pyarrow as pa
import torch

from trajflight.codec import decode
from trajflight.workload import make_workload

COLUMNS = ["prompt_ids", "response_ids", "response_logprobs", "loss_mask", "reward", "advantage"]


def _host_tensors(batch: Any) -> list[torch.Tensor]:
    out = []
    for name in COLUMNS:
        t = batch.tensors[name]
        out.extend((t.values(), t.offsets()) if t.is_nested else (t,))
    return out


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.contiguous(), b.contiguous()
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _timed_cuda(fn: Any, repeats: int) -> list[float]:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark needs a GPU", file=sys.stderr)
        return 2

    groups = make_workload(args.groups, args.samples)
    table = pa.Table.from_batches([g.encode("bench", 0) for g in groups]).combine_chunks()
    cpu = decode(table, columns=COLUMNS)
    host = _host_tensors(cpu)
    nbytes = sum(t.numel() * t.element_size() for t in host)

    gpu = decode(table, columns=COLUMNS, device="cuda")
    torch.cuda.synchronize()
    mismatches = [
        i for i, (a, b) in enumerate(zip(_host_tensors(gpu), host, strict=True)) if not _bit_equal(a.cpu(), b)
    ]
    if mismatches:
        print(f"FAIL: device tensors {mismatches} differ from the host decode", file=sys.stderr)
        return 1

    ours = _timed_cuda(lambda: decode(table, columns=COLUMNS, device="cuda"), args.repeats)
    reference = _timed_cuda(
        lambda: [t.pin_memory().to("cuda", non_blocking=True) for t in host], args.repeats
    )
    rows = {
        "bytes": nbytes,
        "trajflight_decode_cuda_gb_s": nbytes / statistics.median(ours) / 1e9,
        "trajflight_spread_ms": [min(ours) * 1e3, max(ours) * 1e3],
        "torch_pin_memory_to_cuda_gb_s": nbytes / statistics.median(reference) / 1e9,
        "torch_spread_ms": [min(reference) * 1e3, max(reference) * 1e3],
        "bit_exact": True,
        "device": torch.cuda.get_device_name(),
    }
    rows["ratio"] = rows["trajflight_decode_cuda_gb_s"] / rows["torch_pin_memory_to_cuda_gb_s"]
    print(json.dumps(rows, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
