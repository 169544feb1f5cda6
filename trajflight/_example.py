"""``trajflight example``: encode synthetic GRPO groups and decode them to torch without copies.

The runnable codec example the README points to; it prints what it did and checks what it promises
(bit-exact values, tensors that share Arrow's memory).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa

from trajflight.codec import decode, decode_numpy
from trajflight.units import format_size
from trajflight.workload import make_workload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the example's options."""
    parser.add_argument("--groups", type=int, default=64, help="GRPO groups to generate (default 64)")
    parser.add_argument("--samples", type=int, default=8, help="samples per group (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument("--top-p", action="store_true", help="also generate doubly ragged top-p candidates")


def run(args: argparse.Namespace) -> int:
    """Run the example; returns 0 when every check holds, 1 otherwise."""
    groups = make_workload(args.groups, args.samples, seed=args.seed, top_p=args.top_p)
    payload = sum(g.payload_bytes for g in groups)
    start = time.perf_counter()
    batches = [g.encode("example-job", epoch=1) for g in groups]
    encoded = time.perf_counter() - start
    aliased = all(
        b.column("response_ids").values.buffers()[1].address == g.response_values.ctypes.data
        for b, g in zip(batches, groups, strict=True)
    )
    print(
        f"encoded {len(batches)} groups x {args.samples} samples ({format_size(payload)} payload) "
        f"in {encoded * 1e3:.2f} ms; Arrow aliases the numpy inputs: {aliased}"
    )

    one = batches[0]
    start = time.perf_counter()
    decode(one, columns=["response_ids"])  # torch.nested's first use imports its machinery once
    warm_up = time.perf_counter() - start
    start = time.perf_counter()
    tensors = decode(one, columns=["response_ids", "response_logprobs", "loss_mask", "reward"])
    decoded = time.perf_counter() - start
    ids = tensors.tensors["response_ids"]
    shares = ids.values().data_ptr() == one.column("response_ids").values.buffers()[1].address
    exact = np.array_equal(ids.values().numpy(), groups[0].response_values)
    print(
        f"decoded group 0 to torch in {decoded * 1e3:.3f} ms (torch.nested's one-time start-up took "
        f"{warm_up * 1e3:.0f} ms before): response_ids is a jagged nested tensor {tuple(ids.shape)}, "
        f"sharing Arrow's buffer: {shares}, bit-exact: {exact}"
    )

    table = pa.Table.from_batches(batches)
    padded = decode(table, columns=["response_ids"], layout="padded").padded["response_ids"]
    print(
        f"a training batch of {table.num_rows} samples, padded: {tuple(padded.values.shape)}, "
        f"lengths {padded.lengths[:4].tolist()}..."
    )
    ragged = decode_numpy(one, columns=["response_logprobs"]).ragged["response_logprobs"]
    print(
        f"numpy twin: {len(ragged.offsets) - 1} rows, {ragged.values.size} logprobs, "
        f"mean logprob {float(ragged.values.mean()):.3f}"
    )
    return 0 if aliased and shares and exact else 1
