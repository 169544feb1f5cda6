"""The fuzzing kit: a storage server stocked with a known baseline, raw senders under deadlines, the check
that every bad input got a typed refusal, a log of the distinct cases run, and the end-of-run check that
the server is healthy and unchanged (same groups, bytes and generations, consistent stats).

Each fuzz module shares one server (``stocked_server``): starting one costs more than a hundred cases.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
from flight_testkit import make_group

from trajflight.errors import DeadlineExceededError, TrajflightError
from trajflight.flight_server import GroupRead, LeaseToken, ShmArena, StorageClient, StorageServer
from trajflight.flight_server._errors import from_flight_error
from trajflight.flight_server.shm._local import LocalChannel
from trajflight.keys import Partition

JOB, EPOCH = "fuzz", 1
"""The baseline's job and epoch; bad inputs name its groups so that any accepted one would show."""
DEADLINE = 10.0
"""Every call's deadline: a hang is a failure, never a wait."""
FRESH = 1000
"""Group ids from here on are never stored: puts of them (tampered) must all be refused."""


@dataclass
class CaseLog:
    """The distinct cases a module ran, by kind (a case: its target and the exact bytes sent)."""

    digests: dict[str, set[str]] = field(default_factory=dict)

    def add(self, kind: str, *parts: object) -> None:
        digest = hashlib.sha256()
        for part in parts:
            digest.update(bytes(part) if isinstance(part, bytes | bytearray) else repr(part).encode())
            digest.update(b"\x1f")
        self.digests.setdefault(kind, set()).add(digest.hexdigest())

    def counts(self) -> dict[str, int]:
        return {kind: len(d) for kind, d in sorted(self.digests.items())}

    def total(self) -> int:
        return sum(len(d) for d in self.digests.values())


@dataclass(repr=False)
class Fuzz:
    """One stocked server, a client (Flight), a same-host channel, and the baseline taken after stocking."""

    server: StorageServer
    client: StorageClient
    local: LocalChannel
    raw: flight.FlightClient
    baseline: dict[str, Any]
    log: CaseLog

    def __repr__(self) -> str:
        return f"Fuzz({self.server.location})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # what hypothesis prints
        printer.text(repr(self))


def _stock(client: StorageClient, local_client: StorageClient) -> None:
    """The baseline: groups put every way the server takes them, raised generations, an appended
    column, a fenced epoch, a tombstone, a second job."""
    keys = [Partition(JOB, EPOCH, g) for g in range(8)]
    groups = [make_group(k) for k in keys]
    client.put_groups([(keys[0], groups[0])])
    client.put_groups([(keys[1], groups[1])])
    client.put_groups([(keys[2], groups[2]), (keys[3], groups[3])])
    client.shm_put_groups([(keys[4], groups[4])])
    local_client.shm_put_groups([(keys[5], groups[5])])  # one inline shm_put over the channel
    client.shm_put_groups([(keys[6], groups[6]), (keys[7], groups[7])])
    client.advance_generation([GroupRead(keys[0], LeaseToken(5)), GroupRead(keys[4], LeaseToken(3))])
    client.advance_generation([GroupRead(keys[1], LeaseToken(2))])
    score = pa.record_batch({"score": pa.array([float(i) for i in range(8)], pa.float32())})
    client.append_columns(keys[1], score, LeaseToken(2))
    client.fence(JOB, EPOCH)  # epoch 0 of the job is fenced
    client.delete([GroupRead(Partition(JOB, EPOCH, 99), LeaseToken(0))])  # a tombstone
    other = Partition("other-job", 0, 0)
    client.put_groups([(other, make_group(other))])


_STAT_KEYS = (
    "groups",
    "bytes",
    "pending_puts",
    "pending_appends",
    "reserved_bytes",
    "capacity_bytes",
    "capacity_groups",
    "free_bytes",
    "pending_shm_puts",
    "tombstones",
    "jobs",
)


def snapshot(server: StorageServer, client: StorageClient) -> dict[str, Any]:
    """What must not change: every group (key, rows, bytes, schema, content), every generation the
    server remembers, the fence board's slots, and the stats that count what is held."""
    infos = client.list_groups(timeout=DEADLINE)
    groups = {}
    for info in infos:
        table = client.get([info.key], timeout=DEADLINE)  # tokenless: changes nothing
        groups[info.key] = (info.num_rows, info.nbytes, info.schema, table)
    stats = client.stats(timeout=DEADLINE)
    board = server.store.board
    return {
        "groups": groups,
        "generations": dict(server.store._fences._generation),
        "board": {k: board.entry(k) for k in groups} if board is not None else {},
        "stats": {k: stats[k] for k in _STAT_KEYS},
        "live_segments": stats.get("shm", {}).get("live_segments"),
    }


def assert_unchanged(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Same groups with the same bytes, content and generations; the same held/reserved counts."""
    assert set(after["groups"]) == set(before["groups"])
    for key, (rows, nbytes, schema, table) in before["groups"].items():
        rows2, nbytes2, schema2, table2 = after["groups"][key]
        assert (rows2, nbytes2) == (rows, nbytes), key
        assert schema2.equals(schema), key
        assert table2.equals(table), key
    assert after["generations"] == before["generations"]
    assert after["board"] == before["board"]
    assert after["stats"] == before["stats"]
    assert after["live_segments"] == before["live_segments"]


def assert_consistent(client: StorageClient) -> None:
    """Stats agree with what is listed, and nothing is held for a put in flight."""
    stats = client.stats(timeout=DEADLINE)
    infos = client.list_groups(timeout=DEADLINE)
    assert stats["groups"] == len(infos)
    assert stats["bytes"] == sum(i.nbytes for i in infos)
    assert (stats["pending_puts"], stats["pending_appends"], stats["pending_shm_puts"]) == (0, 0, 0)
    assert stats["reserved_bytes"] == 0
    assert stats["free_bytes"] == stats["capacity_bytes"] - stats["bytes"]
    per_job: Counter[str] = Counter(i.key.job_id for i in infos)
    assert {j: v["groups"] for j, v in stats["jobs"].items() if v["groups"]} == dict(per_job)


def assert_generations_read_back(fuzz: Fuzz) -> None:
    """Each remembered generation, read back through the wire: a read at it passes, one below it is
    refused (so the highest is exactly it)."""
    from trajflight.errors import StaleFenceError

    for key, generation in fuzz.baseline["generations"].items():
        if key not in fuzz.baseline["groups"] or generation <= 0:
            continue
        assert fuzz.client.get([GroupRead(key, LeaseToken(generation))], timeout=DEADLINE).num_rows > 0
        try:
            fuzz.client.get([GroupRead(key, LeaseToken(generation - 1))], timeout=DEADLINE)
        except StaleFenceError:
            continue
        raise AssertionError(f"generation of {key} is below {generation}")


def assert_serves(client: StorageClient) -> None:
    """A legitimate put, read and delete of a fresh group still work, over Flight and same-host."""
    for i, put in enumerate((client.put_groups, client.shm_put_groups)):
        key = Partition("after-fuzz", 0, i)
        group = make_group(key)
        put([(key, group)])
        assert client.get([GroupRead(key, LeaseToken(1))], timeout=DEADLINE).equals(
            pa.Table.from_batches([group])
        )
        assert client.delete([GroupRead(key, LeaseToken(1))], timeout=DEADLINE)["deleted"] == 1


@contextlib.contextmanager
def stocked_server(**limits: Any) -> Iterator[Fuzz]:
    """A server with an arena, stocked with the baseline; closed (and its arena swept) at the end."""
    with (
        StorageServer(arena=ShmArena(), shm_ttl=5.0, **limits) as server,
        StorageClient(server.location, timeout=DEADLINE) as client,
        StorageClient(server.location, timeout=DEADLINE) as local_client,
    ):
        local_client.use_local_channel(client.health()["shm_socket"])
        _stock(client, local_client)
        local = LocalChannel(client.health()["shm_socket"])
        raw = flight.FlightClient(server.location)
        try:
            yield Fuzz(server, client, local, raw, snapshot(server, client), CaseLog())
        finally:
            raw.close()
            local.close()


def typed(exc: BaseException) -> TrajflightError:
    """The trajflight error a refusal carries; fails the test for anything a server did not type."""
    if isinstance(exc, TrajflightError):
        err = exc
    else:
        assert isinstance(exc, flight.FlightError | pa.ArrowException), f"untyped {type(exc).__name__}: {exc}"
        assert "[trajflight:" in str(exc), f"the server sent no trajflight error: {str(exc)[:300]}"
        mapped = from_flight_error(exc)
        assert mapped is not None
        err = mapped
    assert type(err) is not TrajflightError, f"internal error: {err.message}"
    assert err.code != "trajflight", f"internal error: {err.message}"
    assert not isinstance(err, DeadlineExceededError), f"a call hung: {err.message}"
    assert len(err.message) <= 1500
    return err


def refused(call: Callable[[], object]) -> TrajflightError:
    """Run ``call`` (a bad input); it must be refused with a typed, non-internal error."""
    try:
        call()
    except Exception as exc:  # every exception is checked by typed()
        return typed(exc)
    raise AssertionError("a bad input was accepted")


OPTIONS = flight.FlightCallOptions(timeout=DEADLINE)


def send_action(fuzz: Fuzz, name: str, body: bytes) -> None:
    list(fuzz.raw.do_action(flight.Action(name, body), options=OPTIONS))


def send_local(fuzz: Fuzz, name: str, body: bytes, payload: bytes = b"") -> None:
    fuzz.local.call(name, body, DEADLINE, payload=payload)


def send_ticket(fuzz: Fuzz, ticket: bytes) -> None:
    reader = fuzz.raw.do_get(flight.Ticket(ticket), options=OPTIONS)
    while True:  # chunk by chunk: read_all() turns a cancelled stream into a KeyboardInterrupt
        try:
            reader.read_chunk()
        except StopIteration:
            return


def send_put(fuzz: Fuzz, descriptor: flight.FlightDescriptor, batches: list[pa.RecordBatch]) -> None:
    writer, _ = fuzz.raw.do_put(descriptor, batches[0].schema, options=OPTIONS)
    try:
        for batch in batches:
            writer.write_batch(batch)
    finally:
        writer.close()  # the server's refusal surfaces at a write or here
