"""Where the time of one group goes in trajflight's public client, step by step, next to a bare Flight put.

For each transport (``auto``: shared memory on this host; ``flight``), against ``LocalCluster(servers=1)``:

* put path, per group: ``SyntheticGroup.encode``, then ``Writer.put`` (allocate + store + publish),
  next to a bare ``pyarrow.flight`` ``do_put`` of the same batch to the bare server of
  ``bench_flight_server.py``;
* the small-group round trip: ``Writer.put``, ``Trainer.lease(1)`` (acquire + the fence on the server),
  ``LeasedBatch.fetch_table``, ``decode`` to torch.

Medians over ``--rounds`` x 64 groups; not a test, timing decides nothing.

    .venv/bin/python bench/breakdown_client.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

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
    for key, values in sorted(times.items()):
        print(f"{key:42s} median {statistics.median(values) * 1e3:7.3f} ms  (n={len(values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
