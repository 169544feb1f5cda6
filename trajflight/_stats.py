"""``trajflight stats ADDRESS``: counters of a running data plane.

Shows the controller host's counters (groups published, bytes, leases granted, commits, ...), group
counts per state of a job when ``--job`` is given, and every storage server's holdings.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``stats``."""
    parser.add_argument("address", help="the data plane's address (grpc://HOST:PORT or ray://NAMESPACE/NAME)")
    parser.add_argument("--job", default=None, help="also show this job's group counts and usage")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--timeout", type=float, default=10.0, help="deadline of each call, seconds")


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(getattr(value, k)) for k in value.__dataclass_fields__}
    return value


def run(args: argparse.Namespace) -> int:
    """Print the stats; returns 0, or 2 when the data plane cannot be reached."""
    import trajflight
    from trajflight.errors import TrajflightError

    try:
        with trajflight.connect(args.address, timeout=args.timeout) as client:
            stats = _plain(client.stats(args.job))
    except TrajflightError as exc:
        print(f"trajflight stats: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(stats, indent=2, default=str))
        return 0
    print(f"data plane {stats['address']}")
    controller = stats.get("controller", {})
    for key, value in sorted(controller.get("counters", {}).items()):
        print(f"  {key:<22} {value}")
    if "counts" in stats:
        nonzero = {k: v for k, v in stats["counts"].items() if v}
        print(f"job {args.job}: " + ", ".join(f"{k}={v}" for k, v in nonzero.items()))
        print(f"  holds {stats['usage_bytes']} bytes in {stats['usage_groups']} groups")
    for server_id, s in sorted(stats.get("servers", {}).items()):
        print(
            f"server {server_id}: " + ", ".join(f"{k}={v}" for k, v in s.items() if not isinstance(v, dict))
        )
    return 0
