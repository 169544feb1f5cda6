"""The demo's trainer: the GRPO loop over leased batches, checkpoints, and the crash-and-resume play.

Per step the trainer leases up to ``batch_groups`` groups that carry ``advantage`` and are at most
``max_staleness`` policy versions old (as many leases as come within :data:`FILL_WAIT`), fetches them
(ragged columns, aliasing Arrow), drives ``prepare -> start_training``, takes one Adam step of the
clipped GRPO objective against the behaviour logprobs the rollout workers stored, ``finish_training``,
commits, and publishes the new weights as the next policy version (a file per version, then
``announce_policy``). Every ``checkpoint_every`` steps it checkpoints the controller and the model
together (the reward stage paused, so the job is quiescent).

A group that went stale before anyone trained it (the bound moved past it) is dropped and its prompt
generated again, so no prompt is lost. ``--resume`` plays a crash: after ``crash_after`` steps the
trainer dies holding its batch (trained, not committed); the controller restarts and the job is
restored from the last checkpoint under epoch 2, with the model of that checkpoint; the groups the
restore offers again are trained first, then epoch-2 workers generate the prompts still missing, while
the epoch-1 workers are refused.

torch is imported when the policy is made (:meth:`DemoRun.start`), after the rollout workers were
started, so that its import overlaps theirs.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from trajflight.auth import Credential
from trajflight.codec import decode
from trajflight.demo._stages import RewardStage
from trajflight.demo._summary import StepRecord, Tally
from trajflight.demo._task import weights_path
from trajflight.demo._worker import WorkerSpec, rollout_worker
from trajflight.errors import TrajflightError

__all__ = ["JOB", "DemoRun", "StalledError", "job_config", "note_restore", "prompt_numbers"]

JOB = "demo-grpo"
COLUMNS = (
    "prompt_ids",
    "response_ids",
    "response_logprobs",
    "loss_mask",
    "advantage",
    "reward",
    "top_p_ids",
    "sample_id",
)
FILL_WAIT = 0.5
"""Seconds the trainer waits for a full batch before it trains on the groups it has."""
STALL_SECONDS = 90.0
"""A run that trains nothing for this long stops (a hang is the worst way a demo can fail)."""


_ENDINGS = {
    "fenced": "stopped, fenced by a newer epoch of the job",
    "gave up": "gave up after retrying",
    "refused": "stopped, refused",
    "failed": "failed",
}


class StalledError(TrajflightError):
    """The demo made no progress for :data:`STALL_SECONDS`, or its rollout workers died."""


def job_config(args: argparse.Namespace) -> dict[str, Any]:
    """The job's configuration (a restore must pass the same)."""
    return {"default_lease_ttl": "10s", "capacity_bytes": "256MiB", "max_group_bytes": "16MiB"}


def prompt_numbers(sample_ids: Any) -> list[int]:
    """The prompt numbers of a batch's groups, in order, from sample ids ``p{prompt}/{i}``."""
    seen: dict[int, None] = {}
    for sid in sample_ids.to_pylist():
        seen[int(sid.split("/", 1)[0][1:])] = None
    return list(seen)


def note_restore(tally: Tally, result: dict[str, int]) -> None:
    """Record what ``Client.restore`` reported: the job's group counts after it (READY: the groups
    offered again), and ``lost``/``purged``/``kept`` where the ledger reports them."""
    tally.restore = {k: int(v) for k, v in result.items() if isinstance(v, int) and v}
    tally.orphans_purged += int(result.get("purged", 0))


def _writer_token(plane: Any) -> Credential | None:
    """A writer credential for the job on a plane with a deployment secret (the plane holds its keyring)."""
    keyring = getattr(plane, "keyring", None)
    return None if keyring is None else keyring.mint("demo-worker", "writer", [JOB], ttl=7 * 86400)


class _Incarnation:
    """One epoch of the job: its prompt queue, its rollout worker processes and its reward stage."""

    def __init__(self, run: DemoRun, epoch: int) -> None:
        ctx = mp.get_context("spawn")  # gRPC is not fork-safe: workers start fresh interpreters
        self.epoch = epoch
        self.todo = ctx.Queue()
        self.stop = ctx.Event()
        self.outstanding: set[int] = set()  # prompts handed to this epoch's workers, not yet trained
        a = run.args
        self.procs = []
        for worker in range(a.workers):
            spec = WorkerSpec(
                address=run.plane.address,
                job_id=JOB,
                epoch=epoch,
                worker=worker,
                samples=a.samples,
                seed=a.seed,
                weights_dir=str(run.state),
                lead=2 * a.batch_groups,
                log_level=getattr(a, "log_level", "WARNING"),
                log_json=getattr(a, "log_json", False),
                token=_writer_token(run.plane),
            )
            p = ctx.Process(target=rollout_worker, args=(spec, self.todo, self.stop, run.events), daemon=True)
            p.start()
            self.procs.append(p)
        run.tally.workers[epoch] = a.workers
        self.stage = RewardStage(run.client, JOB, batch=a.batch_groups)
        self.stage.start()

    def dispatch(self, prompts: list[int]) -> None:
        """Hand ``prompts`` to this epoch's workers."""
        for p in prompts:
            self.outstanding.add(p)
            self.todo.put(p)

    def end_stage(self) -> None:
        """Stop the reward stage (after its current lease) and wait for it."""
        self.stage.stop()
        self.stage.join(timeout=30)


class DemoRun:
    """One demo run on a started data plane (embedded or Ray).

    Args:
        args: The parsed command line.
        plane: A started ``LocalCluster`` or ``RayCluster``.
        state: Folder for checkpoints and published weights.
        note: Where one-line notes go (the progress bar's ``write`` or stderr).
    """

    def __init__(self, args: argparse.Namespace, plane: Any, state: Path, note: Any) -> None:
        self.args = args
        self.plane = plane
        self.state = state
        self.note = note
        self.client = plane.client()
        self.tally = Tally()
        self.events = mp.get_context("spawn").Queue()
        self.policy: Any = None  # made in start(), with its optimizer
        self.optimizer: Any = None
        self.version = 0
        self.incarnations: list[_Incarnation] = []
        self.on_step: Any = None  # called with the tally after each step (the progress bar)

    # ------------------------------------------------------------------ workers' events
    def drain(self) -> None:
        """Take the rollout workers' events off their queue into the tally (and print endings)."""
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            kind, worker, epoch = event[:3]
            if kind == "put":
                self.tally.puts += 1
                self.tally.put_bytes += event[4]
                self.tally.put_tokens += event[7]
            elif kind == "retry":
                self.tally.retries[event[3]] += 1
            elif kind == "done":
                self.tally.endings.setdefault((epoch, worker), ("done", ""))
            else:  # fenced / gave up / refused / failed: the worker's one line
                self.tally.endings[(epoch, worker)] = (kind, event[3])
                self.note(f"rollout worker {worker} (epoch {epoch}) {_ENDINGS[kind]}: {event[3]}")

    def _check_workers(self, inc: _Incarnation) -> None:
        """Raise when every worker of ``inc`` is gone while prompts remain (nothing would come)."""
        if any(p.is_alive() for p in inc.procs) or not inc.outstanding:
            return
        self.drain()
        codes = [p.exitcode for p in inc.procs]
        raise StalledError(
            f"every rollout worker of epoch {inc.epoch} exited (exit codes {codes}) with "
            f"{len(inc.outstanding)} prompts left; their lines above say why"
        )

    # ------------------------------------------------------------------ policy and checkpoints
    def publish_policy(self, epoch: int) -> None:
        """Publish the current weights as policy ``self.version`` of ``epoch`` and announce it."""
        from trajflight.demo._policy import publish_weights

        publish_weights(self.policy, weights_path(self.state, epoch, self.version))
        self.client.controller.announce_policy(JOB, self.version)

    def checkpoint(self, stage: RewardStage) -> None:
        """Checkpoint the controller (the reward stage held, so nothing is leased) and the model."""
        import torch

        with stage.paused():
            self.client.checkpoint(JOB, self.state / "controller.ckpt")
        saved = {
            "model": self.policy.state_dict(),
            "optim": self.optimizer.state_dict(),
            "version": self.version,
            "tally": self.tally.saved(),
        }
        tmp = self.state / "model.pt.tmp"
        torch.save(saved, tmp)
        tmp.replace(self.state / "model.pt")

    # ------------------------------------------------------------------ the loop
    def start(self) -> _Incarnation:
        """Open the job at epoch 1, start its workers with every prompt, make and publish the policy."""
        self.client.open_job(JOB, 1, job_config(self.args))
        inc = _Incarnation(self, 1)
        self.incarnations.append(inc)
        inc.dispatch(list(range(self.args.groups)))
        import torch

        from trajflight.demo._policy import Adam, make_policy

        torch.set_num_threads(1)  # the rollout workers, the servers and the controller share the cores
        self.policy = make_policy(self.args.seed)
        self.optimizer = Adam(list(self.policy.parameters()), lr=self.args.lr)
        self.publish_policy(1)
        self.checkpoint(inc.stage)
        return inc

    def train(self, inc: _Incarnation, *, until: Any, crash_after: int | None = None) -> bool:
        """Train on ``inc``'s groups until ``until()`` holds; False when the simulated crash happened."""
        trainer = self.client.trainer(JOB, owner=f"demo-trainer-e{inc.epoch}")
        last_progress = time.monotonic()
        while not until():
            self.drain()
            if inc.stage.error is not None:
                raise inc.stage.error
            leases = self._lease_batch(trainer)
            if not leases:
                if self._drop_stale(trainer, inc):
                    last_progress = time.monotonic()
                elif time.monotonic() - last_progress > STALL_SECONDS:
                    raise StalledError(
                        f"no group became trainable for {STALL_SECONDS:g}s; controller states: "
                        f"{self.client.controller.counts(JOB)}"
                    )
                self._check_workers(inc)
                continue
            last_progress = time.monotonic()
            if self.tally.first_step_at is None:
                self.tally.first_step_at = time.perf_counter()
            prompts = self._step(leases)
            if crash_after is not None and len(self.tally.curve) >= crash_after:
                for lease in leases:  # the trainer dies holding its trained batch: no commit, no heartbeat
                    lease.close()
                self.tally.crashed_after = len(self.tally.curve)
                return False
            for lease in leases:
                lease.commit()
            self.tally.last_step_at = time.perf_counter()
            inc.outstanding.difference_update(prompts)
            self.tally.lineage.extend(prompts)
            self.publish_policy(inc.epoch)
            if self.on_step is not None:
                self.on_step(self.tally)
            if len(self.tally.curve) % self.args.checkpoint_every == 0:
                self.checkpoint(inc.stage)
        return True

    def _lease_batch(self, trainer: Any) -> list[Any]:
        """Leases of up to ``batch_groups`` groups in all: as many as come within :data:`FILL_WAIT`."""
        a = self.args
        leases: list[Any] = []
        taken = 0
        end = time.monotonic() + FILL_WAIT
        while taken < a.batch_groups:
            wait = max(0.0, end - time.monotonic())
            lease = trainer.try_lease(
                a.batch_groups - taken, wait=wait, require=["advantage"], max_staleness=a.max_staleness
            )
            if lease is None:
                break
            leases.append(lease)
            taken += len(lease)
        return leases

    def _step(self, leases: list[Any]) -> list[int]:
        """One GRPO step on the leased groups (left TRAINED); returns their prompt numbers."""
        from trajflight.demo._policy import grpo_loss

        started = time.perf_counter()
        table = pa.concat_tables([lease.fetch_table(COLUMNS) for lease in leases])
        data = decode(table, layout="ragged")
        self.tally.fetch_seconds += time.perf_counter() - started
        self.tally.fetched_bytes += sum(lease.handle.nbytes for lease in leases)
        batch_id = f"e{leases[0].partitions[0].epoch}-step-{len(self.tally.curve) + 1}"
        for lease in leases:
            lease.prepare(batch_id)
            lease.start_training()
        loss = grpo_loss(self.policy, data, clip=self.args.clip)
        self.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # torch's stubs leave it untyped
        self.optimizer.step()
        for lease in leases:
            lease.finish_training()
        staleness = tuple(self.version - g.policy_version for lease in leases for g in lease.handle.groups)
        self.version += 1
        top_p = data.doubly_ragged["top_p_ids"]
        self.tally.curve.append(
            StepRecord(
                step=self.version,
                reward=float(data.tensors["reward"].mean()),
                staleness=staleness,
                tokens=int(data.ragged["response_ids"].offsets[-1]),
                candidates=float(len(top_p.values) / max(1, len(top_p.inner_offsets) - 1)),
            )
        )
        return prompt_numbers(data.arrow["sample_id"])

    def _drop_stale(self, trainer: Any, inc: _Incarnation) -> bool:
        """Drop the oldest READY groups that are past the staleness bound, giving their prompts to the
        workers again; True when one was dropped. (Normally none is: the workers' lead keeps groups
        fresh.)"""
        if not self.client.controller.counts(JOB).get("READY"):
            return False
        dropped = False
        for _ in range(self.args.batch_groups):
            lease = trainer.try_lease(1, wait=0.0, require=["advantage"])
            if lease is None:
                break
            (meta,) = lease.handle.groups
            if self.version - meta.policy_version <= self.args.max_staleness:
                lease.release()
                break
            prompts = prompt_numbers(lease.fetch_table(["sample_id"]).column("sample_id"))
            lease.commit()  # consumed without training: its data goes; the prompt is generated again
            self.tally.dropped_stale += 1
            inc.outstanding.difference_update(prompts)
            inc.dispatch(prompts)
            dropped = True
        return dropped

    def all_trained(self) -> bool:
        """Whether every prompt is in the lineage."""
        return len(self.tally.lineage) >= int(self.args.groups)

    def finish(self, *, checkpoint: bool = True) -> None:
        """Checkpoint once more (a checkpoint lets a job drop the data of the commits it covers; not
        after a failure, which may leave leases held), then stop the workers and the reward stages."""
        if checkpoint and self.incarnations and self.policy is not None:
            self.checkpoint(self.incarnations[-1].stage)
        for each in self.incarnations:
            each.stop.set()
            each.end_stage()
        for each in self.incarnations:
            for p in each.procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
        self.drain()

    # ------------------------------------------------------------------ crash and resume
    def resume(self, old: _Incarnation) -> _Incarnation:
        """Restart from the last checkpoint under epoch 2 and dispatch what the lineage still lacks."""
        import torch

        old.end_stage()  # the reward stage lived in the trainer's process: it dies with it
        steps_before = len(self.tally.curve)
        saved = torch.load(self.state / "model.pt", weights_only=False)
        self.policy.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optim"])
        self.version = saved["version"]
        self.tally.load(saved["tally"])
        self.tally.rolled_back = steps_before - len(self.tally.curve)
        self.note(
            f"trainer crashed after step {steps_before}; restarting the controller and restoring the "
            f"checkpoint of step {len(self.tally.curve)} under epoch 2"
        )
        # The controller restarts too (a new incarnation at the same address) and restores the checkpoint.
        self.plane.restart_controller()
        self.client = self.plane.client()
        result = self.client.restore(
            self.state / "controller.ckpt", job_id=JOB, epoch=2, config=job_config(self.args)
        )
        note_restore(self.tally, result)
        self.publish_policy(2)
        inc = _Incarnation(self, 2)
        self.incarnations.append(inc)
        # First the groups the restore offers again, then what the lineage still lacks.
        before = len(self.tally.lineage)
        self.train(inc, until=lambda: self._quiet(inc))
        self.tally.reoffered_trained = len(self.tally.lineage) - before
        missing = sorted(set(range(self.args.groups)) - set(self.tally.lineage) - inc.outstanding)
        inc.dispatch(missing)
        return inc

    def _quiet(self, inc: _Incarnation) -> bool:
        """Whether no group of the job waits for the trainer or the reward stage."""
        counts = self.client.controller.counts(JOB)
        busy = ("READY", "LEASED", "PREPARED", "TRAINING", "TRAINED")
        return not inc.outstanding and not any(counts.get(s) for s in busy)

    def purge_orphans(self) -> None:
        """Delete what the crashed epoch put after the checkpoint (unknown to the restored ledger)."""
        for server in self.client.controller.servers():
            purged = self.client.storage.client(server.location).fence(JOB, 2, purge=True)
            self.tally.orphans_purged += int(purged["purged_groups"])
