"""``trajflight sql SOURCE "SELECT ..."``: DuckDB over a ``trajectories`` view of live and archived groups.

The view holds the scanned rows with the derived columns (``prompt_length``, ``response_length``,
``tokens``, ``mean_logprob``, ``top_p_entropy``; ``--no-derived`` leaves them out). The rows are read
once, before the query runs, and only the columns the query needs (found by binding it, unrun, against
empty views; the derived columns' inputs are read for them); ``--columns`` limits the view further.
``--also SOURCE`` adds sources (live and archived groups in one view). Errors (bad SQL, an unreachable
source, a missing archive) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import csv
import decimal
import json
import sys
from typing import Any

__all__ = ["add_arguments", "add_source_arguments", "run"]


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every analytics command shares: which job, epochs and columns to read."""
    parser.add_argument("--job", default=None, help="only this job's groups")
    parser.add_argument(
        "--epoch", type=int, action="append", default=None, help="only this epoch (repeat for several)"
    )
    parser.add_argument(
        "--columns", default=None, help="comma-separated columns to read (default: all stored columns)"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="deadline of each data plane call, s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``sql``."""
    parser.add_argument(
        "source",
        help="a data plane address (grpc://HOST:PORT, ray://NS/NAME: its live groups) or an archive (a "
        "directory or pyarrow.fs URI of job_id=<job>/epoch=<n>/ Parquet files)",
    )
    parser.add_argument("query", help='the SQL, over the view "trajectories" (DuckDB dialect)')
    parser.add_argument(
        "--also",
        metavar="SOURCE",
        action="append",
        default=[],
        help="another source read into the same view (repeat; a group both live and archived counts once)",
    )
    add_source_arguments(parser)
    parser.add_argument("--no-derived", action="store_true", help="leave the derived columns out of the view")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--csv", action="store_true", help="print CSV (nested values as text)")
    out.add_argument("--json", action="store_true", help="print a JSON array of row objects")
    out.add_argument("--parquet", metavar="OUT", default=None, help="write the result to OUT (Parquet, zstd)")
    parser.add_argument("--max-rows", type=int, default=40, help="rows the table shows (default 40)")


def columns_of(text: str | None) -> list[str] | None:
    """``--columns`` as a list (None: all)."""
    if text is None:
        return None
    return [c.strip() for c in text.split(",") if c.strip()]


def _jsonable(value: Any) -> Any:
    # DuckDB sums integers into HUGEINT, which reaches Arrow as decimal128(38, 0).
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def _print(table: Any, args: argparse.Namespace, relation: Any) -> None:
    if args.json:
        print(json.dumps(table.to_pylist(), default=_jsonable))
    elif args.csv:
        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow(table.schema.names)
        for row in table.to_pylist():
            out.writerow([_csv_value(v) for v in row.values()])
    else:
        print(relation.limit(args.max_rows))
        if table.num_rows > args.max_rows:
            print(f"({table.num_rows} rows; showing {args.max_rows}: --max-rows, --csv, --json or --parquet)")


def _csv_value(value: Any) -> Any:
    if isinstance(value, list | dict):
        return json.dumps(value, default=_jsonable)
    return "" if value is None else value


def query(sources: list[str], sql: str, args: argparse.Namespace) -> tuple[Any, Any]:
    """Run ``sql`` over the ``trajectories`` view of ``sources``; returns ``(table, relation)``.

    Raises:
        TrajflightError: a source could not be read (typed); InvalidRequestError: DuckDB refused the query.
    """
    from trajflight.analytics._deps import arrow_table, require
    from trajflight.analytics._scan import scan
    from trajflight.errors import InvalidRequestError

    duckdb = require("duckdb")
    view = scan(
        sources,
        job=args.job,
        epochs=args.epoch,
        columns=columns_of(args.columns),
        derived=not args.no_derived,
        timeout=args.timeout,
    )
    try:
        needed = needed_columns(duckdb, sql, view.schema)
    except duckdb.Error as exc:
        raise _refused(exc) from exc
    rows = view.select(needed).to_table()
    con = duckdb.connect()
    con.register("trajectories", rows)
    try:
        relation = con.sql(sql)
        if relation is None:
            raise InvalidRequestError("the query returned no result: give a SELECT (or another query)")
        table = arrow_table(relation)
    except duckdb.Error as exc:
        raise _refused(exc) from exc
    return table, con.from_arrow(table)


def _refused(exc: Exception) -> Exception:
    from trajflight.errors import InvalidRequestError

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return InvalidRequestError(f"DuckDB refused the query: {first[:300]}")


def needed_columns(duckdb: Any, sql: str, schema: Any) -> list[str]:
    """The columns of the ``trajectories`` view (of ``schema``) that ``sql`` needs, in schema order.

    DuckDB binds a SELECT without running it, so the query is bound against empty views: a column is
    needed when the query no longer binds, or binds to other result columns, without it. A query that
    is not one SELECT (it would run at binding) needs every column. A query that needs none (``count(*)``)
    gets one small column, for the row count.

    Raises:
        duckdb.Error: the query does not parse or bind against the full view.
    """
    names = list(schema.names)
    con = duckdb.connect()
    statements = con.extract_statements(sql)
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        return names
    empty = schema.empty_table()

    def bound(table: Any) -> tuple[Any, ...] | None:
        con.register("trajectories", table)
        try:
            relation = con.sql(sql)
        except duckdb.Error:
            return None
        return None if relation is None else (tuple(relation.columns), tuple(map(str, relation.types)))

    con.register("trajectories", empty)
    relation = con.sql(sql)  # raises what the query gets wrong against the full view
    if relation is None:
        return names
    full = (tuple(relation.columns), tuple(map(str, relation.types)))
    needed = [n for i, n in enumerate(names) if bound(empty.remove_column(i)) != full]
    if needed:
        return needed
    return ["group_id"] if "group_id" in names else names[:1]


def run(args: argparse.Namespace) -> int:
    """Run the query and print (or write) its result; returns 0, or 2 with one line on stderr."""
    from trajflight.errors import TrajflightError

    try:
        table, relation = query([args.source, *args.also], args.query, args)
        if args.parquet is not None:
            import pyarrow.parquet as pq

            try:
                pq.write_table(table, args.parquet, compression="zstd")
            except OSError as exc:
                print(f"trajflight sql: cannot write {args.parquet}: {exc}", file=sys.stderr)
                return 2
            print(f"trajflight sql: wrote {table.num_rows} rows to {args.parquet}")
        else:
            _print(table, args, relation)
    except TrajflightError as exc:
        print(f"trajflight sql: {exc}", file=sys.stderr)
        return 2
    return 0
