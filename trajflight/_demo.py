"""``trajflight demo``: the main job — rollout workers, a GRPO trainer, fenced leases, checkpoints.

Several rollout worker processes generate synthetic GRPO groups (the standard workload's shapes) and put
them; the trainer leases batches, trains a small torch policy on the CPU with a clipped GRPO loss computed
from the tensors it received, commits and checkpoints every few steps, and prints a summary.

Commits happen at checkpoints: a batch is TRAINED after its step and COMMITTED (its data deleted) only
when the model and the controller are checkpointed together, so a restart from a checkpoint still finds
the data of every group it must train again.

``--resume`` plays a crash and a restart: after ``--crash-after`` steps the trainer dies holding leases;
the job is restored from the last checkpoint under a larger epoch; the old workers are refused (by the
controller and by the storage servers), new workers finish the job, and the run checks that every group
in the surviving model's lineage was trained exactly once.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "run"]

JOB = "demo-grpo"
CONFIG = {"default_lease_ttl": "10s", "capacity_bytes": "512MiB", "max_group_bytes": "64MiB"}
VOCAB = 512


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the demo's options."""
    parser.add_argument(
        "--groups", type=int, default=192, help="GRPO groups to generate in all (default 192)"
    )
    parser.add_argument("--workers", type=int, default=3, help="rollout worker processes (default 3)")
    parser.add_argument("--samples", type=int, default=8, help="samples per group, K (default 8)")
    parser.add_argument("--batch-groups", type=int, default=8, help="groups per training step (default 8)")
    parser.add_argument(
        "--checkpoint-every", type=int, default=4, help="steps between checkpoints (default 4)"
    )
    parser.add_argument("--servers", type=int, default=2, help="storage servers (default 2)")
    parser.add_argument(
        "--response-median",
        type=float,
        default=256.0,
        help="median response length in tokens (BENCHMARK.md uses 1024; default 256)",
    )
    parser.add_argument("--seed", type=int, default=0, help="workload and model seed (default 0)")
    parser.add_argument(
        "--rollout-time",
        type=float,
        default=0.05,
        help="simulated generation time per group and worker, seconds (default 0.05)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="crash the trainer after --crash-after steps, restart from the checkpoint "
        "with a larger epoch and check nothing was lost or trained twice",
    )
    parser.add_argument(
        "--crash-after", type=int, default=6, help="steps before the simulated crash (default 6)"
    )
    parser.add_argument(
        "--state-dir", default=None, help="where checkpoints go (default: a temporary folder)"
    )
    parser.add_argument("--ray", action="store_true", help="run on a local Ray data plane instead")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


# ---------------------------------------------------------------------------------------- rollout side


def rollout_worker(
    address: str,
    epoch: int,
    worker: int,
    group_ids: list[int],
    samples: int,
    median: float,
    seed: int,
    rollout_time: float,
    events: Any,
) -> None:
    """Generate and put groups until done or fenced; report each outcome on ``events`` (a queue)."""
    import trajflight
    from trajflight.errors import StaleFenceError, UnavailableError
    from trajflight.workload import make_workload

    client = trajflight.connect(address)
    writer = client.writer(JOB, epoch, writer_id=f"rollout-{epoch}-{worker}")
    try:
        for gid in group_ids:
            time.sleep(rollout_time)  # the engine generating the group
            (group,) = make_workload(1, samples, seed=seed * 1_000_003 + gid, response_median=median)
            _make_learnable(group, seed * 1_000_003 + gid)
            columns = group.columns(sample_ids=[f"g{gid}/s{i}" for i in range(samples)])
            for attempt in range(50):
                try:
                    meta = writer.put(**columns)
                    break
                except StaleFenceError as exc:  # the job restarted under a newer epoch: stop writing
                    events.put(("fenced", worker, epoch, str(exc)))
                    return
                except UnavailableError:  # the controller is restarting: retry for a while
                    if attempt == 49:
                        raise
                    time.sleep(0.2)
            events.put(("put", worker, epoch, meta.nbytes, meta.partition.group_id, gid))
    finally:
        events.put(("done", worker, epoch))
        client.close()


def _make_learnable(group: Any, seed: int) -> None:
    """Give the synthetic rewards a signal a policy can learn: rewarded samples use the lower half of the
    demo vocabulary, the others the upper half (in place; shapes and dtypes unchanged)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    offsets = group.response_offsets
    for i, reward in enumerate(group.reward):
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        base = 0 if reward > 0 else VOCAB // 2
        group.response_values[lo:hi] = rng.integers(base, base + VOCAB // 2, hi - lo, dtype=np.int32)


# ---------------------------------------------------------------------------------------- trainer side


def _policy(seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))


def grpo_loss(policy: Any, tensors: Any) -> Any:
    """GRPO's policy-gradient loss over response tokens, from the jagged tensors a lease delivered.

    Each token's log-probability under the policy (which predicts a token from the previous one) is
    weighted by its sample's group-normalised ``advantage`` and averaged over the tokens ``loss_mask``
    selects: ``-(A * log pi(token)).mean()``. One gradient step per batch (on-policy), so the importance
    ratio to the behaviour policy is 1 and the clipped surrogate reduces to this. The loss falls as the
    policy learns to prefer the tokens of rewarded samples.
    """
    import torch

    ids = tensors.tensors["response_ids"]
    offsets = ids.offsets().long()
    tokens = ids.values().long() % VOCAB
    mask = tensors.tensors["loss_mask"].values().float()
    advantage = torch.repeat_interleave(tensors.tensors["advantage"], offsets[1:] - offsets[:-1])
    logits = policy(torch.roll(tokens, 1))
    logp = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    return -(advantage * logp * mask).sum() / mask.sum().clamp(min=1.0)


@dataclass
class Tally:
    """What the run did (for the summary and the exactly-once check)."""

    steps: int = 0
    groups_trained: int = 0
    payload_bytes: int = 0
    fetch_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    lineage: list[int] = field(default_factory=list)  # prompt numbers committed in the surviving lineage
    pending: list[int] = field(default_factory=list)  # trained, not yet committed
    puts: int = 0
    put_bytes: int = 0
    refused_writers: int = 0


def _prompt_ids(sample_ids: Any) -> list[int]:
    """The demo's prompt (group) numbers of a batch, from sample ids ``g{gid}/s{i}``, in order."""
    seen: dict[int, None] = {}
    for sid in sample_ids.to_pylist():
        seen[int(sid.split("/", 1)[0][1:])] = None
    return list(seen)


class _Progress:
    """Groups in the surviving lineage, as a tqdm bar on stderr (or nothing)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="group", desc="training", file=sys.stderr, dynamic_ncols=True)

    def __call__(self, groups: int) -> None:
        if self.bar is not None:
            self.bar.update(groups)

    def reset_to(self, groups: int, note: str) -> None:
        """Roll the bar back to ``groups`` (after a restore) and say why."""
        if self.bar is not None:
            self.bar.n = groups
            self.bar.set_description(note)
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Run:
    """One demo run: the data plane, the writers' event queue, the trainer's model and the tally."""

    COLUMNS = ("response_ids", "loss_mask", "advantage", "sample_id")

    def __init__(self, args: argparse.Namespace, plane: Any, state: Path) -> None:
        import torch

        self.args = args
        self.plane = plane
        self.state = state
        self.client = plane.client()
        self.tally = Tally()
        self.events = mp.get_context("spawn").Queue()
        self.done: set[tuple[int, int]] = set()  # (worker, epoch) of finished writers
        self.procs: list[Any] = []
        self.progress = _Progress(args.groups, not args.no_progress)
        self.policy = _policy(args.seed)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=3e-3)

    def start_workers(self, epoch: int, prompts: list[int]) -> set[tuple[int, int]]:
        """Start one rollout process per worker writing ``prompts`` under ``epoch``; returns their ids."""
        ctx = mp.get_context("spawn")  # gRPC is not fork-safe (PITFALLS.md)
        a = self.args
        for worker in range(a.workers):
            share = prompts[worker :: a.workers]
            p = ctx.Process(
                target=rollout_worker,
                args=(
                    self.plane.address,
                    epoch,
                    worker,
                    share,
                    a.samples,
                    a.response_median,
                    a.seed,
                    a.rollout_time,
                    self.events,
                ),
                daemon=True,
            )
            p.start()
            self.procs.append(p)
        return {(w, epoch) for w in range(a.workers)}

    def drain(self) -> None:
        """Take the writers' events off the queue into the tally."""
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            if event[0] == "put":
                self.tally.puts += 1
                self.tally.put_bytes += event[3]
            elif event[0] == "fenced":
                self.tally.refused_writers += 1
            elif event[0] == "done":
                self.done.add((event[1], event[2]))

    def train(
        self, writers: set[tuple[int, int]], *, crash_after: int | None = None, wait: float = 2.0
    ) -> bool:
        """Train until every prompt is in the lineage or ``writers`` finished and nothing is READY.

        Returns False when the simulated crash happened (after ``crash_after`` steps).
        """
        tally, args = self.tally, self.args
        trainer = self.client.trainer(JOB, owner="demo-trainer")
        held: list[Any] = []
        while len(tally.lineage) + len(tally.pending) < args.groups:
            self.drain()
            batch = trainer.try_lease(args.batch_groups, wait=wait)
            if batch is None:
                if writers <= self.done and not self.client.controller.counts(JOB).get("READY"):
                    break  # every writer finished and nothing is left to lease
                continue
            tally.outcomes["leased"] += len(batch)
            fetch_started = time.perf_counter()
            tensors = batch.fetch(self.COLUMNS)
            tally.fetch_seconds += time.perf_counter() - fetch_started
            batch.prepare(f"step-{tally.steps}")
            batch.start_training()
            loss = grpo_loss(self.policy, tensors)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            batch.finish_training()
            held.append(batch)
            tally.steps += 1
            tally.losses.append(loss.item())
            tally.payload_bytes += batch.handle.nbytes
            tally.pending.extend(_prompt_ids(tensors.arrow["sample_id"]))
            self.progress(len(batch))
            if crash_after is not None and tally.steps >= crash_after:
                for b in held:  # the trainer dies: no commit, no release, no more heartbeats
                    b.close()
                tally.outcomes["abandoned_by_crash"] += sum(len(b) for b in held)
                return False
            if tally.steps % args.checkpoint_every == 0:
                self.commit_and_checkpoint(held)
        self.commit_and_checkpoint(held)
        return True

    def commit_and_checkpoint(self, held: list[Any]) -> None:
        """Commit the trained batches, then checkpoint the controller and the model together."""
        import torch

        for b in held:
            b.commit()
            self.tally.outcomes["committed"] += len(b)
        held.clear()
        self.tally.lineage.extend(self.tally.pending)
        self.tally.pending.clear()
        self.client.checkpoint(JOB, self.state / "controller.ckpt")
        saved = {
            "model": self.policy.state_dict(),
            "optim": self.optimizer.state_dict(),
            "lineage": self.tally.lineage,
            "steps": self.tally.steps,
        }
        torch.save(saved, self.state / "model.pt")

    def resume(self) -> None:
        """Restart from the last checkpoint under epoch 2, then finish the job with new writers.

        Groups READY at the checkpoint are re-offered and trained first; prompts with no group in the
        restored ledger (written after the checkpoint by now-fenced workers, or never written) are
        generated again by epoch-2 workers.
        """
        import torch

        tally = self.tally
        saved = torch.load(self.state / "model.pt", weights_only=False)
        self.policy.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optim"])
        tally.outcomes["steps_rolled_back"] = tally.steps - saved["steps"]
        tally.steps = saved["steps"]
        tally.lineage = list(saved["lineage"])
        tally.pending.clear()
        # The controller restarts too (a new incarnation at the same address) and restores the checkpoint.
        self.plane.restart_controller()
        self.client = self.plane.client()
        self.client.restore(
            self.state / "controller.ckpt", job_id=JOB, epoch=2, config=CONFIG, old_ready="reoffer"
        )
        self.progress.reset_to(len(tally.lineage), "resumed (epoch 2)")
        # Epoch-1 workers still running are refused from here on, by the controller and the servers.
        before = len(tally.lineage)
        self.train(set(), wait=0.0)  # the re-offered groups
        tally.outcomes["reoffered_and_trained"] = len(tally.lineage) - before
        for p in self.procs:
            p.join(timeout=60)
        missing = sorted(set(range(self.args.groups)) - set(tally.lineage))
        self.train(self.start_workers(2, missing))
        # Groups the crashed epoch put after the checkpoint are unknown to the restored ledger: purge them.
        for server in self.client.controller.servers():
            purged = self.client.storage.client(server.location).fence(JOB, 2, purge=True)
            tally.outcomes["orphans_purged"] += int(purged["purged_groups"])


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns 0 when every check holds."""
    import torch

    import trajflight

    if args.ray:
        from trajflight._ray_plane import RayCluster

        plane: Any = RayCluster(servers=args.servers, capacity="1GiB")  # as the embedded plane
    else:
        plane = trajflight.LocalCluster(servers=args.servers, capacity="1GiB")
    state = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="trajflight-demo-"))
    state.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    started = time.perf_counter()
    with plane:
        demo = _Run(args, plane, state)
        demo.client.open_job(JOB, 1, CONFIG)
        writers = demo.start_workers(1, list(range(args.groups)))
        crash_after = args.crash_after if args.resume else None
        resumed = not demo.train(writers, crash_after=crash_after)
        if resumed:
            demo.resume()
        for p in demo.procs:
            p.join(timeout=30)
        demo.progress.close()
        demo.drain()
        elapsed = time.perf_counter() - started
        usage = plane.wait_idle(JOB, timeout=10.0)
        counts = demo.client.controller.counts(JOB)
    ok = _summary(demo.tally, counts, usage, elapsed, args, resumed)
    return 0 if ok else 1


def _loss_trend(losses: list[float]) -> str:
    if not losses:
        return "-"
    k = min(10, len(losses))
    return f"{sum(losses[:k]) / k:.4f} -> {sum(losses[-k:]) / k:.4f} (mean of {k})"


def _summary(
    tally: Tally,
    counts: dict[str, int],
    usage: tuple[int, int],
    elapsed: float,
    args: argparse.Namespace,
    resumed: bool,
) -> bool:
    trained = Counter(tally.lineage)
    twice = sorted(k for k, n in trained.items() if n > 1)
    missing = set(range(args.groups)) - set(trained)
    rows = [
        ("steps", f"{tally.steps}"),
        ("groups trained (lineage)", f"{len(tally.lineage)}"),
        ("groups put", f"{tally.puts}"),
        ("groups/s (trained)", f"{len(tally.lineage) / elapsed:.1f}"),
        ("payload put, MB", f"{tally.put_bytes / 1e6:.1f}"),
        (
            "payload fetched by trainer",
            f"{tally.payload_bytes / 1e6:.1f} MB at "
            f"{tally.payload_bytes / max(tally.fetch_seconds, 1e-9) / 1e9:.2f} GB/s",
        ),
        ("loss, first -> last 10 steps", _loss_trend(tally.losses)),
        ("lease outcomes", ", ".join(f"{k}={v}" for k, v in sorted(tally.outcomes.items()))),
        ("stale writers refused", f"{tally.refused_writers}"),
        ("controller states", ", ".join(f"{k}={v}" for k, v in counts.items() if v)),
        ("capacity held at end", f"{usage[0]} bytes, {usage[1]} groups"),
        ("trained twice", f"{len(twice)}"),
        ("wall time, s", f"{elapsed:.1f}"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\ntrajflight demo" + (" (with crash and resume)" if resumed else ""))
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print(f"  {'groups lost':<{width}}  {len(missing)}")
    ok = not twice and not missing and usage == (0, 0)
    print("  result:", "OK - nothing lost, nothing trained twice" if ok else "FAILED")
    return ok
