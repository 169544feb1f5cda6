"""The ``trajflight`` command line.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
this module only dispatches, so ``trajflight --help`` imports no heavy dependency.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("trajflight.demo", "the main job: a small GRPO run that learns, on the embedded data plane"),
    "example": ("trajflight._example", "encode a synthetic GRPO group, decode it to torch, print a summary"),
    "server": ("trajflight.flight_server._cli", "run one storage server on loopback"),
    "bench": ("trajflight.bench._cli", "benchmark trajflight against TransferQueue, Ray and bare Flight"),
    "stats": ("trajflight._stats", "show the counters of a running data plane"),
    "up": ("trajflight._up", "start a standing embedded data plane and print how to connect"),
    "token": ("trajflight._token", "mint a credential for a plane with a deployment secret"),
    "sql": (
        "trajflight.analytics._sql",
        "run DuckDB SQL over a trajectories view of live and archived groups",
    ),
    "export": ("trajflight.analytics._export", "dump live (or archived) groups to one Parquet file"),
    "report": ("trajflight.analytics._report", "draw an HTML report of plots over live or archived groups"),
}


def build_parser() -> argparse.ArgumentParser:
    """Return the parser with every registered subcommand."""
    from trajflight import __version__

    parser = argparse.ArgumentParser(
        prog="trajflight",
        description="trajflight: RL post-training trajectories as Arrow, over Flight, under fenced leases.",
    )
    parser.add_argument("--version", action="version", version=f"trajflight {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trajflight`` console script; returns the process exit status."""
    args = build_parser().parse_args(argv)
    status: int = importlib.import_module(args._module).run(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
