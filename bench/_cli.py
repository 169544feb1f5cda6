"""``trajflight bench``: trajflight side by side with TransferQueue, Ray and bare Flight, on the standard
GRPO workload (``BENCHMARK.md``), with memcpy and a bare Flight server as references in the same run.

Prints a table, writes the JSON result (schema: ``trajflight bench --schema``) and a PNG chart::

    trajflight bench                      # G=64 K=8, 7 rounds, every system installed
    trajflight bench --quick              # CI: tiny data, 2 rounds, seconds
    trajflight bench --systems trajflight,flight,memcpy --repeats 15 --json out.json --chart out.png

Missing optional peers are skipped with their install hint. Importing this module is cheap (argparse
only): ``trajflight --help`` builds every subcommand's parser.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["add_arguments", "run"]

SYSTEMS = ("memcpy", "flight", "trajflight", "trajflight-flight", "ray", "transferqueue")


def _systems(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown system(s) {unknown}; choose from {','.join(SYSTEMS)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options to ``parser``."""
    parser.add_argument("--quick", action="store_true", help="CI mode: tiny data, 2 rounds (seconds)")
    parser.add_argument("--groups", "-G", type=int, help="G, groups in the workload (default 64; quick 8)")
    parser.add_argument("--samples", "-K", type=int, help="K, samples per group (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument(
        "--response-median", type=float, help="median response tokens (default 1024; quick 64)"
    )
    parser.add_argument("--repeats", type=int, help="timed rounds after the warm-up (default 7; quick 2)")
    parser.add_argument("--latency-iters", type=int, help="small-group round trips per system (default 200)")
    parser.add_argument("--controller-groups", type=int, help="groups per controller run (default 20000)")
    parser.add_argument(
        "--systems", type=_systems, default=SYSTEMS, help=f"comma-separated subset of {','.join(SYSTEMS)}"
    )
    parser.add_argument("--json", default="trajflight-bench.json", help="where to write the result JSON")
    parser.add_argument("--chart", default="trajflight-bench.png", help="where to draw the PNG chart")
    parser.add_argument("--no-chart", action="store_true", help="do not draw the chart")
    parser.add_argument("--markdown", help="also write the summary as Markdown tables to this file")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--schema", action="store_true", help="print the result's JSON Schema and exit")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args``; 0 on success, 1 if trajflight itself failed."""
    from ._schema import SCHEMA

    if args.schema:
        print(json.dumps(SCHEMA, indent=2))
        return 0
    from ._report import add_ratios_and_targets, draw_chart, format_markdown, format_table
    from ._run import BenchConfig, run_bench
    from ._schema import validate_complete
    from ._stats import Progress

    overrides = {
        "groups": args.groups,
        "samples": args.samples,
        "response_median": args.response_median,
        "repeats": args.repeats,
        "latency_iters": args.latency_iters,
        "controller_groups": args.controller_groups,
    }
    given = {k: v for k, v in overrides.items() if v is not None}
    given |= {"seed": args.seed, "systems": tuple(args.systems)}
    cfg = BenchConfig.quick_config(**given) if args.quick else BenchConfig(**given)
    doc = add_ratios_and_targets(run_bench(cfg, Progress(enabled=not args.quiet)))
    validate_complete(doc)
    print(format_table(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\nresult: {args.json}")
    if args.markdown:
        Path(args.markdown).write_text(format_markdown(doc) + "\n")
        print(f"markdown: {args.markdown}")
    if not args.no_chart and args.chart:
        why_not = draw_chart(doc, args.chart)
        print(why_not if why_not else f"chart: {args.chart}", file=sys.stderr if why_not else sys.stdout)
    ours = doc["systems"].get("trajflight")
    return 1 if ours is not None and ours["status"] == "failed" else 0
