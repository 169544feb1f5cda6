"""``Writer.put_many`` over Flight, and the storage server's work per ``put_many``, for one tree at a time.

Runs against whichever ``trajflight`` is first on the path, so the same script measures two trees laid
out as installed (``PYTHONPATH=<layout>``, see BENCHMARKS.md) alternately (ABBA). The standard workload
(64 x 8) with its two user columns, given as columns:

* ``put_many``: on ``LocalCluster(servers=S, capacity="8GiB", processes=True)`` with
  ``client(transport="flight")``, 3 warm-up and ``--rounds`` timed ``put_many`` of the 64 groups, each
  followed (untimed) by a lease of them, a fetch and a commit; the median of the rounds;
* ``server``: in this process, the storage server's steps after a ``put_many`` stream arrived, on the
  batches read back from one IPC stream, with a shared-memory arena as ``LocalCluster`` gives every
  server: admission, validation, placement and publication, as this tree's ``StorageServer`` runs them
  (one ``begin_puts`` and one ``validate_groups`` where the tree has them, else a ``begin_put`` and a
  ``validate_group`` per group); the median of the rounds.

    python bench/bench_flight_put_many.py [--servers 1] [--rounds 15] [--server-rounds 20]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

import trajflight
from trajflight import codec
from trajflight.bench._system import user_columns
from trajflight.flight_server._store import GroupStore, StoreLimits
from trajflight.flight_server._wire import GroupRead, LeaseToken
from trajflight.flight_server.shm._arena import ShmArena
from trajflight.keys import Partition
from trajflight.workload import SyntheticGroup, make_workload


def put_many(groups: list[SyntheticGroup], servers: int, rounds: int) -> float:
    """Median seconds of ``Writer.put_many`` of ``groups`` over Flight (see the module docstring)."""
    columns = [g.columns(extra=user_columns(g)) for g in groups]
    times: list[float] = []
    with (
        trajflight.LocalCluster(servers=servers, capacity="8GiB", processes=True) as cluster,
        cluster.client(transport="flight") as client,
    ):
        client.open_job("fpm", 1)
        writer, trainer = client.writer("fpm", 1), client.trainer("fpm")
        for i in range(rounds + 3):
            start = time.perf_counter()
            writer.put_many(columns)
            if i >= 3:
                times.append(time.perf_counter() - start)
            batch = trainer.lease(max_groups=len(groups))
            batch.fetch()
            batch.commit()
    return statistics.median(times)


def _stream(groups: list[SyntheticGroup], first: int) -> tuple[list[Partition], list[pa.RecordBatch]]:
    """The groups under group ids from ``first``, as a server reads a put_many stream of them."""
    ids = range(first, first + len(groups))
    columns = [{**g.columns(extra=user_columns(g)), "group_id": i} for g, i in zip(groups, ids, strict=True)]
    encoded = codec.encode_groups(job_id="fpm", epoch=1, groups=columns)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, encoded.joined.schema) as stream:
        for batch in encoded:
            stream.write_batch(batch)
    return [Partition("fpm", 1, i) for i in ids], list(ipc.open_stream(sink.getvalue()))


def _publish(store: GroupStore, keys: list[Partition], batches: list[pa.RecordBatch]) -> None:
    """What this tree's ``StorageServer._put_many`` does once the stream arrived."""
    schema, sizes = batches[0].schema, [ipc.get_record_batch_size(b) for b in batches]
    rows = [b.num_rows for b in batches]
    with contextlib.ExitStack() as stack:
        if hasattr(codec, "validate_groups"):
            reservations = store.begin_puts(keys, sizes, schema)
            for res in reservations:
                stack.callback(res.release)
        else:  # the tree before one admission and one validation per stream
            admit = store.begin_put
            reservations = [
                stack.enter_context(admit(k, schema, n)) for k, n in zip(keys, sizes, strict=True)
            ]
        for res, batch in zip(reservations, batches, strict=True):
            res.grow(batch.get_total_buffer_size())
        if hasattr(codec, "validate_groups"):
            codec.validate_groups(pa.Table.from_batches(batches, schema), store.schema, keys, rows)
        else:
            for key, batch in zip(keys, batches, strict=True):
                codec.validate_group(batch, store.schema, expect=key, full=True)
        store.publish_many([(res, [b]) for res, b in zip(reservations, batches, strict=True)], schema, "w")


def server(groups: list[SyntheticGroup], rounds: int) -> float:
    """Median seconds of the server's work per put_many after its stream arrived (module docstring)."""
    arena = ShmArena()
    store = GroupStore(StoreLimits(), arena=arena)
    times: list[float] = []
    try:
        for i in range(rounds + 5):
            keys, batches = _stream(groups, 1000 * i)
            start = time.perf_counter()
            _publish(store, keys, batches)
            if i >= 5:
                times.append(time.perf_counter() - start)
            store.delete([GroupRead(key, LeaseToken(1)) for key in keys])
    finally:
        arena.close()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both figures and print them as JSON (milliseconds)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--server-rounds", type=int, default=20)
    args = parser.parse_args(argv)
    groups = make_workload(64, 8, seed=0)
    out = {
        "tree": trajflight.__file__,
        "servers": args.servers,
        "put_many_ms": put_many(groups, args.servers, args.rounds) * 1e3,
        "server_ms": server(groups, args.server_rounds) * 1e3,
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
