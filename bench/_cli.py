"""``trajflight bench``: trajflight side by side with TransferQueue, Ray and bare Flight, on the standard
GRPO workload (G=64 groups of K=8 samples, lognormal response lengths around 1024 tokens, seed 0: see
``trajflight.workload``; two user columns carried with ``extra=``), with memcpy, the raw shared-memory
ceiling and a bare Flight server as references in the same run. Each peer runs in its strongest ordinary
form (Ray: one object per batch; bare Flight: one stream of the batch), which ratios and targets compare
with, and in the weaker per-group form beside it (``ray-per-group``, ``flight-per-group``).

Prints a table (within 110 columns) and writes nothing unless asked: ``--out DIR`` writes the JSON
result (schema: ``trajflight bench --schema``), a PNG chart and Markdown tables into ``DIR``; ``--json``,
``--chart`` and ``--markdown`` name single files. ``--check`` exits 1 when a performance target is
missed (a ``--quick`` run is too small to judge them)::

    trajflight bench                      # G=64 K=8, 7 rounds, every system installed
    trajflight bench --quick              # CI: tiny data, 2 rounds, seconds; a smoke test
    trajflight bench --out results --check
    trajflight bench --systems trajflight,flight,memcpy --repeats 15 --json out.json --chart out.png

Missing optional peers are skipped with their install hint. Importing this module is cheap (argparse
only): ``trajflight --help`` builds every subcommand's parser.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trajflight import logs

from ._names import SYSTEMS

__all__ = ["add_arguments", "run"]


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
    parser.add_argument(
        "--handoff-iters", type=int, help="cross-process handoffs per system (default 100; quick 5)"
    )
    parser.add_argument("--controller-groups", type=int, help="groups per controller run (default 20000)")
    parser.add_argument(
        "--systems", type=_systems, default=SYSTEMS, help=f"comma-separated subset of {','.join(SYSTEMS)}"
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="write trajflight-bench.json, .png and .md into DIR (created); default: write nothing",
    )
    parser.add_argument("--json", metavar="PATH", help="write the result JSON to PATH")
    parser.add_argument("--chart", metavar="PATH", help="draw the PNG chart to PATH (needs matplotlib)")
    parser.add_argument("--no-chart", action="store_true", help="with --out: do not draw the chart")
    parser.add_argument("--markdown", metavar="PATH", help="write the summary as Markdown tables to PATH")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a performance target is missed (not with --quick)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--schema", action="store_true", help="print the result's JSON Schema and exit")
    logs.add_arguments(parser)


def _outputs(args: argparse.Namespace) -> tuple[str | None, str | None, str | None]:
    """Where the JSON, the chart and the Markdown go: ``--out DIR``'s files, or the files named."""
    json_path, chart, markdown = args.json, args.chart, args.markdown
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        json_path = json_path or str(out / "trajflight-bench.json")
        chart = chart or (None if args.no_chart else str(out / "trajflight-bench.png"))
        markdown = markdown or str(out / "trajflight-bench.md")
    return json_path, chart, markdown


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args``: 0 on success; 1 when trajflight itself failed, or under
    ``--check`` when a target was missed; 2 on bad options."""
    from trajflight.errors import ConfigError

    from ._schema import SCHEMA

    try:
        logs.setup_from_args(args)
    except ConfigError as exc:
        print(f"trajflight bench: {exc}", file=sys.stderr)
        return 2
    if args.schema:
        print(json.dumps(SCHEMA, indent=2))
        return 0
    if args.check and args.quick:
        print(
            "trajflight bench: --check judges the performance targets and --quick is too small to; "
            "drop one of them",
            file=sys.stderr,
        )
        return 2
    json_path, chart, markdown = _outputs(args)
    from ._report import add_ratios_and_targets, draw_chart, format_markdown, format_table, missed_targets
    from ._run import BenchConfig, run_bench
    from ._schema import validate_complete
    from ._stats import Progress

    overrides = {
        "groups": args.groups,
        "samples": args.samples,
        "response_median": args.response_median,
        "repeats": args.repeats,
        "latency_iters": args.latency_iters,
        "handoff_iters": args.handoff_iters,
        "controller_groups": args.controller_groups,
    }
    given = {k: v for k, v in overrides.items() if v is not None}
    given |= {"seed": args.seed, "systems": tuple(args.systems)}
    cfg = BenchConfig.quick_config(**given) if args.quick else BenchConfig(**given)
    doc = add_ratios_and_targets(run_bench(cfg, Progress(enabled=not args.quiet)))
    validate_complete(doc)
    print(format_table(doc))
    if json_path:
        Path(json_path).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\nresult: {json_path}")
    if markdown:
        Path(markdown).write_text(format_markdown(doc) + "\n")
        print(f"markdown: {markdown}")
    if chart:
        why_not = draw_chart(doc, chart)
        print(why_not if why_not else f"chart: {chart}", file=sys.stderr if why_not else sys.stdout)
    ours = doc["systems"].get("trajflight")
    if ours is not None and ours["status"] == "failed":
        return 1
    missed = missed_targets(doc)
    if args.check and missed:
        print(f"trajflight bench: {len(missed)} performance targets missed (--check)", file=sys.stderr)
        return 1
    return 0
