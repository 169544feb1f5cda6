"""A misbehaving writer of the fault suite: a bare ``pyarrow.flight`` DoPut of one group, sent one row
per batch, slowly, so a scenario can kill or stop it mid-stream.

The command descriptor is the wire format's put (``docs/wire-format.md``) with or without ``num_rows``
(``--announce``): trajflight's own client always announces the rows; other Flight clients may not. It
logs ``wrote`` after each batch (fault point ``wrote``) and ``done`` after the stream closed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import _childkit as kit


def main() -> None:
    kit.die_with_parent()
    parser = argparse.ArgumentParser()
    kit.add_fault_arguments(parser)
    parser.add_argument("--location", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--epoch", type=int, default=1)
    parser.add_argument("--group-id", type=int, required=True)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--announce", action="store_true", help="put num_rows in the descriptor")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between batches")
    args = parser.parse_args()
    events = kit.Events(args.events)
    points = kit.FaultPoints(events, args.die_at, args.pause_at)

    import pyarrow.flight as flight

    from trajflight.codec import encode_group
    from trajflight.workload import make_workload

    (group,) = make_workload(1, args.rows, seed=args.group_id, response_median=32)
    sample_ids = [f"raw-{args.group_id}/{i}" for i in range(args.rows)]
    batch = encode_group(
        job_id=args.job, epoch=args.epoch, group_id=args.group_id, **group.columns(sample_ids=sample_ids)
    )
    descriptor = {"v": 1, "kind": "put", "job_id": args.job, "epoch": args.epoch, "group_id": args.group_id}
    if args.announce:
        descriptor["num_rows"] = args.rows
    client = flight.FlightClient(args.location)
    writer, _ = client.do_put(flight.FlightDescriptor.for_command(json.dumps(descriptor)), batch.schema)
    try:
        for i in range(args.rows):
            writer.write_batch(batch.slice(i, 1))
            events.emit("wrote", rows=i + 1)
            points.reached("wrote")
            time.sleep(args.interval)
        writer.done_writing()
        writer.close()
        events.emit("done", ok=True)
    except flight.FlightError as exc:
        events.emit("done", ok=False, error=kit.error_name(exc))


if __name__ == "__main__":
    main()
    sys.exit(0)
