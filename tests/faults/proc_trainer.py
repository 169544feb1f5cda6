"""A trainer of the fault suite, as its own process: leases, fetches, trains and commits with the public
client, and logs every step.

Per lease: ``leased`` (token, partitions, generations), ``fetched`` (per group: partition, rows read,
sample ids), then ``committing`` / ``committed``. ``refused`` logs a typed error at any step; the
trainer then gives back what it can (untrained groups are released) and leases again, as a real trainer
would. The *lineage* of a trainer is what it committed: the test reads it off ``committed`` events (and,
for a trainer that checkpoints, off the lineage file saved with each checkpoint).

With ``--checkpoint-every K`` it trains as the demo does: batches stay TRAINED until every K steps it
commits them, saves its lineage (the model) to ``lineage-N.json`` and then the controller's checkpoint
to ``controller-N.ckpt`` in ``--ckpt-dir`` (model first: checkpoint N is complete only once the
controller's file exists). A refusal after training ends such a trainer (exit 4): its model holds work the
ledger did not take, so it must be restored from its last checkpoint.

It stops when ``--stop-file`` exists (after a final checkpoint in checkpoint mode), or after
``--max-leases`` leases.

Fault points: ``polling`` (before each long poll), ``leased``, ``fetched``, ``prepared``, ``training``,
``trained``, ``committed``, ``before_checkpoint``, ``checkpointed``. With ``--probe-after-pause`` a
trainer continued after a pause first tries, as a zombie would, to read its groups and to append a
column to one, and logs ``probe`` events saying whether the data plane let it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import _childkit as kit

COLUMNS = ["epoch", "group_id", "sample_id"]


def main() -> None:
    kit.die_with_parent()
    parser = argparse.ArgumentParser()
    kit.add_fault_arguments(parser)
    parser.add_argument("--address", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--owner", required=True)
    parser.add_argument("--max-groups", type=int, default=4)
    parser.add_argument("--ttl", type=float, default=None, help="lease ttl (default: the job's)")
    parser.add_argument("--wait", type=float, default=0.5, help="long-poll seconds")
    parser.add_argument("--timeout", type=float, default=10.0, help="deadline of control and data calls")
    parser.add_argument("--transport", default="auto")
    parser.add_argument("--stop-file", default=None)
    parser.add_argument("--max-leases", type=int, default=0)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="simulated training time per step")
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--ckpt-dir", default=None)
    parser.add_argument("--lineage-in", default=None, help="lineage file of the checkpoint resumed from")
    parser.add_argument("--probe-after-pause", action="store_true")
    args = parser.parse_args()
    events = kit.Events(args.events)
    points = kit.FaultPoints(events, args.die_at, args.pause_at)
    try:
        Training(args, events, points).run()
    except Exception as exc:
        kit.fail(events, exc)


class Training:
    """One trainer process's loop and lineage."""

    def __init__(self, args: argparse.Namespace, events: kit.Events, points: kit.FaultPoints) -> None:
        import trajflight

        self.args, self.events, self.points = args, events, points
        self.client = trajflight.connect(args.address, timeout=args.timeout, transport=args.transport)
        self.trainer = self.client.trainer(args.job, owner=args.owner, ttl=args.ttl)
        self.lineage: list[str] = []
        self.checkpoints = 0
        if args.lineage_in:
            saved = json.loads(Path(args.lineage_in).read_text())
            self.lineage, self.checkpoints = list(saved["lineage"]), int(saved["n"])
        self.held: list[tuple[Any, list[str]]] = []  # TRAINED batches waiting for the next checkpoint
        self.steps = 0

    def stop_requested(self) -> bool:
        return bool(self.args.stop_file) and os.path.exists(self.args.stop_file)

    def run(self) -> None:
        from trajflight.errors import TrajflightError

        args, events = self.args, self.events
        events.emit("started", owner=args.owner, lineage=len(self.lineage))
        leases = 0
        while not self.stop_requested():
            if args.max_leases and leases >= args.max_leases:
                break
            if leases == 0 or args.wait > 1:
                events.emit("polling", wait=args.wait)
            self.points.reached("polling")
            try:
                batch = self.trainer.try_lease(args.max_groups, wait=args.wait)
            except TrajflightError as exc:
                events.emit("lease_error", error=kit.error_name(exc))
                time.sleep(0.2)
                continue
            if batch is None:
                continue
            leases += 1
            self.step(batch)
        if self.held or (args.checkpoint_every and self.steps % args.checkpoint_every):
            self.checkpoint()
        events.emit("stopped", leases=leases, lineage=len(self.lineage))
        self.client.close()

    def step(self, batch: Any) -> None:
        """Drive one lease through training; a refusal is logged and what is untrained given back."""
        from trajflight.errors import TrajflightError

        events, points = self.events, self.points
        token = batch.token
        events.emit(
            "leased",
            token=token,
            parts=[list(p) for p in batch.partitions],
            gens=[g.generation for g in batch.handle.groups],
        )
        where = "leased"
        try:
            if points.reached("leased", token=token) and self.args.probe_after_pause:
                self.probe(batch)
            where = "fetch"
            table = batch.fetch_table(COLUMNS)
            groups = _groups_of(self.args.job, table)
            events.emit("fetched", token=token, groups=groups)
            samples = [s for g in groups for s in g["samples"]]
            if points.reached("fetched", token=token) and self.args.probe_after_pause:
                self.probe(batch)
            where = "prepare"
            batch.prepare(f"{self.args.owner}-{token}")
            if points.reached("prepared", token=token) and self.args.probe_after_pause:
                self.probe(batch)
            where = "start_training"
            batch.start_training()
            if points.reached("training", token=token) and self.args.probe_after_pause:
                self.probe(batch)
            if self.args.step_sleep:
                time.sleep(self.args.step_sleep)
            where = "finish_training"
            batch.finish_training()
            if points.reached("trained", token=token) and self.args.probe_after_pause:
                self.probe(batch)
            self.steps += 1
            if self.args.checkpoint_every:
                self.held.append((batch, samples))
                if self.steps % self.args.checkpoint_every == 0:
                    self.checkpoint()
                return
            where = "commit"
            self.commit(batch, samples)
        except TrajflightError as exc:
            events.emit("refused", token=token, step=where, error=kit.error_name(exc))
            if self.args.checkpoint_every and where not in ("leased", "fetch", "prepare", "start_training"):
                events.emit("abort", why="a refusal after training: the model must be restored")
                sys.exit(4)
            try:
                if batch.stage in ("LEASED", "PREPARED") and batch.lost is None:
                    batch.release()
            except TrajflightError as again:
                events.emit("release_error", token=token, error=kit.error_name(again))
            finally:
                batch.close()

    def commit(self, batch: Any, samples: list[str]) -> None:
        self.events.emit("committing", token=batch.token)
        batch.commit()
        self.events.emit("committed", token=batch.token)
        self.lineage.extend(samples)
        self.points.reached("committed", token=batch.token)

    def checkpoint(self) -> None:
        """Commit the held batches, save the lineage (the model), then the controller's checkpoint."""
        from trajflight.errors import TrajflightError

        try:
            for batch, samples in self.held:
                self.commit(batch, samples)
        except TrajflightError as exc:
            self.events.emit("refused", step="commit", error=kit.error_name(exc))
            self.events.emit("abort", why="a commit at a checkpoint was refused")
            sys.exit(4)
        self.held.clear()
        n = self.checkpoints + 1
        self.points.reached("before_checkpoint", ckpt=n)
        ckpt_dir = Path(self.args.ckpt_dir)
        tmp = ckpt_dir / f".lineage-{n}.json.tmp"
        tmp.write_text(json.dumps({"n": n, "lineage": self.lineage}))
        os.replace(tmp, ckpt_dir / f"lineage-{n}.json")
        t0 = time.monotonic()
        try:
            self.client.checkpoint(self.args.job, str(ckpt_dir / f"controller-{n}.ckpt"))
        except TrajflightError as exc:
            self.events.emit("checkpoint_failed", n=n, t0=t0, error=kit.error_name(exc))
            sys.exit(4)
        self.checkpoints = n
        self.events.emit("checkpointed", n=n, t0=t0, lineage=len(self.lineage))
        self.points.reached("checkpointed", ckpt=n)

    def probe(self, batch: Any) -> None:
        """As a zombie woken after its lease expired: try to read the groups and to append to one."""
        import pyarrow as pa

        from trajflight.errors import TrajflightError

        try:
            rows = batch.fetch_table(COLUMNS).num_rows
            self.events.emit("probe", what="fetch", ok=True, rows=rows)
        except TrajflightError as exc:
            self.events.emit("probe", what="fetch", ok=False, error=kit.error_name(exc))
        meta = batch.handle.groups[0]
        try:
            column = pa.table({"zombie_col": pa.array([1] * meta.rows, pa.int32())})
            batch.append(meta.partition, column)
            self.events.emit("probe", what="append", ok=True, part=list(meta.partition))
        except TrajflightError as exc:
            self.events.emit("probe", what="append", ok=False, error=kit.error_name(exc))


def _groups_of(job: str, table: Any) -> list[dict[str, Any]]:
    """Per group of a fetched table, in order: partition, rows and sample ids."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    epochs = table.column("epoch").to_pylist()
    gids = table.column("group_id").to_pylist()
    for epoch, gid, sid in zip(epochs, gids, table.column("sample_id").to_pylist(), strict=True):
        entry = out.setdefault((epoch, gid), {"part": [job, epoch, gid], "rows": 0, "samples": []})
        entry["rows"] += 1
        entry["samples"].append(sid)
    return list(out.values())


if __name__ == "__main__":
    main()
    sys.exit(0)
