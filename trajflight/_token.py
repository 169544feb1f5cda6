"""``trajflight token``: mint an operator credential from the deployment secret and print it.

The secret comes from ``--secret-file`` or ``TRAJFLIGHT_SECRET`` (never the command line). The token is
printed alone on stdout, so ``export TRAJFLIGHT_TOKEN=$(trajflight token --role trainer --job run-7)``
works; its claims (never the token) go to stderr. See ``docs/auth.md`` for the roles.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``token``."""
    parser.add_argument(
        "--role", required=True, choices=["writer", "trainer", "reader", "admin"], help="what it may do"
    )
    parser.add_argument(
        "--job",
        action="append",
        default=None,
        help="a job it may act on (repeat for several); default '*', every job",
    )
    parser.add_argument("--ttl", default="1h", help="how long it lives, e.g. 15m, 8h (default 1h)")
    parser.add_argument("--sub", default=None, help="who holds it, for logs (default: ROLE)")
    parser.add_argument(
        "--secret-file", default=None, help="file holding the secret (else TRAJFLIGHT_SECRET)"
    )


def run(args: argparse.Namespace) -> int:
    """Print one token; returns the exit status (2 without a usable secret)."""
    from trajflight.auth import ALL_JOBS, load_keyring
    from trajflight.errors import TrajflightError
    from trajflight.units import parse_duration

    try:
        keyring = load_keyring(args.secret_file)
        if keyring is None:
            print(
                "trajflight token: no deployment secret: pass --secret-file or set TRAJFLIGHT_SECRET (the "
                "one the plane runs with)",
                file=sys.stderr,
            )
            return 2
        jobs = args.job or [ALL_JOBS]
        ttl = parse_duration(args.ttl, setting="ttl")
        credential = keyring.mint(args.sub or args.role, args.role, jobs, ttl=ttl)
    except TrajflightError as exc:
        print(f"trajflight token: {exc}", file=sys.stderr)
        return 2
    print(credential.reveal(), flush=True)
    print(
        f"trajflight token: role {args.role} on jobs {', '.join(jobs)} for {ttl:g}s "
        f"(key {keyring.signing_kid})",
        file=sys.stderr,
    )
    return 0
