"""``trajflight export SOURCE OUT.parquet``: a one-off dump of live (or archived) groups to one Parquet file.

The rows are read as ``trajflight.analytics.scan`` reads them (tokenless: no lease taken or changed) and
streamed into ``OUT`` batch by batch (zstd), written under a temporary name and renamed, so that ``OUT``
is either complete or absent. ``--derived`` adds the derived columns. Errors print one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from trajflight.analytics._sql import add_source_arguments, columns_of

__all__ = ["add_arguments", "export", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``export``."""
    parser.add_argument(
        "source", help="a data plane address (grpc://HOST:PORT, ray://NS/NAME) or an archive location"
    )
    parser.add_argument("out", help="the Parquet file to write (replaced if it exists)")
    add_source_arguments(parser)
    parser.add_argument("--derived", action="store_true", help="also write the derived columns")


def export(source: str, out: str, args: argparse.Namespace) -> int:
    """Write the scanned rows of ``source`` to ``out`` (zstd Parquet) atomically; returns the row count.

    Raises:
        TrajflightError: the source could not be read (typed). OSError: ``out`` could not be written
        (nothing is left at ``out``; the temporary file is removed).
    """
    import pyarrow.parquet as pq

    from trajflight.analytics._scan import scan

    rows = scan(
        source,
        job=args.job,
        epochs=args.epoch,
        columns=columns_of(args.columns),
        derived=bool(args.derived),
        timeout=args.timeout,
    )
    schema = rows.schema
    tmp = os.path.join(os.path.dirname(os.path.abspath(out)), f".{os.path.basename(out)}.{os.getpid()}.tmp")
    count = 0
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for batch in rows.to_batches():
                writer.write_batch(batch)
                count += batch.num_rows
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return count


def run(args: argparse.Namespace) -> int:
    """Export and print one line; returns 0, or 2 with one line on stderr."""
    from trajflight.errors import TrajflightError

    try:
        count = export(args.source, args.out, args)
    except TrajflightError as exc:
        print(f"trajflight export: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"trajflight export: cannot write {args.out}: {exc}", file=sys.stderr)
        return 2
    print(f"trajflight export: wrote {count} rows to {args.out}")
    return 0
