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


def _start_workers(
    address: str, epoch: int, plan: list[list[int]], args: argparse.Namespace, events: Any
) -> list[Any]:
    ctx = mp.get_context("spawn")  # gRPC is not fork-safe (PITFALLS.md)
    procs = []
    for worker, gids in enumerate(plan):
        p = ctx.Process(
            target=rollout_worker,
            args=(
                address,
                epoch,
                worker,
                gids,
                args.samples,
                args.response_median,
                args.seed,
                args.rollout_time,
                events,
            ),
            daemon=True,
        )
        p.start()
        procs.append(p)
    return procs


# ---------------------------------------------------------------------------------------- trainer side


def _policy(seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))


def grpo_loss(policy: Any, tensors: Any, clip: float = 0.2) -> Any:
    """Clipped GRPO surrogate over response tokens, from the jagged tensors a lease delivered.

    The policy predicts each response token from the previous one; ``response_logprobs`` are the
    behaviour policy's, ``advantage`` is per sample (group-normalised), ``loss_mask`` selects tokens.
    """
    import torch

    ids = tensors.tensors["response_ids"]
    offsets = ids.offsets().long()
    tokens = ids.values().long() % VOCAB
    old_logp = tensors.tensors["response_logprobs"].values()
    mask = tensors.tensors["loss_mask"].values().float()
    lengths = offsets[1:] - offsets[:-1]
    advantage = torch.repeat_interleave(tensors.tensors["advantage"], lengths)
    previous = torch.roll(tokens, 1)
    logits = policy(previous)
    new_logp = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    ratio = torch.exp(new_logp - old_logp)
    surrogate = torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - clip, 1 + clip) * advantage)
    return -(surrogate * mask).sum() / mask.sum().clamp(min=1.0)


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


def _drain(events: Any, tally: Tally, done: set[tuple[int, int]]) -> None:
    while True:
        try:
            event = events.get_nowait()
        except queue.Empty:
            return
        if event[0] == "put":
            tally.puts += 1
            tally.put_bytes += event[3]
        elif event[0] == "fenced":
            tally.refused_writers += 1
        elif event[0] == "done":
            done.add((event[1], event[2]))


def _train(
    client: Any,
    policy: Any,
    optimizer: Any,
    tally: Tally,
    args: argparse.Namespace,
    *,
    until: int,
    ckpt: Path,
    events: Any,
    workers_done: set[tuple[int, int]],
    expected_workers: set[tuple[int, int]],
    crash_after: int | None,
    progress: Any,
    wait: float = 2.0,
) -> bool:
    """Train until ``until`` groups are in the lineage; returns False when the simulated crash happened."""
    trainer = client.trainer(JOB, owner="demo-trainer")
    held: list[Any] = []
    columns = ["response_ids", "response_logprobs", "loss_mask", "advantage", "sample_id"]
    while len(tally.lineage) + len(tally.pending) < until:
        _drain(events, tally, workers_done)
        batch = trainer.try_lease(args.batch_groups, wait=wait)
        if batch is None:
            if expected_workers <= workers_done and not client.controller.counts(JOB).get("READY"):
                break  # every writer finished and nothing is left to lease
            continue
        tally.outcomes["leased"] += len(batch)
        fetch_started = time.perf_counter()
        tensors = batch.fetch(columns)
        tally.fetch_seconds += time.perf_counter() - fetch_started
        batch.prepare(f"step-{tally.steps}")
        batch.start_training()
        loss = grpo_loss(policy, tensors)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batch.finish_training()
        held.append(batch)
        tally.steps += 1
        tally.losses.append(loss.item())
        tally.payload_bytes += batch.handle.nbytes
        tally.pending.extend(_prompt_ids(tensors.arrow["sample_id"]))
        progress(len(batch))
        if crash_after is not None and tally.steps >= crash_after:
            for b in held:  # the trainer dies: no commit, no release, no more heartbeats
                b.close()
            tally.outcomes["abandoned_by_crash"] += sum(len(b) for b in held)
            return False
        if tally.steps % args.checkpoint_every == 0:
            _commit_and_checkpoint(client, policy, optimizer, held, tally, ckpt)
    _commit_and_checkpoint(client, policy, optimizer, held, tally, ckpt)
    return True


def _prompt_ids(sample_ids: Any) -> list[int]:
    """The demo's prompt (group) numbers of a batch, from sample ids ``g{gid}/s{i}``, in order."""
    seen: dict[int, None] = {}
    for sid in sample_ids.to_pylist():
        seen[int(sid.split("/", 1)[0][1:])] = None
    return list(seen)


def _commit_and_checkpoint(
    client: Any, policy: Any, optimizer: Any, held: list[Any], tally: Tally, ckpt: Path
) -> None:
    import torch

    for b in held:
        b.commit()
        tally.outcomes["committed"] += len(b)
    held.clear()
    tally.lineage.extend(tally.pending)
    tally.pending.clear()
    client.checkpoint(JOB, ckpt / "controller.ckpt")
    torch.save(
        {
            "model": policy.state_dict(),
            "optim": optimizer.state_dict(),
            "lineage": tally.lineage,
            "steps": tally.steps,
        },
        ckpt / "model.pt",
    )


# ---------------------------------------------------------------------------------------- the run


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


def _plan(group_ids: list[int], workers: int) -> list[list[int]]:
    return [group_ids[w::workers] for w in range(workers)]


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
    tally = Tally()
    events = mp.get_context("spawn").Queue()
    with plane:
        client = plane.client()
        client.open_job(JOB, 1, CONFIG)
        policy = _policy(args.seed)
        optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
        progress = _Progress(args.groups, not args.no_progress)
        gids = list(range(args.groups))
        procs = _start_workers(plane.address, 1, _plan(gids, args.workers), args, events)
        done: set[tuple[int, int]] = set()
        expected = {(w, 1) for w in range(args.workers)}
        finished = _train(
            client,
            policy,
            optimizer,
            tally,
            args,
            until=args.groups,
            ckpt=state,
            events=events,
            workers_done=done,
            expected_workers=expected,
            crash_after=args.crash_after if args.resume else None,
            progress=progress,
        )
        resumed = None
        if not finished:
            resumed = _resume(client, plane, args, state, tally, events, procs, done, progress)
            policy, optimizer, procs, client = (
                resumed[k] for k in ("policy", "optimizer", "procs", "client")
            )
        for p in procs:
            p.join(timeout=30)
        progress.close()
        _drain(events, tally, done)
        elapsed = time.perf_counter() - started
        usage = plane.wait_idle(JOB, timeout=10.0)
        counts = client.controller.counts(JOB)
    ok = _summary(tally, counts, usage, elapsed, args, resumed)
    return 0 if ok else 1


def _resume(
    client: Any,
    plane: Any,
    args: argparse.Namespace,
    state: Path,
    tally: Tally,
    events: Any,
    old_procs: list[Any],
    done: set[tuple[int, int]],
    progress: Any,
) -> dict[str, Any]:
    """Restart from the last checkpoint under epoch 2, then finish the job with new writers.

    Groups READY at the checkpoint are re-offered and trained first; prompts with no group in the
    restored ledger (written after the checkpoint by now-fenced workers, or never written) are
    generated again by epoch-2 workers.
    """
    import torch

    saved = torch.load(state / "model.pt", weights_only=False)
    policy = _policy(args.seed)
    policy.load_state_dict(saved["model"])
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    optimizer.load_state_dict(saved["optim"])
    tally.outcomes["steps_rolled_back"] = tally.steps - saved["steps"]
    tally.steps = saved["steps"]
    tally.lineage = list(saved["lineage"])
    tally.pending.clear()
    # The controller restarts too (a new incarnation at the same address) and restores the checkpoint.
    plane.restart_controller()
    client = plane.client()
    client.restore(state / "controller.ckpt", job_id=JOB, epoch=2, config=CONFIG, old_ready="reoffer")
    progress.reset_to(len(tally.lineage), "resumed (epoch 2)")
    # Epoch-1 workers still running are refused from here on, by the controller and the servers.
    before = len(tally.lineage)
    _train(
        client,
        policy,
        optimizer,
        tally,
        args,
        until=args.groups,
        ckpt=state,
        events=events,
        workers_done=done,
        expected_workers=set(),
        crash_after=None,
        progress=progress,
        wait=0.0,
    )
    tally.outcomes["reoffered_and_trained"] = len(tally.lineage) - before
    for p in old_procs:
        p.join(timeout=60)
    missing = sorted(set(range(args.groups)) - set(tally.lineage))
    procs = _start_workers(plane.address, 2, _plan(missing, args.workers), args, events)
    expected = {(w, 2) for w in range(args.workers)}
    _train(
        client,
        policy,
        optimizer,
        tally,
        args,
        until=args.groups,
        ckpt=state,
        events=events,
        workers_done=done,
        expected_workers=expected,
        crash_after=None,
        progress=progress,
    )
    # Groups the crashed epoch put after the checkpoint are unknown to the restored ledger: purge them.
    for server in client.controller.servers():
        purged = client.storage.client(server.location).fence(JOB, 2, purge=True)
        tally.outcomes["orphans_purged"] += int(purged["purged_groups"])
    return {"policy": policy, "optimizer": optimizer, "procs": procs, "client": client}


def _summary(
    tally: Tally,
    counts: dict[str, int],
    usage: tuple[int, int],
    elapsed: float,
    args: argparse.Namespace,
    resumed: dict[str, Any] | None,
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
        ("loss first -> last", f"{tally.losses[0]:.4f} -> {tally.losses[-1]:.4f}" if tally.losses else "-"),
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
