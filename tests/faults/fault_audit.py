"""A fault scenario and its audit: the invariants checked by counting ``sample_id``\\ s across the run.

A :class:`Scenario` is one job on a :class:`~faultkit.Plane`: it starts writer and trainer processes,
lets the run settle (as an operator would: requeueing ``UNKNOWN`` groups, which were never committed),
and then checks, from the processes' own event logs:

* **none lost**: every group a writer put and got acknowledged is trained exactly once in the lineage of
  the final model, or is reported lost with its partition by the controller, or was put after the
  checkpoint a restore rolled back to (and so must be purged, and counted by the restore);
* **none trained twice** within the lineage;
* **nothing partial**: every group a trainer fetched, and every group ``list_flights`` shows, has the rows
  its writer put;
* **no orphan bytes**: every storage server's ``stats`` shows no group, no byte, no reservation and no
  pending put, and once the plane is stopped ``/dev/shm`` holds nothing of it;
* **capacity back to zero**: ``usage(job) == (0, 0)``;
* **no crash**: no plane process died unless the scenario killed it, and no child hit an untyped error.

The lineage: without checkpoints the trainers are data-parallel ranks of one model, whose lineage is what
they committed (a commit is the model taking the update); a commit whose answer was lost (the controller
died) counts when the ledger has the group committed and no other trainer committed it. After a restore,
the lineage is the one saved with the checkpoint restored from, plus what the new incarnation committed:
what the rolled-back incarnation trained after that checkpoint is not in it.

Every violation is collected (not just the first) and raised together; with the environment variable
``FAULTS_REPORT`` naming a file, each scenario appends one JSON line with its findings (the figures of
RELIABILITY.md).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from faultkit import FAST, Hang, Plane, Proc, held_by, wait_for

from trajflight.errors import NotFoundError, TrajflightError

Part = tuple[str, int, int]
BUSY = ("ALLOCATED", "READY", "LEASED", "PREPARED", "TRAINING", "TRAINED", "UNKNOWN")


def key_of(sample_id: str) -> str:
    """The attempt a sample id belongs to (``{writer}-a{n}/{i}`` -> ``{writer}-a{n}``)."""
    return sample_id.rsplit("/", 1)[0]


def lost_partitions(client: Any, job: str) -> set[Part]:
    """The partitions the controller reports lost for ``job`` (its lost-groups query; see RELIABILITY.md:
    the one place that names it)."""
    for name in ("lost_groups", "lost"):
        query = getattr(client.controller, name, None)
        if callable(query):
            return {tuple(getattr(item, "partition", item)) for item in query(job)}  # type: ignore[misc]
    return set()


def purged_reported(result: dict[str, Any], counts: dict[str, int]) -> int | None:
    """How many groups a restore says it purged (the rolled-back incarnation's puts after the checkpoint)."""
    value = result.get("purged", counts.get("purged"))
    return None if value is None else int(value)


class Findings:
    """Violations of one scenario, collected (not only the first) and raised together by :meth:`finish`."""

    def __init__(self) -> None:
        self.violations: list[tuple[str, str]] = []

    def release(self, proc: Proc) -> None:
        """Let a ``held`` trainer start polling."""
        proc.wait_event("paused", step="polling")
        proc.cont()

    def violation(self, kind: str, detail: str) -> None:
        """Record a violation (once: a scan repeated over time finds the same one again)."""
        entry = (kind, detail[:1500])
        if entry not in self.violations:
            self.violations.append(entry)

    def expect(self, kind: str, what: str, check: Any, timeout: float) -> bool:
        """Wait for ``check`` (see :func:`~faultkit.wait_for`); a :class:`Hang` is recorded as a violation
        of ``kind``. Returns whether it came."""
        try:
            wait_for(what, check, timeout)
        except Hang as exc:
            self.violation(kind, str(exc))
            return False
        return True

    def expect_event(self, kind: str, proc: Proc, ev: str, timeout: float = 20.0, **match: Any) -> Any:
        """Wait for ``proc``'s event ``ev`` (see :meth:`~faultkit.Proc.wait_event`); a :class:`Hang` is
        recorded as a violation of ``kind``. Returns the event, or None."""
        try:
            return proc.wait_event(ev, timeout, **match)
        except Hang as exc:
            self.violation(kind, str(exc))
            return None

    def finish(self) -> None:
        """Report, and raise the violations."""
        self.report()
        if self.violations:
            lines = "\n".join(f"  [{kind}] {detail}" for kind, detail in self.violations)
            raise AssertionError(f"{len(self.violations)} invariant violations:\n{lines}")

    def report(self) -> None:
        path = os.environ.get("FAULTS_REPORT")
        if not path:
            return
        kinds = Counter(kind for kind, _ in self.violations)
        record = {
            "scenario": os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0],
            "violations": dict(kinds),
            "details": [f"[{k}] {d[:300]}" for k, d in self.violations],
        }
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


class Scenario(Findings):
    """One job of a fault scenario: its processes, the settling of the run, and its audit.

    Args:
        plane: The running plane.
        job: The job id (unique in the plane).
        config: Job settings over :data:`~faultkit.FAST`.
    """

    def __init__(self, plane: Plane, job: str, config: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.plane = plane
        self.job = job
        self.config = {**FAST, **(config or {})}
        self.writers: list[Proc] = []
        self.trainers: list[Proc] = []
        self.stop_file = plane.root / f"stop-{job}"
        self.expected_rows: dict[Part, int] = {}  # rows of groups put by raw clients, by partition
        self.restore: dict[str, Any] | None = None  # after restore(): what it said and where it went back to
        self.resumed_from: Path | None = None  # the lineage file of the checkpoint restored from
        self.requeued: set[Part] = set()

    # ------------------------------------------------------------------ the run
    @property
    def client(self) -> Any:
        return self.plane.client()

    def open(self, epoch: int = 1) -> None:
        self.client.open_job(self.job, epoch, self.config)

    def writer(self, name: str, *, epoch: int = 1, groups: int = 4, **opts: Any) -> Proc:
        """Start a writer process (options: see ``proc_writer.py``; ``die_at``/``pause_at`` take a step)."""
        args = ["--address", self.plane.address, "--job", self.job, "--epoch", str(epoch)]
        args += ["--writer-id", name, "--groups", str(groups), *_flags(opts)]
        proc = self.plane.spawn(f"{self.job}.{name}", "proc_writer.py", *args)
        self.writers.append(proc)
        return proc

    def trainer(self, name: str, *, held: bool = False, **opts: Any) -> Proc:
        """Start a trainer process (options: see ``proc_trainer.py``). ``held``: it stops itself before
        its first poll until :meth:`release` (so it starts up alongside a victim, not after it)."""
        if held:
            given = opts.get("pause_at") or []
            opts["pause_at"] = [*([given] if isinstance(given, str) else given), "polling@1"]
        args = ["--address", self.plane.address, "--job", self.job, "--owner", name]
        args += ["--stop-file", str(self.stop_file), *_flags(opts)]
        proc = self.plane.spawn(f"{self.job}.{name}", "proc_trainer.py", *args)
        proc.checkpointing = bool(opts.get("checkpoint_every"))
        self.trainers.append(proc)
        return proc

    def local_writer(self, name: str, *, epoch: int = 1) -> LocalWriter:
        """A writer in the test process (no fault of its own), logging as writer processes do."""
        writer = LocalWriter(self, name, epoch)
        self.writers.append(writer)  # type: ignore[arg-type]
        return writer

    def counts(self) -> dict[str, int]:
        return dict(self.client.controller.counts(self.job))

    def states(self, parts: Iterable[Part]) -> dict[Part, str | None]:
        """Each partition's state on the controller (None: it does not know it, e.g. deleted)."""
        out: dict[Part, str | None] = {}
        for part in parts:
            try:
                out[part] = str(self.client.controller.group(part).state)
            except NotFoundError:
                out[part] = None
        return out

    def known_parts(self) -> set[Part]:
        """Every partition a writer was granted or a trainer leased."""
        parts: set[Part] = set(self.expected_rows)
        for proc in self.writers:
            for e in proc.events():
                if e["ev"] == "granted":
                    parts.update(tuple(p) for p in e["parts"])
        for proc in self.trainers:
            for e in proc.events():
                if e["ev"] == "leased":
                    parts.update(tuple(p) for p in e["parts"])
        return {p for p in parts if p[0] == self.job}

    def paused_lease(self, trainer: Proc, step: str) -> tuple[int, list[Part], list[int]]:
        """The lease a trainer stopped itself on at ``step`` (marked stopped): token, partitions,
        generations."""
        paused = trainer.wait_event("paused", step=step)
        trainer.stopped = True
        leased = trainer.wait_event("leased", token=paused["token"])
        return paused["token"], [tuple(p) for p in leased["parts"]], leased["gens"]  # type: ignore[misc]

    def lease_gone(self, parts: Sequence[Part], gens: Sequence[int]) -> bool:
        """Every group of an old lease is out of it: re-granted (higher generation), back to READY,
        UNKNOWN, or committed by another holder."""
        for part, gen in zip(parts, gens, strict=True):
            try:
                info = self.client.controller.group(part)
            except NotFoundError:
                continue
            if info.generation <= gen and str(info.state) not in ("READY", "UNKNOWN", "COMMITTED"):
                return False
        return True

    def requeue_unknown(self) -> int:
        """As an operator: offer UNKNOWN groups again (they were never committed). Returns how many."""
        unknown = [p for p, s in self.states(self.known_parts()).items() if s == "UNKNOWN"]
        if unknown:
            self.client.controller.resolve(self.job, unknown, "requeue")
            self.requeued.update(unknown)
        return len(unknown)

    def restore_latest(self, ckpt_dir: Path, trainer: Proc, *, epoch: int = 2) -> list[str]:
        """Restart the job as its operator would after a crash: a fresh controller, restored from the
        newest complete checkpoint ``trainer`` wrote in ``ckpt_dir`` under ``epoch``. Returns the lineage
        saved with that checkpoint (the model resumed from)."""
        done = sorted(int(p.stem.split("-")[1]) for p in ckpt_dir.glob("controller-*.ckpt"))
        assert done, f"no checkpoint in {ckpt_dir}"
        n = done[-1]
        (event,) = [e for e in trainer.events() if e["ev"] == "checkpointed" and e["n"] == n]
        self.plane.restart_controller(fresh=True)
        self.do_restore(ckpt_dir / f"controller-{n}.ckpt", epoch=epoch, t0=event["t0"])
        self.resumed_from = ckpt_dir / f"lineage-{n}.json"
        return list(json.loads(self.resumed_from.read_text())["lineage"])

    def do_restore(self, ckpt: Path, *, epoch: int, t0: float) -> dict[str, Any]:
        """Restore the job from ``ckpt`` (a checkpoint taken at monotonic time ``t0``) under ``epoch``."""
        result = dict(self.client.restore(ckpt, job_id=self.job, epoch=epoch, config=self.config))
        self.restore = {"result": result, "t0": t0, "epoch": epoch}
        return result

    # ------------------------------------------------------------------ settling
    def settle(self, *, timeout: float = 30.0, requeue: bool = True) -> None:
        """Let the run finish: writers exit, every group reaches an end (UNKNOWN ones requeued when
        ``requeue``), trainers are told to stop; then capacity and storage must drain to zero.

        Hangs and leftovers are recorded as violations (checked by :meth:`verify`), not raised.
        """
        deadline = time.monotonic() + timeout
        for proc in self.writers:
            if proc.alive() and not proc.stopped:
                try:
                    proc.wait(max(1.0, deadline - time.monotonic()))
                except Hang as exc:
                    self.violation("hang", f"writer did not finish: {exc}")
        last_scan = 0.0
        counts: dict[str, int] = {}
        while True:
            try:
                counts = self.counts()
                if requeue and counts.get("UNKNOWN"):
                    self.requeue_unknown()
                    counts = self.counts()
            except TrajflightError as exc:
                counts = {"error": 1, "detail": str(exc)}  # type: ignore[dict-item]
            if time.monotonic() - last_scan > 1.0:
                self.scan_visible()
                last_scan = time.monotonic()
            # TRAINED may wait for a checkpointing trainer's checkpoint, which it takes when told to stop.
            held = any(p.checkpointing and p.alive() for p in self.trainers)
            if not any(counts.get(s) for s in BUSY if s != "TRAINED" or not held) and "error" not in counts:
                break
            if time.monotonic() > deadline:
                self.violation("hang", f"job never settled within {timeout:g}s: {_busy(counts)}")
                break
            time.sleep(0.1)
        self.stop_file.touch()
        for proc in self.trainers:
            if proc.alive() and not proc.stopped:
                try:
                    proc.wait(max(5.0, deadline - time.monotonic()))
                except Hang as exc:
                    self.violation("hang", f"trainer did not stop: {exc}")
        try:
            left = self.counts()
        except TrajflightError as exc:
            left = {"error": 1, "detail": str(exc)}  # type: ignore[dict-item]
        if any(left.get(s) for s in BUSY):
            self.violation("hang", f"groups left in flight after the trainers stopped: {_busy(left)}")
        self.scan_visible()
        self.drain(timeout=max(10.0, deadline - time.monotonic()))

    def drain(self, *, timeout: float) -> None:
        """Capacity back to zero on the controller, nothing left on any storage server."""
        try:
            wait_for(
                "usage(job) back to (0, 0)", lambda: self.client.controller.usage(self.job) == (0, 0), timeout
            )
        except Hang:
            usage = _safe(lambda: self.client.controller.usage(self.job))
            self.violation("capacity", f"usage({self.job}) stayed {usage}; counts {_safe(self.counts)}")
        for i, server in enumerate(self.plane.servers):
            if server.proc is None or not server.proc.alive() or server.proc.stopped:
                continue
            try:
                wait_for(
                    f"{server.server_id} empty", lambda i=i: not held_by(self.plane.storage(i).stats()), 10.0
                )
            except Hang:
                held = _safe(lambda i=i: held_by(self.plane.storage(i).stats()))
                self.violation("orphan", f"{server.server_id} still holds {held}")

    def scan_visible(self) -> None:
        """What a bare Flight client sees (``list_flights``, ``do_get``): no group with fewer rows than
        its writer put."""
        intended = self.intended_rows()
        for i, server in enumerate(self.plane.servers):
            if server.proc is None or not server.proc.alive() or server.proc.stopped:
                continue
            try:
                listed = self.plane.storage(i).list_groups(self.job)
            except TrajflightError:
                continue
            for n, info in enumerate(listed):
                part = (info.key.job_id, info.key.epoch, info.key.group_id)
                want = intended.get(part)
                if want is not None and info.num_rows != want:
                    self.violation(
                        "partial", f"list_flights shows {part} with {info.num_rows} of {want} rows"
                    )
                if n < 3 and want is not None:
                    try:
                        got = self.plane.storage(i).get([info.key]).num_rows
                    except TrajflightError:
                        continue
                    if got != want:
                        self.violation("partial", f"do_get of {part} read {got} of {want} rows")

    # ------------------------------------------------------------------ the audit
    def intended_rows(self) -> dict[Part, int]:
        """Rows each known partition was put with (writers' attempts, raw puts)."""
        rows_of: dict[str, int] = {}
        out: dict[Part, int] = dict(self.expected_rows)
        for proc in self.writers:
            events = proc.events()
            for e in events:
                if e["ev"] == "attempt":
                    rows_of[e["key"]] = e["rows"]
            for e in events:
                if e["ev"] == "granted":
                    for key, part in zip(e["keys"], e["parts"], strict=False):
                        out[tuple(part)] = rows_of.get(key, 0)  # type: ignore[index]
        return out

    def puts(self) -> dict[str, dict[str, Any]]:
        """Every attempt by key: rows, acked, partition, when acknowledged."""
        out: dict[str, dict[str, Any]] = {}
        for proc in self.writers:
            for e in proc.events():
                if e["ev"] == "attempt":
                    out[e["key"]] = {"rows": e["rows"], "acked": False, "part": None, "t": e["t"]}
                elif e["ev"] == "granted":
                    for key, part in zip(e["keys"], e["parts"], strict=False):
                        out[key]["part"] = tuple(part)
                elif e["ev"] == "acked":
                    out[e["key"]].update(acked=True, part=tuple(e["part"]), t_ack=e["t"], rows=e["rows"])
        return out

    def committed(self, trainers: Sequence[Proc]) -> list[str]:
        """The sample ids ``trainers`` committed, in order; a commit whose answer was lost counts when the
        ledger has the group committed and no trainer committed it for sure."""
        sure: list[str] = []
        unsure: list[list[dict[str, Any]]] = []
        for proc in trainers:
            fetched: dict[int, list[dict[str, Any]]] = {}
            committing: set[int] = set()
            done: set[int] = set()
            for e in proc.events():
                if e["ev"] == "fetched":
                    fetched[e["token"]] = e["groups"]
                elif e["ev"] == "committing":
                    committing.add(e["token"])
                elif e["ev"] == "committed":
                    done.add(e["token"])
                    sure += [s for g in fetched.get(e["token"], []) for s in g["samples"]]
            unsure += [fetched[t] for t in committing - done if t in fetched]
        taken = set(sure)
        for groups in unsure:
            for g in groups:
                if g["samples"] and g["samples"][0] in taken:
                    continue
                state = self.states([tuple(g["part"])])[tuple(g["part"])]  # type: ignore[index]
                if state in (None, "COMMITTED"):
                    sure += g["samples"]
        return sure

    def verify(self, lineage: list[str] | None = None) -> None:
        """Check every invariant (see the module docstring) and raise one AssertionError naming every
        violation. ``lineage``: the final model's lineage (default: every trainer's commits)."""
        if lineage is None:
            lineage = self.committed(self.trainers)
        puts = self.puts()
        counts = _safe(self.counts)
        counts = counts if isinstance(counts, dict) else {}
        lost = _safe(lambda: lost_partitions(self.client, self.job))
        if not isinstance(lost, set):
            self.violation("lost", f"the lost-groups query failed: {lost}")
            lost = set()
        trained = Counter(lineage)
        twice = sorted(s for s, n in trained.items() if n > 1)
        if twice:
            self.violation("duplicate", f"{len(twice)} samples trained twice: {twice[:8]}")
        for sid in trained:
            if key_of(sid) not in puts:
                self.violation("phantom", f"trained {sid}, which no writer put")
                break
        purged: list[str] = []
        t0 = self.restore["t0"] if self.restore else None
        for key, put in puts.items():
            samples = [f"{key}/{i}" for i in range(put["rows"])]
            n = sum(1 for s in samples if s in trained)
            if 0 < n < len(samples):
                self.violation("partial", f"group {key} {put['part']}: {n} of {len(samples)} samples trained")
            if not put["acked"] or n:
                if n and put["part"] in lost:
                    self.violation("lost", f"group {key} {put['part']} is reported lost but was trained")
                continue
            if put["part"] in lost:
                continue
            if t0 is not None and put["t_ack"] > t0:
                purged.append(key)
                continue
            self.violation("lost", f"acknowledged group {key} {put['part']} was never trained (not reported)")
        if "lost" in counts and counts["lost"] != len(lost):
            self.violation("lost", f"counts()['lost'] is {counts['lost']}, the lost query lists {len(lost)}")
        if self.restore is not None:
            said = purged_reported(self.restore["result"], counts)
            unacked = sum(1 for p in puts.values() if not p["acked"] and p["t"] > t0)
            # A restore that purged nothing need not say so; one that must purge must count.
            if (said is None and purged) or (
                said is not None and not len(purged) <= said <= len(purged) + unacked
            ):
                self.violation(
                    "lost",
                    f"{len(purged)} acknowledged groups were put after the checkpoint and not trained, but "
                    f"the restore reports {said!r} purged: {purged[:6]}",
                )
        self.check_fetches(puts)
        self.check_processes()
        self.finish()

    def check_fetches(self, puts: dict[str, dict[str, Any]]) -> None:
        """Through the client: every group a trainer fetched had all its rows."""
        for proc in self.trainers:
            for e in proc.events():
                if e["ev"] != "fetched":
                    continue
                for g in e["groups"]:
                    put = puts.get(key_of(g["samples"][0])) if g["samples"] else None
                    if put is not None and g["rows"] != put["rows"]:
                        self.violation(
                            "partial", f"{proc.name} fetched {g['part']} with {g['rows']} of {put['rows']}"
                        )

    def check_processes(self) -> None:
        for crash in self.plane.crashed():
            self.violation("crash", crash)
        for proc in [*self.writers, *self.trainers]:
            for e in proc.events():
                if e["ev"] == "crash":
                    self.violation("crash", f"{proc.name}: untyped error {e['error']}")

    def finish(self) -> None:
        """Stop the plane cleanly, check /dev/shm, report, and raise the violations."""
        for proc in [*self.writers, *self.trainers]:
            proc.close()
        # A plane shared by several scenarios is checked for /dev/shm when it stops (conftest); here its
        # arenas must hold no live segment (checked by drain()).
        left = [] if self.plane.shared else self.plane.stop_cleanly()
        if left:
            self.violation("orphan", f"/dev/shm still holds {len(left)} files of the run: {left[:5]}")
        super().finish()


class LocalWriter:
    """Puts groups from the test process with the public writer, logging the events a writer process
    logs (so the audit counts them alike); it is never faulted."""

    def __init__(self, scenario: Scenario, name: str, epoch: int) -> None:
        from _childkit import Events

        self.name = name
        self.events_path = scenario.plane.root / f"{scenario.job}.{name}.events"
        self._log = Events(str(self.events_path))
        self._writer = scenario.client.writer(scenario.job, epoch, writer_id=name)
        self._n = 0
        self.stopped = False

    def put(self, groups: int = 1, *, samples: int = 4, median: float = 32) -> list[Any]:
        """Get ``groups`` groups acknowledged; a put refused with a typed error is regenerated under new
        ids (at most 5 times a group), as a rollout worker does."""
        from trajflight.workload import make_workload

        infos = []
        for _ in range(groups):
            for attempt in range(5):
                (g,) = make_workload(1, samples, seed=self._n, response_median=median)
                key = f"{self.name}-a{self._n}"
                self._n += 1
                self._log.emit("attempt", key=key, rows=samples)
                try:
                    info = self._writer.put(**g.columns(sample_ids=[f"{key}/{i}" for i in range(samples)]))
                except TrajflightError as exc:
                    self._log.emit("failed", keys=[key], error=str(exc)[:300])
                    if attempt == 4:
                        raise
                    continue
                self._log.emit("granted", keys=[key], parts=[list(info.partition)], locations=[info.location])
                self._log.emit(
                    "acked", key=key, part=list(info.partition), rows=info.rows, server=info.server_id
                )
                infos.append(info)
                break
        return infos

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.events_path.read_text().splitlines() if line]

    def alive(self) -> bool:
        return False

    def wait(self, timeout: float) -> int:
        return 0

    def close(self) -> None:
        pass


def _flags(opts: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, value in opts.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif isinstance(value, list | tuple):
            for v in value:
                out += [flag, str(v)]
        elif value is not None and value is not False:
            out += [flag, str(value)]
    return out


def _busy(counts: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in counts.items() if v and (k in BUSY or k == "detail")}


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:
        return f"<{type(exc).__name__}: {exc}>"
