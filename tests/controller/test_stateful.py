"""The ledger against a simple reference model (hypothesis ``RuleBasedStateMachine``, fake clock).

Invariants checked after every step: every group is in the state the model predicts (so expiry sends
LEASED/PREPARED to READY and TRAINING/TRAINED to UNKNOWN, and nothing else moves); at most one live
lease holds a group; tokens strictly increase and a group's generation only grows; a call on an ended
lease never changes anything (no stale token is accepted); each group is committed at most once and never
offered again; capacity is never exceeded and is released only after a confirmed delete; once a
checkpoint was taken, commits are kept until a later checkpoint is confirmed (issue 14); groups reported
missing are lost for good and a server reported unreachable has none of its groups leased until its
back-off ends or a delete on it is confirmed.
"""

from __future__ import annotations

import contextlib

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from trajflight.controller import JobConfig, Ledger, Partition, Publication, checkpoint_seq
from trajflight.controller._commands import MUTATING
from trajflight.errors import CapacityExceededError, TrajflightError

CAP_BYTES = 600
CAP_GROUPS = 12
TTL = 10.0
RETRY, RETRY_MAX = 1.0, 4.0
LIVE = ("LEASED", "PREPARED", "TRAINING", "TRAINED")
STEPS = {
    "start_training": ("PREPARED", "TRAINING"),
    "finish_training": ("TRAINING", "TRAINED"),
    "commit": ("TRAINED", "COMMITTED"),
}


class Recorder:
    """The ledger, recording what a host journals: successful state-changing calls, no empty acquires."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.log: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name):
        attr = getattr(self.ledger, name)
        if name not in MUTATING:
            return attr

        def call(*args, **kwargs):
            parks = self.ledger.parks
            result = attr(*args, **kwargs)
            if result is not None or name != "acquire" or self.ledger.parks != parks:
                self.log.append((name, args, kwargs))
            return result

        return call


def _observable(ledger: Ledger) -> tuple:
    groups = {
        k: (g.state, g.generation, g.columns, g.batch_id, g.nbytes) for k, g in ledger._groups.table.items()
    }
    leases = {
        lease.token: (lease.expires_at, tuple(lease.live), dict(lease.stage)) for lease in ledger._leases
    }
    gc = {w.partition for w in ledger.gc_list()}
    job = ledger._jobs["j"]
    kept, lost = dict(job.kept), dict(job.lost)
    fences = {w.partition: w.generation for w in ledger.fence_list()}
    return (
        groups,
        leases,
        gc,
        fences,
        ledger.usage("j"),
        ledger.last_token,
        kept,
        lost,
        ledger._upkeep.reach.export(),
    )


class LedgerMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.now = 0.0
        self.L = Recorder(Ledger())
        self.base: bytes | None = None  # snapshot the journal replays from
        self.L.register_server(
            "s0",
            node="n",
            location="grpc://x",
            capacity_bytes=CAP_BYTES,
            capacity_groups=CAP_GROUPS,
            now=self.now,
        )
        config = JobConfig(
            default_lease_ttl=TTL,
            max_lease_ttl=50.0,
            max_group_bytes=100,
            server_retry_initial=RETRY,
            server_retry_max=RETRY_MAX,
        )
        self.L.open_job("j", 1, config, now=self.now)
        self.L.register_writer("j", 1, "w", node="n", now=self.now)
        self.state: dict[Partition, str] = {}
        self.gen: dict[Partition, int] = {}
        self.size: dict[Partition, int] = {}
        self.leases: dict[int, dict] = {}  # live: expires, live (ordered keys), batches {b: [keys, stage]}
        self.ended: list[int] = []
        self.max_token = 0
        self.committed: set[Partition] = set()
        self.on_gc: set[Partition] = set()
        self.checkpoints = 0  # taken
        self.durable = 0  # newest confirmed
        self.kept: dict[Partition, int] = {}  # committed after checkpoint n, not yet covered
        self.lost: set[Partition] = set()
        self.until: float | None = None  # s0 is in back-off until then
        self.failures = 0

    # ------------------------------------------------------------ model helpers
    def _expire(self):
        if self.until is not None and self.until <= self.now:
            self.until = None  # the back-off ended (its failures are remembered)
        # In the ledger's order (expiry, then token): each expired lease gives its groups the next token
        # as a fresh generation, which their storage servers are told about (the fence list).
        for token, lease in sorted(self.leases.items(), key=lambda item: (item[1]["expires"], item[0])):
            if lease["expires"] <= self.now:
                fresh = self.max_token + 1
                self._new_token(fresh)
                for key in lease["live"]:
                    if self.state[key] in ("LEASED", "PREPARED"):
                        self.state[key] = "READY"
                    else:
                        self.state[key] = "UNKNOWN"
                    self.gen[key] = fresh
                self._end(token)

    def _sync(self):
        """Apply due expiries in the ledger and in the model alike."""
        self.L.tick(self.now)
        self._expire()

    def _end(self, token):
        del self.leases[token]
        self.ended.append(token)

    def _snapshot(self):
        return {
            k: (g.state, g.generation, g.columns, g.batch_id)
            for k, g in ((k, self.L.group(k)) for k in self.state)
        }

    def _new_token(self, token):
        assert token > self.max_token, "tokens must strictly increase"
        self.max_token = token

    # ------------------------------------------------------------ rules
    @rule(sizes=st.lists(st.integers(1, 100), min_size=1, max_size=3))
    def put(self, sizes):
        for nbytes in sizes:
            self._put_one(nbytes)

    def _put_one(self, nbytes):
        self._expire()
        used = sum(self.size[k] for k in self.state)
        try:
            grant = self.L.allocate("j", 1, "w", nbytes=nbytes, now=self.now)
        except CapacityExceededError:
            assert used + nbytes > CAP_BYTES or len(self.state) + 1 > CAP_GROUPS
            return
        assert used + nbytes <= CAP_BYTES
        assert len(self.state) + 1 <= CAP_GROUPS
        self._new_token(grant.token)
        self.L.publish(
            grant.partition,
            token=grant.token,
            rows=1,
            nbytes=nbytes,
            tokens=nbytes,
            policy_version=0,
            columns=("a",),
            now=self.now,
        )
        key = grant.partition
        self.state[key], self.gen[key], self.size[key] = "READY", grant.token, nbytes

    @rule(sizes=st.lists(st.integers(1, 100), min_size=1, max_size=6))
    def put_many(self, sizes):
        """One batched allocation: the longest prefix of ``sizes`` that fits is granted, then published in
        one batched publication."""
        self._expire()
        used, groups, fits = sum(self.size[k] for k in self.state), len(self.state), 0
        for nbytes in sizes:
            if used + nbytes > CAP_BYTES or groups + 1 > CAP_GROUPS:
                break
            used, groups, fits = used + nbytes, groups + 1, fits + 1
        try:
            grants = self.L.allocate_many("j", 1, "w", nbytes=sizes, now=self.now)
        except CapacityExceededError:
            assert fits == 0
            return
        assert [g.nbytes for g in grants] == sizes[:fits]
        items = [Publication(g.partition, g.token, 1, g.nbytes, g.nbytes, 0, ("a",)) for g in grants]
        infos = self.L.publish_many(items, now=self.now)
        assert [i.partition for i in infos] == [g.partition for g in grants]
        for grant in grants:
            self._new_token(grant.token)
            key = grant.partition
            self.state[key], self.gen[key], self.size[key] = "READY", grant.token, grant.nbytes

    @rule(n=st.integers(1, 4))
    def acquire(self, n):
        self._expire()
        ready = [k for k, s in self.state.items() if s == "READY"]
        lease = self.L.acquire("j", "t", max_groups=n, now=self.now)
        if self.until is not None:  # s0, which holds every group, is in back-off
            assert lease is None, "a group of a server in back-off was leased"
            return
        if lease is None:
            assert not ready
            return
        assert len(lease.groups) == min(n, len(ready))
        self._new_token(lease.token)
        for key in lease.partitions:
            assert self.state[key] == "READY"
            assert key not in self.committed, "a committed group was offered again"
            assert lease.token > self.gen[key]
            self.state[key], self.gen[key] = "LEASED", lease.token
        self.leases[lease.token] = {"expires": self.now + TTL, "live": list(lease.partitions), "batches": {}}

    @rule(
        data=st.data(),
        op=st.sampled_from(["prepare", "start_training", "finish_training", "commit", "release", "renew"]),
        batch=st.sampled_from(["b0", "b1"]),
    )
    def lease_call(self, data, op, batch):
        self._expire()
        if not self.leases and not self.ended:
            return
        if self.leases and (not self.ended or data.draw(st.integers(0, 4)) > 0):
            token = data.draw(st.sampled_from(sorted(self.leases)))
        else:
            token = data.draw(st.sampled_from(self.ended))
            ended = self.L._leases.ended(token)
            known = sorted(ended.batches) if ended is not None else []
            if known:  # aim at a batch the ended lease really had
                batch = data.draw(st.sampled_from(known))
        self._lease_call(token, op, batch)

    @rule(data=st.data())
    def progress(self, data):
        """The common trainer path: lease if nothing is held, else renew or move one batch one step."""
        self._expire()
        if not self.leases:
            self.acquire(data.draw(st.integers(1, 4)))
            return
        token = data.draw(st.sampled_from(sorted(self.leases)))
        if data.draw(st.integers(0, 5)) == 0:
            self._lease_call(token, "renew", "b0")
            return
        batches = self.leases[token]["batches"]
        nxt = {"PREPARED": "start_training", "TRAINING": "finish_training", "TRAINED": "commit"}
        for batch, (_, stage) in batches.items():
            if stage in nxt:
                self._lease_call(token, nxt[stage], batch)
                return
        self._lease_call(token, "prepare", f"b{len(batches)}")

    @precondition(lambda self: bool(self.ended))
    @rule(data=st.data())
    def zombie(self, data):
        """A trainer whose lease ended carries on with its next step: nothing may change."""
        self._expire()
        token = data.draw(st.sampled_from(self.ended))
        lease = self.L._leases.ended(token)
        if lease is None or not lease.batches:
            return
        batch = data.draw(st.sampled_from(sorted(lease.batches)))
        nxt = {
            "PREPARED": "start_training",
            "TRAINING": "finish_training",
            "TRAINED": "commit",
            "COMMITTED": "commit",
        }
        self._lease_call(token, nxt[lease.stage[batch].value], batch)

    def _lease_call(self, token, op, batch):
        lease = self.leases.get(token)
        if lease is None:  # an ended lease: the call may repeat something already done, but change nothing
            before = self._snapshot()
            with contextlib.suppress(TrajflightError):
                self._call(op, token, batch)
            assert self._snapshot() == before
            return
        expected = self._predict(op, lease, batch)
        try:
            self._call(op, token, batch)
        except TrajflightError as exc:
            refused: TrajflightError | None = exc
        else:
            refused = None
        if refused is not None:
            assert expected is None, f"{op} refused unexpectedly: {refused}"
            return
        assert expected is not None, f"{op} accepted although the model refuses it"
        expected()

    def _call(self, op, token, batch):
        if op == "prepare":
            self.L.prepare(token, batch, now=self.now)
        elif op == "release":
            self.L.release(token, now=self.now)
        elif op == "renew":
            self.L.renew(token, now=self.now)
        else:
            getattr(self.L, op)(token, batch, now=self.now)

    def _predict(self, op, lease, batch):
        """The model's effect of a call on a live lease, or None when it must be refused."""
        token = next(t for t, v in self.leases.items() if v is lease)
        batches = lease["batches"]
        if op == "renew":
            return lambda: lease.update(expires=self.now + TTL)
        if op == "prepare":
            if batch in batches:
                return (lambda: None) if batches[batch][1] == "PREPARED" else None
            keys = [k for k in lease["live"] if self.state[k] == "LEASED"]
            if not keys:
                return None

            def apply_prepare():
                for k in keys:
                    self.state[k] = "PREPARED"
                batches[batch] = [keys, "PREPARED"]

            return apply_prepare
        if op == "release":
            keys = [k for k in lease["live"] if self.state[k] in ("LEASED", "PREPARED")]

            def apply_release():
                for k in keys:
                    self.state[k] = "READY"
                    lease["live"].remove(k)
                for b, (bkeys, _) in list(batches.items()):
                    rest = [k for k in bkeys if k not in keys]
                    if rest:
                        batches[b][0] = rest
                    else:
                        del batches[b]
                if not lease["live"]:
                    self._end(token)

            return apply_release
        prior, target = STEPS[op]
        if batch not in batches:
            return None
        keys, stage = batches[batch]
        if stage == target:
            return lambda: None
        if stage != prior:
            return None

        def apply_step():
            for k in keys:
                self.state[k] = target
            batches[batch][1] = target
            if target == "COMMITTED":
                for k in keys:
                    assert k not in self.committed, "committed twice"
                    self.committed.add(k)
                    if self.checkpoints:
                        self.kept[k] = self.checkpoints
                    else:
                        self.on_gc.add(k)
                    lease["live"].remove(k)
                if not lease["live"]:
                    self._end(token)

        return apply_step

    @rule(dt=st.sampled_from([0.0, 1.0, 4.0, 9.5, 10.0, 25.0]))
    def advance(self, dt):
        self.now += dt

    @rule()
    def tick(self):
        self._expire()
        self.L.tick(self.now)

    @rule(data=st.data())
    def deletes(self, data):
        self._expire()
        for work in self.L.take_deletes(now=self.now):
            assert work.partition in self.on_gc
            ok = data.draw(st.booleans())
            released = self.L.delete_done(work.partition, ok=ok, now=self.now, error=None if ok else "down")
            assert released == ok
            if ok:
                self.on_gc.discard(work.partition)
                for d in (self.state, self.gen, self.size):
                    del d[work.partition]
                self.until, self.failures = None, 0  # s0 answered: reached

    @precondition(lambda self: any(s == "UNKNOWN" for s in self.state.values()))
    @rule(data=st.data(), action=st.sampled_from(["requeue", "drop"]))
    def resolve(self, data, action):
        self._expire()
        unknown = sorted(k for k, s in self.state.items() if s == "UNKNOWN")
        key = data.draw(st.sampled_from(unknown))
        self.L.resolve("j", [key], action, now=self.now)
        if action == "requeue":
            self.state[key] = "READY"
        else:
            self.state[key] = "DROPPED"
            self.on_gc.add(key)

    @precondition(lambda self: not self.leases)
    @rule()
    def checkpoint(self):
        """A quiescent checkpoint: from now on commits are kept until a later one is confirmed."""
        self._expire()
        if self.leases:
            return
        data = self.L.checkpoint("j", now=self.now)
        self.checkpoints += 1
        assert checkpoint_seq(data) == self.checkpoints

    @precondition(lambda self: self.checkpoints > 0)
    @rule(data=st.data())
    def confirm(self, data):
        self._expire()
        seq = data.draw(st.integers(1, self.checkpoints))
        self.L.confirm_checkpoint("j", seq, now=self.now)
        if seq > self.durable:
            self.durable = seq
            for key in [k for k, taken in self.kept.items() if taken < seq]:
                del self.kept[key]
                self.on_gc.add(key)

    def _leave(self, token, keys):
        lease = self.leases[token]
        for k in keys:
            lease["live"].remove(k)
        for b, (bkeys, _) in list(lease["batches"].items()):
            rest = [k for k in bkeys if k not in keys]
            if rest:
                lease["batches"][b][0] = rest
            else:
                del lease["batches"][b]
        if not lease["live"]:
            self._end(token)

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data())
    def missing(self, data):
        """A trainer finds a leased group missing on its server: lost, never offered again."""
        self._expire()
        if not self.leases:
            return
        token = data.draw(st.sampled_from(sorted(self.leases)))
        open_ = [k for k in self.leases[token]["live"] if self.state[k] in ("LEASED", "PREPARED")]
        if not open_:
            return
        keys = data.draw(st.lists(st.sampled_from(open_), min_size=1, unique=True))
        left = self.L.report_unusable(token, missing=keys, now=self.now)
        assert set(left) == set(keys)
        for k in keys:
            self.state[k] = "DROPPED"
            self.on_gc.add(k)
            self.lost.add(k)
        self._leave(token, keys)

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data())
    def unreachable(self, data):
        """A trainer finds s0 not answering: the lease's untrained groups go back to READY, and none is
        leased until the back-off ends."""
        self._expire()
        if not self.leases:
            return
        token = data.draw(st.sampled_from(sorted(self.leases)))
        keys = [k for k in self.leases[token]["live"] if self.state[k] in ("LEASED", "PREPARED")]
        left = self.L.report_unusable(token, unreachable=["s0"], now=self.now)
        assert set(left) == set(keys)
        if self.until is None:
            self.failures += 1
            self.until = self.now + min(RETRY_MAX, RETRY * 2 ** (self.failures - 1))
        for k in keys:
            self.state[k] = "READY"
        self._leave(token, keys)

    @rule()
    def snapshot_and_reload(self):
        """A host compacts its journal: the ledger continues from its own snapshot, live leases and all."""
        data = self.L.snapshot()
        self.L = Recorder(Ledger.from_snapshot(data))
        self.base = data

    # ------------------------------------------------------------ invariants
    @invariant()
    def journal_replay_rebuilds_the_same_state(self):
        """What a host journals is enough: replaying it from the last snapshot gives the same ledger."""
        replayed = Ledger() if self.base is None else Ledger.from_snapshot(self.base)
        for name, args, kwargs in self.L.log:
            getattr(replayed, name)(*args, **kwargs)
        replayed.tick(self.now)
        self._sync()
        assert _observable(replayed) == _observable(self.L.ledger)

    @invariant()
    def states_match_the_model(self):
        self._sync()
        assert set(self.L._groups.table) == set(self.state), "a group was deleted without a confirmed delete"
        for key, state in self.state.items():
            g = self.L.group(key)
            assert g.state.value == state, (key, g.state, state)
            assert g.generation == self.gen[key]

    @invariant()
    def one_live_lease_per_group(self):
        self._sync()
        seen: set[Partition] = set()
        for lease in self.L._leases:
            assert seen.isdisjoint(lease.live)
            seen |= set(lease.live)
        assert seen == {k for k, s in self.state.items() if s in LIVE}
        assert set(self.L.live_leases()) == set(self.leases)

    @invariant()
    def capacity_bounded_and_released_only_after_delete(self):
        used_bytes, used_groups = self.L.usage("j")
        assert used_bytes == sum(self.size.values()) <= CAP_BYTES
        assert used_groups == len(self.state) <= CAP_GROUPS
        (server,) = self.L.servers()
        assert (server.used_bytes, server.used_groups) == (used_bytes, used_groups)

    @invariant()
    def kept_and_lost_match_the_model(self):
        counts = self.L.counts("j")
        assert dict(self.L._jobs["j"].kept) == self.kept
        assert counts["kept"] == len(self.kept)
        assert {x.partition for x in self.L.lost("j")} == self.lost
        for key in self.lost:
            assert self.state.get(key, "DROPPED") == "DROPPED", "a lost group came back"

    @invariant()
    def committed_groups_stay_committed(self):
        for key in self.committed:
            assert self.state.get(key, "COMMITTED") == "COMMITTED"


LedgerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestLedgerMachine = LedgerMachine.TestCase
