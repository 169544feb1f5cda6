"""``trajflight demo``: the main job, a small GRPO loop that really learns, on the CPU.

Rollout worker processes sample groups from the current policy (a tiny causal language model made in
code, see :mod:`trajflight.demo._task`) on a task with a verifiable reward ("count to nine"), with each
token's logprob and top-p candidates, and put them; a reward stage appends group-normalised advantages;
the trainer leases batches that carry them within a staleness bound, trains with the clipped GRPO
objective, commits, checkpoints and publishes new policy versions that the workers pick up. The summary
shows the reward curve, staleness, throughput and the exactly-once check.

Modules: ``_task`` (task, reward, policy), ``_worker`` (rollout workers), ``_stages`` (reward stage),
``_trainer`` (the loop, checkpoints, crash and resume), ``_summary`` (what is printed and drawn).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trajflight import logs
from trajflight.errors import ConfigError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the demo's options."""
    parser.description = (
        "The main job: a small GRPO run that learns, on the CPU. Rollout worker processes sample groups "
        "from a tiny language model on the task 'count to nine' (prompt '3 4 5', right answer "
        "'6 7 8 9 <eos>'; partial credit per token) and put them, with each token's logprob and top-p "
        "candidates; a reward stage appends group-normalised advantages; the trainer leases them within "
        "a staleness bound, trains with the clipped GRPO objective, commits, checkpoints and publishes new "
        "policy versions the workers pick up. Prints the reward curve, staleness, throughput and the "
        "exactly-once check."
    )
    parser.add_argument("--groups", type=int, default=320, help="prompts to train on, one group each (320)")
    parser.add_argument("--workers", type=int, default=3, help="rollout worker processes (default 3)")
    parser.add_argument("--samples", type=int, default=8, help="samples per group, K (default 8)")
    parser.add_argument("--batch-groups", type=int, default=8, help="groups per training step (default 8)")
    parser.add_argument("--lr", type=float, default=0.02, help="Adam learning rate (default 0.02)")
    parser.add_argument("--clip", type=float, default=0.2, help="GRPO ratio clip epsilon (default 0.2)")
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=4,
        help="train only groups at most this many policy versions old (default 4)",
    )
    parser.add_argument(
        "--checkpoint-every", type=int, default=4, help="steps between checkpoints (default 4)"
    )
    parser.add_argument("--servers", type=int, default=2, help="storage servers (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="prompts, sampling and model seed (default 0)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="crash the trainer after --crash-after steps, restart the controller from the checkpoint "
        "under a larger epoch, and check that every prompt was trained exactly once anyway",
    )
    parser.add_argument(
        "--crash-after", type=int, default=6, help="steps before the simulated crash (default 6)"
    )
    parser.add_argument(
        "--state-dir", default=None, help="checkpoints and published weights (default: a temporary folder)"
    )
    parser.add_argument("--ray", action="store_true", help="run on a local Ray data plane instead")
    parser.add_argument(
        "--archive",
        metavar="DIR",
        default=None,
        help="archive every trained group to DIR (Parquet; a local path or a pyarrow.fs URI) and print "
        "the `trajflight sql` and `trajflight report` commands to study it",
    )
    parser.add_argument("--plot", metavar="PATH", default=None, help="draw the reward curve to PATH (PNG)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics while it runs: the controller's on this port (0: a free one), each "
        "storage server's on a free port (with --ray: on their Ray nodes); stderr names them. Default: off",
    )
    logs.add_arguments(parser)


class _Progress:
    """Prompts in the lineage, as a tqdm bar on stderr with the recent reward (or nothing)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar: Any = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="group", desc="training", file=sys.stderr, dynamic_ncols=True)

    def step(self, tally: Any) -> None:
        if self.bar is not None:
            self.bar.n = len(tally.lineage)
            recent = tally.curve[-5:]
            self.bar.set_postfix(reward=f"{sum(r.reward for r in recent) / len(recent):.2f}", refresh=False)
            self.bar.refresh()

    def note(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _check(args: argparse.Namespace) -> str | None:
    for name in ("groups", "workers", "samples", "batch_groups", "checkpoint_every", "servers"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1"
    if args.samples < 2:
        return "--samples must be at least 2 (advantages are normalised within a group)"
    if args.max_staleness < 0:
        return "--max-staleness must be 0 or more"
    if args.resume and not 1 <= args.crash_after < args.groups // args.batch_groups:
        return (
            f"--crash-after must be at least 1 and come before the run's end (about "
            f"{args.groups // args.batch_groups} steps of {args.batch_groups} groups)"
        )
    if args.plot:
        from trajflight.demo._summary import check_plotting

        return check_plotting()
    return None


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns 0 when every check holds, 1 when one fails, 2 on bad options."""
    problem = _check(args)
    if problem is None:
        try:
            logs.setup_from_args(args)
        except ConfigError as exc:  # an unknown --log-level
            problem = str(exc)
    if problem is not None:
        print(f"trajflight demo: {problem}", file=sys.stderr)
        return 2
    import trajflight
    from trajflight.demo._summary import plot_curve, print_summary
    from trajflight.demo._trainer import JOB, DemoRun
    from trajflight.errors import TrajflightError

    if args.ray:
        from trajflight._ray_plane import RayCluster

        plane: Any = RayCluster(
            servers=args.servers,
            capacity="1GiB",
            archive=args.archive,
            log_level=args.log_level,
            log_json=args.log_json,
            metrics_port=args.metrics_port,
        )
    else:
        plane = trajflight.LocalCluster(
            servers=args.servers, capacity="1GiB", archive=args.archive, metrics_port=args.metrics_port
        )
    owned = args.state_dir is None
    state = Path(tempfile.mkdtemp(prefix="trajflight-demo-") if owned else args.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    progress = _Progress(args.groups, not args.no_progress)
    started = time.perf_counter()  # the data plane's start-up counts
    failure: TrajflightError | None = None
    try:
        with plane:
            for name, url in plane.metrics_urls.items():
                print(f"trajflight demo: metrics of {name} at {url}", file=sys.stderr, flush=True)
            demo = DemoRun(args, plane, state, progress.note)
            demo.tally.started_at = started
            demo.on_step = progress.step
            try:
                inc = demo.start()
                if not demo.train(
                    inc, until=demo.all_trained, crash_after=args.crash_after if args.resume else None
                ):
                    inc = demo.resume(inc)
                    demo.train(inc, until=demo.all_trained)
            except TrajflightError as exc:  # said in one line below, with the summary of what was done
                failure = exc
            demo.finish(checkpoint=failure is None)
            resumed = demo.tally.crashed_after is not None
            if resumed and failure is None:
                demo.purge_orphans()
            elapsed = time.perf_counter() - started
            usage = plane.wait_idle(JOB, timeout=10.0)
            counts = demo.client.controller.counts(JOB)
    except TrajflightError as exc:  # the data plane did not start, or went away
        progress.close()
        print(f"trajflight demo: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        progress.close()
        if owned:
            shutil.rmtree(state, ignore_errors=True)
    if failure is not None:
        print(f"trajflight demo: {type(failure).__name__}: {failure}", file=sys.stderr)
    a = args
    config = (
        f"GRPO on 'count to nine', {a.groups} prompts x K={a.samples}, {a.batch_groups} groups a step, "
        f"{a.workers} rollout workers, {a.servers} storage servers" + (" on Ray" if a.ray else "")
    )
    ok = print_summary(
        demo.tally,
        groups=a.groups,
        counts=counts,
        usage=usage,
        elapsed=elapsed,
        config=config,
        resumed=resumed,
        staleness_bound=a.max_staleness,
    )
    if args.plot:
        plot_curve(demo.tally, args.plot, title=f"trajflight demo: {a.groups} prompts, K={a.samples}")
    if args.archive is not None:
        _print_archive_commands(args.archive)
    return 0 if ok and failure is None else 1


def _print_archive_commands(archive: str) -> None:
    """Say where the trained groups went and the commands that study them (a query, a report)."""
    query = (
        "SELECT policy_version, count(*) AS samples, avg(reward) AS reward, avg(staleness) AS staleness "
        "FROM trajectories GROUP BY 1 ORDER BY 1"
    )
    print(f"\ntrained groups archived to {archive}; study them with:")
    print(f"  trajflight sql {shlex.quote(archive)} {shlex.quote(query)}")
    print(f"  trajflight report {shlex.quote(archive)} -o report.html")
