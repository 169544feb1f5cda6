"""``trajflight stats ADDRESS``: counters of a running data plane.

Shows the controller host's counters (groups published, bytes, leases granted, commits, ...), group
counts per state of a job when ``--job`` is given, and every storage server's holdings.

Two byte counts appear, and they measure different things:

* **charged** (the controller: ``bytes_published``, a job's usage): the size each writer announced for
  its group, the Arrow buffers of its record batch as encoded under its partition. Capacity is charged
  this from publication until the delete is confirmed; between allocation and publication, a bound of
  it computed from the writer's inputs, which publication trims.
* **held** (a storage server's ``bytes``, and each group's FlightInfo ``total_bytes``): the memory the
  server keeps for the group, its Arrow IPC stream (schema message, record batch framing and padding)
  in the server's shared-memory arena or received buffers. For small groups the framing dominates, so
  held bytes exceed charged bytes several times over.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_arguments", "collect", "format_table", "run"]


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


class StatsError(Exception):
    """Which part of the data plane could not be read, in a sentence for the user."""


def collect(client: Any, address: str, job: str | None) -> dict[str, Any]:
    """The stats of the data plane ``client`` is connected to (the JSON ``--json`` prints).

    Raises:
        StatsError: the controller or a storage server could not be reached, saying which.
    """
    from trajflight.errors import DeadlineExceededError, TrajflightError, UnavailableError

    out: dict[str, Any] = {"address": address}
    try:
        info = getattr(client.controller.transport, "info", None)
        if info is not None:
            out["controller"] = info(client.timeout)
        servers = client.controller.servers()
        if job is not None:
            out["counts"] = client.controller.counts(job)
            out["usage_bytes"], out["usage_groups"] = client.controller.usage(job)
    except (UnavailableError, DeadlineExceededError) as exc:
        raise StatsError(
            f"the controller at {address} could not be reached ({type(exc).__name__}); check that the "
            "data plane runs (`trajflight up` prints its address) and that the address is right"
        ) from exc
    except TrajflightError as exc:
        raise StatsError(f"the controller at {address} refused: {exc}") from exc
    out["servers"] = {}
    for server in servers:
        try:
            out["servers"][server.server_id] = client.storage.client(server.location).stats()
        except TrajflightError as exc:
            raise StatsError(
                f"storage server {server.server_id} at {server.location} could not be read "
                f"({type(exc).__name__}: {str(exc)[:200]})"
            ) from exc
    out["server_locations"] = {s.server_id: s.location for s in servers}
    return _plain(out)  # type: ignore[no-any-return]


def format_table(stats: dict[str, Any], job: str | None) -> str:
    """The human-readable form of :func:`collect`'s result (within 100 columns), every byte count
    labelled by what it counts."""
    lines = [f"data plane {stats['address']}"]
    counters = stats.get("controller", {}).get("counters", {})
    if counters:
        lines.append("controller counters (bytes: the sizes writers announced, their groups' Arrow buffers)")
        for key, value in sorted(counters.items()):
            lines.append(f"  {key:<22} {value}")
    archive = stats.get("controller", {}).get("archive")
    if archive:
        lines.extend(_archive_lines(archive))
    if "counts" in stats:
        nonzero = {k: v for k, v in stats["counts"].items() if v}
        lines.append(f"job {job}: " + (", ".join(f"{k}={v}" for k, v in nonzero.items()) or "no groups"))
        lines.append(
            f"  capacity charged: {stats['usage_bytes']} bytes, {stats['usage_groups']} groups "
            "(announced sizes, until deletes are confirmed)"
        )
    servers = stats.get("servers", {})
    if servers:
        lines.append("storage servers (bytes held: each group's Arrow IPC stream, as its FlightInfo says)")
    for server_id, s in sorted(servers.items()):
        lines.append(f"  {server_id} {stats.get('server_locations', {}).get(server_id, '')}")
        lines.append(
            f"    {s.get('groups', 0)} groups, {s.get('bytes', 0)} bytes held, "
            f"{s.get('reserved_bytes', 0)} reserved, {s.get('free_bytes', 0)} free; "
            f"read {s.get('groups_read', 0)} groups ({s.get('bytes_read', 0)} bytes)"
        )
    return "\n".join(lines)


def _archive_lines(archive: dict[str, Any]) -> list[str]:
    """The archive's part of the table: what it wrote, what waits, and its last error (what to do)."""
    lines = [
        f"archive {archive.get('location', '')}: {archive.get('files', 0)} files, "
        f"{archive.get('groups', 0)} groups, {archive.get('rows', 0)} rows, {archive.get('bytes', 0)} bytes; "
        f"{archive.get('pending', 0)} waiting, {archive.get('failures', 0)} failures"
    ]
    error = archive.get("error")
    if error:
        lines.append(f"  {error.get('type', 'ArchiveError')}: {error.get('message', '')}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Print the stats; returns 0, or 2 when the data plane cannot be reached."""
    import trajflight
    from trajflight.errors import TrajflightError

    try:
        with trajflight.connect(args.address, timeout=args.timeout) as client:
            stats = collect(client, args.address, args.job)
    except StatsError as exc:
        print(f"trajflight stats: {exc}", file=sys.stderr)
        return 2
    except TrajflightError as exc:
        print(f"trajflight stats: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(stats, indent=2, default=str))
        return 0
    print(format_table(stats, args.job))
    return 0
