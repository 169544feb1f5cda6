"""A rollout worker of the fault suite, as its own process: puts groups with the public client.

Each attempt gets fresh sample ids ``{writer}-a{n}/{i}`` and is logged before the put (``attempt``, with
its intended rows) and after it (``acked`` with the partition the controller gave, or ``failed``). A put
that failed is never retried with the same ids: a rollout worker regenerates instead, so an attempt whose
outcome the worker could not learn (the controller died with the answer) can never be trained twice
under the ids of another. ``fenced`` (StaleFenceError) ends the worker, as it ends a real one.

Fault points (``--die-at`` / ``--pause-at``): ``before_put`` (each attempt), ``allocated`` (the controller
granted the partition, nothing stored), ``reserved`` (shared memory: segment reserved and written, not
published on the server), ``stored`` (the server holds the group, the controller has not published it),
``published`` (READY on the controller, the worker has not logged its acknowledgement).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import _childkit as kit


def main() -> None:
    kit.die_with_parent()
    parser = argparse.ArgumentParser()
    kit.add_fault_arguments(parser)
    parser.add_argument("--address", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--epoch", type=int, default=1)
    parser.add_argument("--writer-id", required=True)
    parser.add_argument("--groups", type=int, default=4, help="groups to get acknowledged")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--median", type=float, default=32.0, help="median response tokens")
    parser.add_argument("--put-timeout", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=10.0, help="deadline of control calls")
    parser.add_argument("--transport", default="auto")
    parser.add_argument("--many", type=int, default=0, help="put_many batches of this many groups")
    parser.add_argument("--max-attempts", type=int, default=0, help="default: 4x --groups")
    parser.add_argument("--sleep", type=float, default=0.0, help="pause between puts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    events = kit.Events(args.events)
    points = kit.FaultPoints(events, args.die_at, args.pause_at)
    try:
        run(args, events, points)
    except Exception as exc:
        kit.fail(events, exc)


def _hook(events: kit.Events, points: kit.FaultPoints, client: Any, current: dict[str, Any]) -> None:
    """Wrap the writer's steps so each is logged and can be a fault point."""
    from trajflight.flight_server import StorageClient

    ctrl, storage = client.controller, client.storage
    allocate, allocate_many = ctrl.allocate, ctrl.allocate_many
    publish, publish_many = ctrl.publish, ctrl.publish_many
    put_groups = storage.put_groups

    def granted(grants: list[Any]) -> None:
        first = current["granted"]
        current["granted"] = first + len(grants)
        events.emit(
            "granted",
            keys=current["keys"][first : first + len(grants)],
            parts=[list(g.partition) for g in grants],
            locations=[g.location for g in grants],
        )
        points.reached("allocated")

    def h_allocate(*a: Any, **k: Any) -> Any:
        grant = allocate(*a, **k)
        granted([grant])
        return grant

    def h_allocate_many(*a: Any, **k: Any) -> Any:
        grants = allocate_many(*a, **k)
        granted(list(grants))
        return grants

    def h_put_groups(*a: Any, **k: Any) -> Any:
        out = put_groups(*a, **k)
        points.reached("stored")
        return out

    def h_publish(*a: Any, **k: Any) -> Any:
        out = publish(*a, **k)
        points.reached("published")
        return out

    def h_publish_many(*a: Any, **k: Any) -> Any:
        out = publish_many(*a, **k)
        points.reached("published")
        return out

    ctrl.allocate, ctrl.allocate_many = h_allocate, h_allocate_many
    ctrl.publish, ctrl.publish_many = h_publish, h_publish_many
    storage.put_groups = h_put_groups

    action = StorageClient._action

    def h_action(self: Any, name: str, body: bytes, timeout: float | None) -> Any:
        if name == "shm_publish":  # the segment is reserved and written; the server has not published it
            points.reached("reserved")
        return action(self, name, body, timeout)

    StorageClient._action = h_action  # type: ignore[method-assign]


def _register(client: Any, args: argparse.Namespace, events: kit.Events) -> Any:
    """The public Writer, retrying while the controller is unreachable (it may be restarting)."""
    from trajflight.errors import DeadlineExceededError, UnavailableError

    deadline = time.monotonic() + 30.0
    while True:
        try:
            return client.writer(args.job, args.epoch, writer_id=args.writer_id, put_timeout=args.put_timeout)
        except (UnavailableError, DeadlineExceededError) as exc:
            if time.monotonic() > deadline:
                raise
            events.emit("register_retry", error=kit.error_name(exc))
            time.sleep(0.2)


def run(args: argparse.Namespace, events: kit.Events, points: kit.FaultPoints) -> None:
    import trajflight
    from trajflight.errors import StaleFenceError, TrajflightError
    from trajflight.workload import make_workload

    client = trajflight.connect(args.address, timeout=args.timeout, transport=args.transport)
    current: dict[str, Any] = {"keys": [], "granted": 0}  # the attempt's keys, how many were granted
    _hook(events, points, client, current)
    writer = _register(client, args, events)
    events.emit("registered", writer=args.writer_id, epoch=args.epoch)
    per_call = max(1, args.many)
    max_attempts = args.max_attempts or 4 * args.groups
    acked = attempts = 0
    while acked < args.groups and attempts < max_attempts:
        n = min(per_call, args.groups - acked)
        keys = [f"{args.writer_id}-a{attempts + i}" for i in range(n)]
        attempts += n
        groups = make_workload(
            n, args.samples, seed=args.seed * 100_003 + attempts, response_median=args.median
        )
        columns = [
            g.columns(sample_ids=[f"{key}/{i}" for i in range(args.samples)])
            for g, key in zip(groups, keys, strict=True)
        ]
        points.reached("before_put", keys=keys)
        for key in keys:
            events.emit("attempt", key=key, rows=args.samples)
        current.update(keys=keys, granted=0)
        try:
            infos = writer.put_many(columns) if args.many else [writer.put(**columns[0])]
        except StaleFenceError as exc:
            events.emit("fenced", keys=keys, error=kit.error_name(exc))
            break
        except TrajflightError as exc:
            events.emit("failed", keys=keys, error=kit.error_name(exc))
            time.sleep(0.2)
            continue
        for key, info in zip(keys, infos, strict=True):
            events.emit(
                "acked",
                key=key,
                part=list(info.partition),
                rows=info.rows,
                nbytes=info.nbytes,
                server=info.server_id,
            )
        acked += n
        if args.sleep:
            time.sleep(args.sleep)
    events.emit("done", acked=acked, attempts=attempts)
    client.close()


if __name__ == "__main__":
    main()
    sys.exit(0)
