"""The demo's rollout workers: processes that sample groups from the current policy and put them.

Each worker takes prompt numbers from its incarnation's queue, waits while the job already holds
``lead`` groups the trainer has not taken (so no group waits long enough to go stale), picks up the
newest policy version the trainer announced (weights from the file of that version, then
``ack_policy``), samples a group, scores it and puts it. It reports every outcome on an event queue;
the parent prints and counts them.

Every call a worker makes to the data plane goes through :meth:`_Worker.guarded`, the one place that
handles the refusals a restart of the job or of the controller can cause:

* ``StaleFenceError``: the job restarted under a newer epoch: this worker is a zombie and stops;
* ``UnavailableError``, ``DeadlineExceededError``, ``CapacityExceededError``, ``LeaseExpiredError``
  and ``NotFoundError`` (the controller restarted and the job is not restored yet; a grant it no longer
  knows): retried for :data:`RETRY_BUDGET` seconds, then the worker gives up;
* any other ``TrajflightError``: the worker stops and says why.

Each ends the worker with one line (an event the parent prints), never a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from trajflight.auth import Credential

__all__ = ["RETRY_BUDGET", "WorkerSpec", "refusal_kind", "rollout_worker"]

T = TypeVar("T")

RETRY_BUDGET = 30.0
"""Seconds a worker keeps retrying a call refused for a passing reason (a controller restart)."""
_TRANSIENT = ("UnavailableError", "DeadlineExceededError", "CapacityExceededError", "LeaseExpiredError")


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a rollout worker process needs (picklable: workers are spawned).

    Attributes:
        address: The data plane's address.
        job_id: The job.
        epoch: The epoch it writes under.
        worker: Its number within the incarnation.
        samples: K, samples per group.
        seed: The run's seed (prompts and sampling are seeded from it and the prompt number).
        weights_dir: Where the trainer publishes the weights of each policy version.
        lead: Most groups the job may hold that no trainer took yet before this worker waits.
        log_level, log_json: The demo's ``--log-level`` and ``--log-json``, set up in the worker process.
        token: The worker's writer credential on a plane with a deployment secret (None: none needed).
    """

    address: str
    job_id: str
    epoch: int
    worker: int
    samples: int
    seed: int
    weights_dir: str
    lead: int
    log_level: str = "WARNING"
    log_json: bool = False
    token: Credential | None = None


def refusal_kind(exc: BaseException) -> str:
    """How a worker treats an error from the data plane: ``"fenced"`` (stop: a newer epoch took over),
    ``"transient"`` (retry for a while) or ``"fatal"`` (stop and say why)."""
    from trajflight.errors import NotFoundError, StaleFenceError, TrajflightError

    if isinstance(exc, StaleFenceError):
        return "fenced"
    if isinstance(exc, NotFoundError) or type(exc).__name__ in _TRANSIENT:
        return "transient"
    # A Flight call cancelled by a controller shutting down arrives as a bare TrajflightError until
    # flight_server/_errors.py maps CANCELLED to UnavailableError; this branch goes once it does.
    if type(exc) is TrajflightError and "CANCELLED" in str(exc):
        return "transient"
    return "fatal"


def short(message: str, limit: int = 100) -> str:
    """A message on one line: its first clause (up to ``;``), at most ``limit`` characters."""
    text = " ".join(message.split()).split("; ", 1)[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Stop(Exception):
    """Ends a worker: ``kind`` is ``"fenced"``, ``"gave up"`` or ``"refused"``."""

    def __init__(self, kind: str, what: str, exc: BaseException) -> None:
        super().__init__(kind)
        self.kind = kind
        self.line = f"{what}: {type(exc).__name__}: {short(str(exc))}"


class _Worker:
    """One rollout worker's state inside its process."""

    def __init__(self, spec: WorkerSpec, events: Any) -> None:
        self.spec = spec
        self.events = events
        self.version = -1
        self.engine: Any = None
        self.writer: Any = None
        self.client: Any = None

    def emit(self, *event: Any) -> None:
        self.events.put((event[0], self.spec.worker, self.spec.epoch, *event[1:]))

    def guarded(self, what: str, call: Callable[[], T]) -> T:
        """Run one data-plane call, handling every refusal as the module docstring says."""
        from trajflight.errors import TrajflightError

        deadline = time.monotonic() + RETRY_BUDGET
        pause = 0.05
        while True:
            try:
                return call()
            except TrajflightError as exc:
                kind = refusal_kind(exc)
                if kind == "fenced":
                    raise _Stop("fenced", what, exc) from None
                if kind == "fatal":
                    raise _Stop("refused", what, exc) from None
                if time.monotonic() + pause > deadline:
                    raise _Stop("gave up", what, exc) from None
                self.emit("retry", type(exc).__name__)
                time.sleep(pause)
                pause = min(1.0, pause * 2)

    def run(self, todo: Any, stop: Any) -> None:
        import numpy as np

        import trajflight
        from trajflight.codec import DoublyRagged
        from trajflight.demo._task import make_prompt, sample_group

        spec = self.spec
        self.client = self.guarded("connect", lambda: trajflight.connect(spec.address, token=spec.token))
        writer_id = f"rollout-e{spec.epoch}-w{spec.worker}"
        self.writer = self.guarded(
            "register", lambda: self.client.writer(spec.job_id, spec.epoch, writer_id=writer_id)
        )
        while True:
            try:
                prompt_no = todo.get(timeout=0.1)
            except queue.Empty:
                if stop.is_set():
                    return
                continue
            self.wait_for_room()
            engine = self.sync_policy()
            prompt = make_prompt(spec.seed, prompt_no)
            rng = np.random.default_rng([spec.seed, prompt_no, 1])
            started = time.perf_counter()
            rollout = sample_group(engine, prompt, spec.samples, rng)
            generate_ms = (time.perf_counter() - started) * 1e3
            offsets = rollout.offsets
            columns = {
                "prompt_ids": prompt,
                "response_ids": (rollout.response_ids, offsets),
                "response_logprobs": (rollout.response_logprobs, offsets),
                "reward": rollout.rewards,
                "top_p_ids": DoublyRagged(rollout.top_p_ids, offsets, rollout.top_p_offsets),
                "top_p_probs": DoublyRagged(rollout.top_p_probs, offsets, rollout.top_p_offsets),
                "finish_reason": rollout.finish_reasons,
                "telemetry": [{"generate_ms": generate_ms}] * spec.samples,
                "sample_ids": [f"p{prompt_no}/{i}" for i in range(spec.samples)],
            }
            meta = self.guarded("put", functools.partial(self.writer.put, **columns))
            self.emit(
                "put", prompt_no, meta.nbytes, self.version, float(np.mean(rollout.rewards)), int(offsets[-1])
            )

    def wait_for_room(self) -> None:
        """Wait while the job holds ``lead`` or more groups no trainer has taken (READY or LEASED)."""
        spec = self.spec
        while True:
            counts = self.guarded("counts", lambda: self.client.controller.counts(spec.job_id))
            if counts.get("READY", 0) + counts.get("LEASED", 0) < spec.lead:
                return
            time.sleep(0.05)  # a poll, so kept rare: the controller serves the trainer too

    def sync_policy(self) -> Any:
        """The engine of the newest announced policy version: loaded (and acknowledged) when newer than
        the one held; waits for the first weights of this epoch."""
        from trajflight.demo._task import Engine, load_weights, weights_path

        spec = self.spec
        while True:
            status = self.guarded("policy_status", lambda: self.client.controller.policy_status(spec.job_id))
            if status.version == self.version:
                return self.engine
            weights = load_weights(weights_path(spec.weights_dir, spec.epoch, status.version))
            if weights is not None:
                break
            if self.engine is not None:
                return self.engine  # not this epoch's weights (a zombie asking a restarted job)
            time.sleep(0.05)  # the trainer publishes the first weights once it has made the policy
        self.engine = Engine(weights)
        self.guarded("ack_policy", lambda: self.writer.ack_policy(status.version))
        self.version = status.version
        return self.engine


def rollout_worker(spec: WorkerSpec, todo: Any, stop: Any, events: Any) -> None:
    """A rollout worker process: put groups for the prompts on ``todo`` until ``stop`` is set and
    ``todo`` is empty, or until refused. Reports ``put``/``retry`` events, at most one ending event
    (``fenced``, ``gave up``, ``refused`` or ``failed``) and always ``done`` last, on ``events``."""
    from trajflight import logs

    logs.setup_logging(spec.log_level, json_lines=spec.log_json)  # the worker process's entry
    worker = _Worker(spec, events)
    try:
        worker.run(todo, stop)
    except _Stop as end:
        worker.emit(end.kind, end.line)
    except KeyboardInterrupt:  # Ctrl-C reaches every process of the terminal: the parent reports it
        pass
    except Exception as exc:  # a bug, not a refusal: still one line, with where it happened
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
        worker.emit("failed", f"{type(exc).__name__}: {short(str(exc))}{where}")
    finally:
        if worker.client is not None:
            with contextlib.suppress(Exception):  # already closed by a failure it reported
                worker.client.close()
        worker.emit("done")
