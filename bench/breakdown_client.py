"""Where the time of one group goes in trajflight's public client, step by step, next to a bare Flight put.

For each transport (``auto``: shared memory on this host; ``flight``), against ``LocalCluster(servers=1)``:

* put path, per group: ``SyntheticGroup.encode``, then ``Writer.put`` (allocate + store + publish),
  next to a bare ``pyarrow.flight`` ``do_put`` of the same batch to the bare server of
  ``bench_flight_server.py``;
* the small-group round trip: ``Writer.put``, ``Trainer.lease(1)`` (acquire + the fence on the server),
  ``LeasedBatch.fetch_table``, ``decode`` to torch;
* reading the whole workload's 2-column subset over shared memory from 2 servers when its groups were
  stored one ``Writer.put`` each (one segment per group) and by one ``Writer.put_many`` (one segment per
  server);
* padding the whole workload: ``decode(layout="padded")`` next to a jagged decode followed by torch's
  ``to_padded_tensor`` (what the Ray and TransferQueue consumers do).

Medians over ``--rounds`` x 64 groups; not a test, timing decides nothing.

    .venv/bin/python bench/breakdown_client.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import pyarrow.flight as flight
from bench_flight_server import bare_server  # type: ignore[import-not-found]  # run as a script

from trajflight import LocalCluster
from trajflight.codec import decode
from trajflight.workload import make_workload


def main(argv: list[str] | None = None) -> int:
    """Print the medians of each step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    groups = make_workload(64, 8, seed=0)
    times: dict[str, list[float]] = {}

    def rec(key: str, seconds: float) -> None:
        times.setdefault(key, []).append(seconds)

    bare = bare_server()
    raw = flight.FlightClient(bare.location)
    try:
        for transport in ("auto", "flight"):
            with (
                LocalCluster(servers=1, capacity="8GiB") as cluster,
                cluster.client(transport=transport) as c,
            ):
                c.open_job("j", 1)
                writer, trainer = c.writer("j", 1), c.trainer("j", ttl=120)
                for r in range(args.rounds + 1):
                    for g in groups:
                        t0 = time.perf_counter()
                        batch = g.encode("j", 1)
                        t1 = time.perf_counter()
                        writer.put(batch)
                        t2 = time.perf_counter()
                        lease = trainer.lease(1, wait=10, renew=False)
                        t3 = time.perf_counter()
                        table = lease.fetch_table()
                        t4 = time.perf_counter()
                        decode(table)
                        t5 = time.perf_counter()
                        lease.commit()
                        if transport == "auto":
                            descriptor = flight.FlightDescriptor.for_path("b", str(r), str(g.group_id))
                            t6 = time.perf_counter()
                            w, _ = raw.do_put(descriptor, batch.schema)
                            w.write_batch(batch)
                            w.close()
                            rec("bare Flight do_put (same batch)", time.perf_counter() - t6)
                        if r:
                            rec("encode (numpy -> record batch)", t1 - t0)
                            rec(f"[{transport}] Writer.put", t2 - t1)
                            rec(f"[{transport}] Trainer.lease(1)", t3 - t2)
                            rec(f"[{transport}] LeasedBatch.fetch_table", t4 - t3)
                            rec(f"[{transport}] decode to torch (jagged)", t5 - t4)
                    list(raw.do_action(flight.Action("clear", b"")))
    finally:
        raw.close()
        bare.stop()
    _segments(groups, rec, args.rounds)
    _padding(groups, rec, args.rounds)
    for key, values in sorted(times.items()):
        print(f"{key:58s} median {statistics.median(values) * 1e3:7.3f} ms  (n={len(values)})")
    return 0


def _segments(groups: list[Any], rec: Callable[[str, float], None], rounds: int) -> None:
    columns = ["response_ids", "response_logprobs"]
    with LocalCluster(servers=2, capacity="8GiB") as cluster, cluster.client() as c:
        c.open_job("j", 1)
        writer, trainer = c.writer("j", 1), c.trainer("j", ttl=120)
        for how in ("put", "put_many"):
            if how == "put":
                for g in groups:
                    writer.put(g.encode("j", 1))
            else:
                writer.put_many([g.encode("j", 1) for g in groups])
            lease = trainer.lease(len(groups), wait=10, renew=False)
            lease.fetch_table(columns)
            for _ in range(rounds * 4):
                t0 = time.perf_counter()
                lease.fetch_table(columns)
                rec(f"[auto] fetch_table 64 groups, 2 cols, stored by {how}", time.perf_counter() - t0)
            lease.commit()
            cluster.wait_idle("j", 30)


def _padding(groups: list[Any], rec: Callable[[str, float], None], rounds: int) -> None:
    import pyarrow as pa

    table = pa.Table.from_batches([g.encode("j", 1) for g in groups]).combine_chunks()
    columns = ["prompt_ids", "response_ids", "response_logprobs", "loss_mask", "reward", "advantage"]
    for _ in range(rounds * 2):
        t0 = time.perf_counter()
        decode(table, columns=columns, layout="padded")
        t1 = time.perf_counter()
        jagged = decode(table, columns=columns, layout="jagged")
        {k: v.to_padded_tensor(0) if v.is_nested else v for k, v in jagged.tensors.items()}
        t2 = time.perf_counter()
        rec("padding 64 groups: decode(layout='padded')", t1 - t0)
        rec("padding 64 groups: jagged decode + to_padded_tensor", t2 - t1)


if __name__ == "__main__":
    sys.exit(main())
