"""Parquet writer options on one archive file's table (issue 17): which are cheaper, at what size.

The table is what the archive writes in one file: the standard workload (``trajflight.workload``, 64
groups x 8 samples a round, two user columns) encoded as a storage server holds it, cut like the archive
cuts a file (about ``Archive.max_bytes`` = 64 MiB of Arrow data), with the archive's lease-fact columns.
Each variant writes it to memory with ``pyarrow.parquet.write_table`` (zstd always: the issue requires
it; one uncompressed row shows the floor), variants taken in turn within each repeat so that all see the
same load; the figure is the writing thread's CPU time (the machine is shared: wall time is printed too),
median [min..max] of the repeats, and Arrow GB/s, beside the file's size. Every variant's file
is read back by DuckDB and Polars once (untimed) and must give the same row count.

Usage::

    python bench/bench_archive_parquet.py [--repeats 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trajflight._archive import ZSTD_LEVEL, _dictionary_columns, _facts, parquet_options
from trajflight.bench._system import user_columns
from trajflight.codec import encode_groups
from trajflight.controller import DeleteWork
from trajflight.keys import Partition
from trajflight.workload import make_workload

MAX_BYTES = 64 << 20


def archive_table(max_bytes: int = MAX_BYTES, seed: int = 0) -> pa.Table:
    """One archive file's table: stored groups of the standard workload up to ``max_bytes``, with the
    lease facts."""
    batches: list[pa.RecordBatch] = []
    size, first = 0, 0
    while size < max_bytes:
        groups = make_workload(64, 8, seed=seed + first, first_group_id=first)
        encoded = encode_groups(
            job_id="bench",
            epoch=1,
            groups=[{**g.columns(extra=user_columns(g)), "group_id": g.group_id} for g in groups],
        )
        for i in range(len(groups)):
            batch = encoded[i]
            if batches and size + batch.nbytes > max_bytes:
                size = max_bytes
                break
            batches.append(batch)
            size += batch.nbytes
        first += len(groups)
    table = pa.Table.from_batches(batches)
    work = {
        Partition("bench", 1, g): DeleteWork(
            Partition("bench", 1, g), "s0", "grpc://s0", 1, 1, None, "committed", 1.5, "trainer-0", 3
        )
        for g in set(table.column("group_id").to_pylist())
    }
    for name, column in _facts(table, work).items():
        table = table.append_column(name, column)
    return table


def _scalar_columns(table: pa.Table) -> list[str]:
    """Leaf paths of the top-level non-nested columns (statistics worth keeping: keys, reward...)."""
    return [f.name for f in table.schema if not pa.types.is_nested(f.type)]


def _list_leaves(table: pa.Table) -> list[str]:
    """Parquet leaf paths of the values of top-level ``list<int32 | float32>`` columns."""
    return [
        f"{f.name}.list.element"
        for f in table.schema
        if pa.types.is_list(f.type) and f.type.value_type in (pa.int32(), pa.float32())
    ]


CURRENT = "main's (zstd 1, dictionary for strings)"


def variants(table: pa.Table) -> dict[str, dict[str, Any]]:
    """Writer options by name; :data:`CURRENT` is what main's archive writes."""
    strings = _dictionary_columns(table.schema)
    base: dict[str, Any] = {
        "compression": "zstd",
        "compression_level": ZSTD_LEVEL,
        "use_dictionary": strings,
    }
    return {
        CURRENT: base,
        "write_statistics=False": {**base, "write_statistics": False},
        "statistics for scalar columns only": {**base, "write_statistics": _scalar_columns(table)},
        "write_page_index=True": {**base, "write_page_index": True},
        'data_page_version="2.0"': {**base, "data_page_version": "2.0"},
        "use_dictionary=True (all columns)": {**base, "use_dictionary": True},
        "use_dictionary=False (no column)": {**base, "use_dictionary": False},
        "zstd level 3": {**base, "compression_level": 3},
        "zstd level -1": {**base, "compression_level": -1},
        "byte_stream_split for the list values": {**base, "use_byte_stream_split": _list_leaves(table)},
        "data_page_size=8 MiB": {**base, "data_page_size": 8 << 20},
        "uncompressed (a floor only: zstd is required)": {"compression": "none", "use_dictionary": strings},
        "adopted (trajflight._archive.parquet_options)": parquet_options(table.schema),
    }


def _write(table: pa.Table, options: dict[str, Any]) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **options)
    return sink.getvalue()


def _readable(data: pa.Buffer, rows: int, folder: str) -> None:
    """DuckDB and Polars read the file's rows (untimed)."""
    import duckdb
    import polars as pl

    path = os.path.join(folder, "check.parquet")
    with open(path, "wb") as f:
        f.write(data)
    got = duckdb.sql(f"SELECT count(*), sum(len(response_ids)) FROM read_parquet('{path}')").fetchall()
    if got[0][0] != rows:
        raise RuntimeError(f"DuckDB read {got} rows, expected {rows}")
    if pl.read_parquet(path, columns=["group_id", "response_ids"]).height != rows:
        raise RuntimeError("Polars read a different row count")


def measure(table: pa.Table, repeats: int) -> dict[str, Any]:
    """CPU and wall seconds per variant (``repeats``, after one untimed write each, which also checks
    the file with DuckDB and Polars) and the file sizes. Each repeat starts the round of variants one
    further along, so that no variant always follows the same one."""
    opts = variants(table)
    cpu: dict[str, list[float]] = {name: [] for name in opts}
    wall: dict[str, list[float]] = {name: [] for name in opts}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="trajflight-parquet-bench-") as folder:
        for name, o in opts.items():
            data = _write(table, o)
            sizes[name] = data.size
            _readable(data, table.num_rows, folder)
    names = list(opts)
    for rep in range(repeats):
        turn = rep % len(names)
        for name in names[turn:] + names[:turn]:
            start, used = time.perf_counter(), time.thread_time()
            _write(table, opts[name])
            cpu[name].append(time.thread_time() - used)
            wall[name].append(time.perf_counter() - start)
    return {"cpu_s": cpu, "wall_s": wall, "sizes": sizes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    table = archive_table()
    groups = len(set(table.column("group_id").to_pylist()))
    got = measure(table, args.repeats)
    after = os.getloadavg()
    gb = table.nbytes / 1e9
    print(
        f"one archive file: {groups} groups, {table.num_rows} rows, {table.nbytes / 1e6:.1f} MB of Arrow; "
        f"{args.repeats} repeats; load average before {load[0]:.2f}, after {after[0]:.2f}"
    )
    ref = statistics.median(got["cpu_s"][CURRENT])
    print("| options | CPU s, median [min..max] | Arrow GB/s (CPU) | x main's | wall s, median | MB |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, ts in got["cpu_s"].items():
        med = statistics.median(ts)
        print(
            f"| {name} | {med:.3f} [{min(ts):.3f}..{max(ts):.3f}] | {gb / med:.3f} | {med / ref:.2f} | "
            f"{statistics.median(got['wall_s'][name]):.3f} | {got['sizes'][name] / 1e6:.1f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load": [load, after], "rows": table.num_rows, "arrow_bytes": table.nbytes, **got}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
