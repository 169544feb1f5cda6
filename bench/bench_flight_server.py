"""Benchmark of the trajflight storage server against a bare ``pyarrow.flight`` server, same run.

Standard GRPO workload (``trajflight.workload``; G=64 groups x K=8 samples), one server process and one
client (this process) on loopback. Measured, each repeated and reported as median [min..max]:

* put: one ``do_put`` per group, the whole workload; trajflight vs a bare server that just keeps the table.
* get: the whole workload in one ``do_get`` stream (all groups in one ticket) and one ``do_get`` per group.
* projection: ``response_ids`` + ``response_logprobs`` vs all columns (time ratio vs payload ratio).
* parallel: the workload split over 2 servers read with ``get_parallel`` vs all of it from 1 server.
* memory: server RSS growth per payload byte held (psutil; servers are subprocesses), trajflight and bare.

Throughput = payload bytes (values only, no offsets) / seconds. Not a test: timing decides nothing.

    .venv/bin/python bench/bench_flight_server.py [--groups 64] [--samples 8] [--repeats 11] [--rss-scale 24]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc

from trajflight.flight_server import GroupRead, LeaseToken, StorageClient, get_parallel
from trajflight.keys import Partition

PROJECTION = ["response_ids", "response_logprobs"]


# ------------------------------------------------------------------------------------------ workload


def _list(offsets: np.ndarray, values: np.ndarray) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def make_workload(groups: int, samples: int, *, job_id: str = "bench", seed: int = 0) -> list[pa.RecordBatch]:
    """The standard workload: G groups of K samples, columns and distributions of ``trajflight.workload``."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        prompt_len = int(rng.integers(128, 1025))
        prompt = rng.integers(0, 150_000, prompt_len, dtype=np.int32)
        lengths = np.clip(np.round(rng.lognormal(np.log(1024), 1.0, samples)), 64, 8192).astype(np.int32)
        offsets = np.zeros(samples + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        reward = rng.integers(0, 2, samples).astype(np.float32)
        advantage = (reward - reward.mean()) / (reward.std() + 1e-6)
        out.append(
            pa.record_batch(
                {
                    "job_id": pa.array([job_id] * samples),
                    "epoch": pa.array(np.zeros(samples, dtype=np.int64)),
                    "group_id": pa.array(np.full(samples, g, dtype=np.int64)),
                    "sample_index": pa.array(np.arange(samples, dtype=np.int32)),
                    "sample_id": pa.array([f"{job_id}-{g}-{i}" for i in range(samples)]),
                    "policy_version": pa.array(np.zeros(samples, dtype=np.int64)),
                    "prompt_ids": _list(
                        np.arange(samples + 1, dtype=np.int32) * prompt_len, np.tile(prompt, samples)
                    ),
                    "response_ids": _list(offsets, rng.integers(0, 150_000, total, dtype=np.int32)),
                    "response_logprobs": _list(offsets, -rng.exponential(1.0, total).astype(np.float32)),
                    "loss_mask": _list(offsets, np.ones(total, dtype=np.uint8)),
                    "reward": pa.array(reward),
                    "advantage": pa.array(advantage.astype(np.float32)),
                }
            )
        )
    return out


def payload_bytes(batches: list[pa.RecordBatch], columns: list[str] | None = None) -> int:
    """Bytes of the values only (no offsets, no validity), as BENCHMARKS.md counts payload."""
    total = 0
    for batch in batches:
        for name in columns or batch.schema.names:
            column = batch.column(name)
            while pa.types.is_list(column.type):
                column = column.flatten()
            if pa.types.is_string(column.type):
                total += column.buffers()[2].size
            else:
                total += column.buffers()[1].size
    return total


# ----------------------------------------------------------------------------------------- bare server


class BareServer(flight.FlightServerBase):
    """The reference: keeps each put as the table received; serves a ticket (a JSON list of paths)."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.tables: dict[tuple[bytes, ...], pa.Table] = {}

    def do_put(self, context, descriptor, reader, writer):
        self.tables[tuple(descriptor.path)] = reader.read_all()

    def do_get(self, context, ticket):
        body = json.loads(ticket.ticket)
        tables = [self.tables[tuple(p.encode() for p in path)] for path in body["paths"]]
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        if body.get("columns"):
            table = table.select(body["columns"])
        return flight.RecordBatchStream(table)

    def do_action(self, context, action):
        self.tables.clear()
        return []


def serve_bare() -> None:
    server = BareServer("grpc://127.0.0.1:0")
    print(f"grpc://127.0.0.1:{server.port}", flush=True)
    server.serve()


# -------------------------------------------------------------------------------------------- harness


class Proc:
    """A server subprocess; its first stdout line is its location."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.location = self.proc.stdout.readline().strip()
        self.ps = psutil.Process(self.proc.pid)

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def trajflight_server(capacity: str = "16GiB") -> Proc:
    return Proc([sys.executable, "-m", "trajflight", "server", "--port", "0", "--capacity", capacity])


def bare_server() -> Proc:
    return Proc([sys.executable, __file__, "--serve-bare"])


Case = tuple[Callable[[], object], Callable[[], object] | None]  # (timed call, untimed setup)


def interleaved(cases: dict[str, Case], repeats: int) -> dict[str, list[float]]:
    """Time each case ``repeats`` times, alternating cases round by round.

    The machine is shared and noisy: alternating keeps a slow spell from landing on one side of a ratio.
    The first round warms connections and allocators and is dropped.
    """
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(repeats + 1):
        for name, (fn, setup) in cases.items():
            if setup is not None:
                setup()
            start = time.perf_counter()
            fn()
            if round_:
                times[name].append(time.perf_counter() - start)
    return times


def fmt(times: list[float], nbytes: int) -> str:
    med = statistics.median(times)
    return (
        f"{nbytes / med / 1e9:6.2f} GB/s  median {med * 1e3:7.2f} ms  "
        f"[{min(times) * 1e3:.2f}..{max(times) * 1e3:.2f}] ms  (n={len(times)})"
    )


def keys_of(batches: list[pa.RecordBatch]) -> list[Partition]:
    return [Partition(b.column("job_id")[0].as_py(), 0, b.column("group_id")[0].as_py()) for b in batches]


# ---------------------------------------------------------------------------------------------- runs


def tf_put_all(client: StorageClient, batches: list[pa.RecordBatch], keys: list[Partition]) -> None:
    for key, batch in zip(keys, batches, strict=True):
        client.put_groups([(key, batch)])


def tf_clear(client: StorageClient, keys: list[Partition]) -> None:
    client.delete([GroupRead(k, LeaseToken(0)) for k in keys])


class FreshKeys:
    """The workload under a new epoch before each timed put: a server tombstones the keys it deleted and
    refuses to store them again, so a repeat must not reuse them."""

    def __init__(
        self, client: StorageClient, batches: list[pa.RecordBatch], *, first: int, step: int
    ) -> None:
        self.client = client
        self.template = batches
        self.epoch, self.step = first - step, step
        self.batches = batches
        self.keys: list[Partition] = []  # epoch 0 stays unused: the get runs put it afterwards

    def setup(self) -> None:
        """Delete the previous round's groups, then stamp the next epoch (untimed)."""
        if self.keys:
            tf_clear(self.client, self.keys)
        self.epoch += self.step
        index = self.template[0].schema.get_field_index("epoch")
        self.batches = [
            b.set_column(index, "epoch", pa.array(np.full(b.num_rows, self.epoch, dtype=np.int64)))
            for b in self.template
        ]
        self.keys = [Partition(k.job_id, self.epoch, k.group_id) for k in keys_of(self.template)]


def bare_put_all(client: flight.FlightClient, batches: list[pa.RecordBatch], keys: list[Partition]) -> None:
    options = flight.FlightCallOptions(timeout=60)
    for key, batch in zip(keys, batches, strict=True):
        descriptor = flight.FlightDescriptor.for_path(key.job_id, str(key.epoch), str(key.group_id))
        writer, _ = client.do_put(descriptor, batch.schema, options=options)
        writer.write_batch(batch)
        writer.close()


def bare_put_batched(client: flight.FlightClient, batches: list[pa.RecordBatch]) -> None:
    descriptor = flight.FlightDescriptor.for_path("batched")
    writer, _ = client.do_put(descriptor, batches[0].schema, options=flight.FlightCallOptions(timeout=60))
    for batch in batches:
        writer.write_batch(batch)
    writer.close()


def bare_get(
    client: flight.FlightClient, keys: list[Partition], columns: list[str] | None = None
) -> pa.Table:
    body = {"paths": [[k.job_id, str(k.epoch), str(k.group_id)] for k in keys], "columns": columns}
    ticket = flight.Ticket(json.dumps(body).encode())
    return client.do_get(ticket, options=flight.FlightCallOptions(timeout=60)).read_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rss-scale", type=int, default=24, help="the RSS run holds this many workloads")
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        serve_bare()
        return 0

    batches = make_workload(args.groups, args.samples)
    keys = keys_of(batches)
    payload = payload_bytes(batches)
    proj_payload = payload_bytes(batches, PROJECTION)
    print(
        f"workload: G={args.groups} K={args.samples}, payload {payload / 1e6:.1f} MB "
        f"(projection {PROJECTION}: {proj_payload / 1e6:.1f} MB), repeats={args.repeats}, "
        f"pyarrow {pa.__version__}, {os.cpu_count()} CPUs"
    )
    results: dict[str, list[float]] = {}
    servers: list[Proc] = []
    try:
        tf, bare, tf2 = trajflight_server(), bare_server(), trajflight_server()
        servers += [tf, bare, tf2]
        client = StorageClient(tf.location, timeout=60)
        # Bare clients read with Alignment.Any; the trajflight default (DataTypeSpecific) copies misaligned
        # receive buffers so DLPack consumers get aligned memory: measured separately.
        client_any = StorageClient(tf.location, timeout=60, alignment=ipc.Alignment.Any)
        client2 = StorageClient(tf2.location, timeout=60, alignment=ipc.Alignment.Any)
        raw = flight.FlightClient(bare.location)

        # -- put: each case starts from an empty server
        def clear_bare() -> None:
            list(raw.do_action(flight.Action("clear", b"")))

        fresh = FreshKeys(client, batches, first=1, step=2)
        fresh_batched = FreshKeys(client, batches, first=2, step=2)
        results |= interleaved(
            {
                "put trajflight": (lambda: tf_put_all(client, fresh.batches, fresh.keys), fresh.setup),
                "put bare": (lambda: bare_put_all(raw, batches, keys), clear_bare),
                "put trajflight batched": (
                    lambda: client.put_groups(
                        list(zip(fresh_batched.keys, fresh_batched.batches, strict=True))
                    ),
                    fresh_batched.setup,
                ),
                "put bare batched": (lambda: bare_put_batched(raw, batches), clear_bare),
            },
            args.repeats,
        )
        # -- get: the whole workload on tf and bare; its second half also on tf2 (parallel case)
        tf_clear(client, fresh.keys)
        tf_clear(client, fresh_batched.keys)
        clear_bare()
        tf_put_all(client, batches, keys)
        bare_put_all(raw, batches, keys)
        half = len(keys) // 2
        tf_put_all(client2, batches[half:], keys[half:])
        results |= interleaved(
            {
                "get trajflight (1 stream)": (lambda: client_any.get(keys), None),
                "get bare (1 stream)": (lambda: bare_get(raw, keys), None),
                "get trajflight aligned (1 stream)": (lambda: client.get(keys), None),
                "get trajflight (1 per group)": (lambda: [client_any.get([k]) for k in keys], None),
                "get bare (1 per group)": (lambda: [bare_get(raw, [k]) for k in keys], None),
                "get trajflight 2-col projection": (lambda: client_any.get(keys, columns=PROJECTION), None),
                "get bare 2-col projection": (lambda: bare_get(raw, keys, PROJECTION), None),
                "get parallel 2 servers": (
                    lambda: get_parallel([(client_any, keys[:half]), (client2, keys[half:])]),
                    None,
                ),
            },
            args.repeats,
        )
        results["get 1 server (same data)"] = results["get trajflight (1 stream)"]
        client.close()
        client_any.close()
        client2.close()
        raw.close()
        for proc in servers:
            proc.stop()
        servers.clear()

        # -- memory: fresh servers, hold rss_scale x the workload
        rss = {}
        scaled = [
            make_workload(args.groups, args.samples, job_id=f"rss{i}", seed=i) for i in range(args.rss_scale)
        ]
        held = sum(payload_bytes(w) for w in scaled)
        for name, start in (("trajflight", trajflight_server), ("bare", bare_server)):
            proc = start()
            servers.append(proc)
            time.sleep(0.5)
            before = proc.rss()
            if name == "trajflight":
                with StorageClient(proc.location, timeout=120) as c:
                    for w in scaled:
                        tf_put_all(c, w, keys_of(w))
            else:
                c = flight.FlightClient(proc.location)
                for w in scaled:
                    bare_put_all(c, w, keys_of(w))
                c.close()
            time.sleep(0.5)
            rss[name] = (before, proc.rss())
    finally:
        for proc in servers:
            proc.stop()

    print()
    for name, times in results.items():
        nbytes = proj_payload if "projection" in name else payload
        print(f"{name:34s} {fmt(times, nbytes)}")
    med = {k: statistics.median(v) for k, v in results.items()}
    print()
    print(f"put ratio trajflight/bare, 1 group per put        {med['put bare'] / med['put trajflight']:.2f}x")
    print(
        f"put ratio trajflight/bare, batched (1 stream)     "
        f"{med['put bare batched'] / med['put trajflight batched']:.2f}x"
    )
    print(
        f"put ratio trajflight batched / bare 1 per put     "
        f"{med['put bare'] / med['put trajflight batched']:.2f}x"
    )
    print(
        f"get ratio trajflight/bare, 1 stream               "
        f"{med['get bare (1 stream)'] / med['get trajflight (1 stream)']:.2f}x"
    )
    print(
        f"get ratio trajflight/bare, 1 per group            "
        f"{med['get bare (1 per group)'] / med['get trajflight (1 per group)']:.2f}x"
    )
    print(
        f"alignment copy: aligned get takes "
        f"{med['get trajflight aligned (1 stream)'] / med['get trajflight (1 stream)']:.2f}x the unaligned"
    )
    print(
        f"projection: time {med['get trajflight 2-col projection'] / med['get trajflight (1 stream)']:.2f} "
        f"of a full get for {proj_payload / payload:.2f} of the payload"
    )
    print(
        f"parallel: 2 servers {med['get 1 server (same data)'] / med['get parallel 2 servers']:.2f}x "
        "the speed of 1 server"
    )
    for name, (before, after) in rss.items():
        print(
            f"RSS {name:10s}: {before / 1e6:.0f} MB idle -> {after / 1e6:.0f} MB holding {held / 1e6:.0f} MB "
            f"payload: growth {(after - before) / held:.2f}x payload"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
