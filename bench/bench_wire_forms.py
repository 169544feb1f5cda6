"""Which wire forms pay: each transport's candidate forms of one operation, timed side by side (issue 15).

One storage server process with a shared-memory arena (``trajflight server --shm-dir auto``), one client
(this process) on loopback, the standard workload (``make_workload(64, 8)``, about 9.5 MB, encoded
together with ``encode_groups``: one joined batch, as ``Writer.put_many`` makes it) and one group of 8
samples for the small-group figures. The bench speaks the wire of ``docs/wire-format.md`` itself (Flight
actions and descriptors; the same-host Unix socket's framing), so it runs unchanged against servers of
other commits; a form a server no longer accepts is reported as refused.

Cases, alternated round by round (the machine is shared and noisy), the first round dropped:

* shm put of the 64 groups as one stream in one segment: the compact ``batch`` reserve and publish
  bodies against the ``groups`` bodies with ``batch_bytes``; and against one segment per group (the
  ``groups`` form without ``batch_bytes``, 64 streams);
* shm put of one small group: ``shm_put`` (its bytes in the one call, on the socket) against
  ``shm_reserve`` + write + ``shm_publish`` (two calls);
* ``shm_open`` (what a same-host lease's fencing call is) of the 64 groups under lease tokens: the
  compact ``batch`` body against the ``groups`` body; and ``advance_generation`` likewise (the fencing
  call of a lease over Flight, and the controller's fence work; sent here on the socket, whose server
  decodes bodies as ``do_action`` does);
* Flight ``do_get`` of the 64 groups: the compact ``batch`` ticket against the ``groups`` ticket;
* Flight put of one group: descriptor kind ``put`` against ``put_many`` naming one group;
* the server's decoding alone (in this process) of the 64-group read body in either form.

Writes into segments go through ``write(2)`` for every form alike. Figures: median [min..max] over the
rounds. Timing decides nothing.

Usage::

    python bench/bench_wire_forms.py [--rounds 40] [--read-rounds 200] [--small-rounds 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc

from trajflight.codec import encode_groups
from trajflight.workload import make_workload

_LEN = struct.Struct(">I")
TIMEOUT = flight.FlightCallOptions(timeout=60)


class Refused(Exception):
    """The server does not accept this form."""


# ------------------------------------------------------------------------------------------ the wire


def body(**fields: Any) -> bytes:
    return json.dumps({"v": 1, **fields}, separators=(",", ":")).encode()


class Channel:
    """The same-host control channel of ``docs/wire-format.md``: length-prefixed frames on a Unix socket."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)

    def _exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if not k:
                raise ConnectionError("server closed the channel")
            got += k
        return bytes(buf)

    def call(self, name: str, data: bytes, payload: bytes | pa.Buffer = b"") -> dict[str, Any]:
        head = _LEN.pack(len(name)) + name.encode() + _LEN.pack(len(data)) + data + _LEN.pack(len(payload))
        self.sock.sendmsg([head, memoryview(payload)] if len(payload) else [head])
        status = self._exact(1)
        (n,) = _LEN.unpack(self._exact(4))
        reply = json.loads(self._exact(n))
        if status != b"\x00":
            raise Refused(f"{name}: {reply.get('message', reply)}"[:200])
        return reply

    def close(self) -> None:
        self.sock.close()


def write_stream(path: str, schema: pa.Schema, batches: list[pa.RecordBatch]) -> int:
    """Write one IPC stream at offset 0 of the segment file with ``write(2)``; its size."""
    fd = os.open(path, os.O_WRONLY)
    with os.fdopen(fd, "wb", buffering=0) as f, ipc.new_stream(f, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return stream_size(schema, batches)


def stream_size(schema: pa.Schema, batches: list[pa.RecordBatch]) -> int:
    sink = pa.MockOutputStream()
    with ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return int(sink.size())


def stream_bytes(schema: pa.Schema, batches: list[pa.RecordBatch]) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()


def key(job: str, epoch: int, group_id: int) -> dict[str, Any]:
    return {"job_id": job, "epoch": epoch, "group_id": group_id}


# ----------------------------------------------------------------------------------------- the forms


class Forms:
    """Each candidate form of each operation, against one server."""

    def __init__(self, location: str) -> None:
        self.flight = flight.FlightClient(location)
        health = self.action("health", b"")
        self.channel = Channel(health["shm_socket"])

    def action(self, name: str, data: bytes) -> dict[str, Any]:
        try:
            results = list(self.flight.do_action(flight.Action(name, data), options=TIMEOUT))
        except flight.FlightError as exc:
            raise Refused(str(exc)[:200]) from None
        return json.loads(results[0].body.to_pybytes())

    # -- same-host puts of many groups (one joined batch, one job and epoch)

    def put_compact(self, job: str, ids: list[int], rows: list[int], batch: pa.RecordBatch) -> None:
        size = stream_size(batch.schema, [batch])
        reserve = body(
            writer="w", batch_bytes=size, batch={"job_id": job, "epoch": 1, "group_ids": ids, "rows": rows}
        )
        got = self.channel.call("shm_reserve", reserve)["batch"]
        written = write_stream(got["path"], batch.schema, [batch])
        self.channel.call("shm_publish", body(batch={"reservation": got["reservation"], "size": written}))

    def put_groups_shared(self, job: str, ids: list[int], rows: list[int], batch: pa.RecordBatch) -> None:
        size = stream_size(batch.schema, [batch])
        groups = [{**key(job, 1, g), "num_rows": n} for g, n in zip(ids, rows, strict=True)]
        got = self.channel.call("shm_reserve", body(writer="w", batch_bytes=size, groups=groups))["segments"]
        written = write_stream(got[0]["path"], batch.schema, [batch])
        items = [{"reservation": s["reservation"], "size": written} for s in got]
        self.channel.call("shm_publish", body(groups=items))

    def put_per_group(self, job: str, ids: list[int], batches: list[pa.RecordBatch]) -> None:
        sizes = [stream_size(b.schema, [b]) for b in batches]
        groups = [
            {**key(job, 1, g), "num_rows": b.num_rows, "nbytes": n}
            for g, b, n in zip(ids, batches, sizes, strict=True)
        ]
        got = self.channel.call("shm_reserve", body(writer="w", groups=groups))["segments"]
        written = [write_stream(s["path"], b.schema, [b]) for s, b in zip(got, batches, strict=True)]
        items = [{"reservation": s["reservation"], "size": n} for s, n in zip(got, written, strict=True)]
        self.channel.call("shm_publish", body(groups=items))

    # -- same-host put of one small group

    def small_inline(self, job: str, gid: int, batch: pa.RecordBatch) -> None:
        payload = stream_bytes(batch.schema, [batch])
        group = {**key(job, 1, gid), "num_rows": batch.num_rows, "nbytes": payload.size}
        self.channel.call("shm_put", body(writer="w", groups=[group]), payload)

    def small_reserve(self, job: str, gid: int, batch: pa.RecordBatch) -> None:
        self.put_groups_shared(job, [gid], [batch.num_rows], batch)

    # -- reads and fences of many groups under lease tokens

    def reads(self, job: str, ids: list[int], generation: int, compact: bool) -> dict[str, Any]:
        if compact:
            return {
                "batch": {"job_id": job, "epoch": 1, "group_ids": ids, "generations": [generation] * len(ids)}
            }
        return {"groups": [{**key(job, 1, g), "generation": generation} for g in ids]}

    def shm_open(self, job: str, ids: list[int], generation: int, compact: bool) -> None:
        self.channel.call("shm_open", body(**self.reads(job, ids, generation, compact)))

    def advance(self, job: str, ids: list[int], generation: int, compact: bool) -> None:
        self.channel.call("advance_generation", body(**self.reads(job, ids, generation, compact)))

    def get(self, job: str, ids: list[int], generation: int, compact: bool) -> pa.Table:
        ticket = flight.Ticket(body(**self.reads(job, ids, generation, compact)))
        try:
            reader = self.flight.do_get(ticket, options=TIMEOUT)
            batches = []
            while True:
                try:
                    batches.append(reader.read_chunk().data)
                except StopIteration:
                    return pa.Table.from_batches(batches)
        except flight.FlightError as exc:
            raise Refused(str(exc)[:200]) from None

    # -- Flight put of one group

    def flight_put(self, job: str, gid: int, batch: pa.RecordBatch, many: bool) -> None:
        one = {**key(job, 1, gid), "num_rows": batch.num_rows, "nbytes": batch.get_total_buffer_size()}
        command = (
            body(kind="put_many", writer="w", groups=[one]) if many else body(kind="put", writer="w", **one)
        )
        try:
            writer, _ = self.flight.do_put(
                flight.FlightDescriptor.for_command(command), batch.schema, options=TIMEOUT
            )
            writer.write_batch(batch)
            writer.done_writing()
            writer.close()
        except flight.FlightError as exc:
            raise Refused(str(exc)[:200]) from None

    def drop(self, job: str, ids: list[int]) -> None:
        for i in range(0, len(ids), 64):
            groups = [{**key(job, 1, g), "generation": 9} for g in ids[i : i + 64]]
            self.channel.call("delete", body(groups=groups))

    def close(self) -> None:
        self.channel.close()
        self.flight.close()


# ------------------------------------------------------------------------------------------- harness


def stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def fmt(st: dict[str, float] | str) -> str:
    if isinstance(st, str):
        return st
    return f"{st['median'] * 1e3:8.3f} ms [{st['min'] * 1e3:.3f}..{st['max'] * 1e3:.3f}]"


def alternate(cases: dict[str, Callable[[int], float]], rounds: int) -> dict[str, dict[str, float] | str]:
    """Run each case once per round, cases alternating; each returns the seconds it counts (its untimed
    clean-up excluded). A case the server refuses is reported so."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    refused: dict[str, str] = {}
    for r in range(rounds + 1):
        for name, case in cases.items():
            if name in refused:
                continue
            try:
                took = case(r)
            except Refused as exc:
                refused[name] = f"refused ({exc})"
                continue
            if r:
                times[name].append(took)
    return {name: refused.get(name) or stats(times[name]) for name in cases}


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def decode_cases(ids: list[int], rounds: int) -> dict[str, dict[str, float] | str]:
    """The server's decoding alone (in this process) of one 64-group read body in either form."""
    from trajflight.flight_server._wire import decode_action_body

    def groups(generation: int) -> bytes:
        return body(groups=[{**key("reads", 1, g), "generation": generation} for g in ids])

    def compact(generation: int) -> bytes:
        return body(
            batch={"job_id": "reads", "epoch": 1, "group_ids": ids, "generations": [generation] * len(ids)}
        )

    bodies = {
        "compact": [compact(r) for r in range(rounds + 1)],
        "groups": [groups(r) for r in range(rounds + 1)],
    }

    def case(action: str, form: str) -> Callable[[int], float]:
        return lambda r: timed(lambda: decode_action_body(action, bodies[form][r]))

    return alternate(
        {
            f"decode {action} 64 groups, {form} body": case(action, form)
            for action in ("shm_open", "advance_generation")
            for form in ("compact", "groups")
        },
        rounds,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--read-rounds", type=int, default=200)
    parser.add_argument("--small-rounds", type=int, default=300)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    groups = make_workload(args.groups, args.samples, seed=0)
    columns = [{**g.columns(), "group_id": g.group_id} for g in groups]
    ids = [g.group_id for g in groups]
    rows = [args.samples] * len(groups)
    server = subprocess.Popen(
        [sys.executable, "-m", "trajflight", "server", "--shm-dir", "auto", "--capacity", "8GiB"],
        stdout=subprocess.PIPE,
        text=True,
    )
    report: dict[str, Any] = {"groups": args.groups, "samples": args.samples}
    try:
        assert server.stdout is not None
        forms = Forms(server.stdout.readline().strip())
        # Every round puts under a job of its own: a server never stores a deleted key again.
        jobs = {name: [f"{name}-{r}" for r in range(args.rounds + 1)] for name in ("c", "s", "p")}
        joined = {
            job: encode_groups(job_id=job, epoch=1, groups=columns) for js in jobs.values() for job in js
        }

        def put_case(name: str, put: Callable[[str], None]) -> Callable[[int], float]:
            def run(r: int) -> float:
                job = jobs[name][r]
                took = timed(lambda: put(job))
                forms.drop(job, ids)
                return took

            return run

        report |= alternate(
            {
                "shm put 64 groups, compact batch body": put_case(
                    "c", lambda job: forms.put_compact(job, ids, rows, joined[job].joined)
                ),
                "shm put 64 groups, groups body + batch_bytes": put_case(
                    "s", lambda job: forms.put_groups_shared(job, ids, rows, joined[job].joined)
                ),
                "shm put 64 groups, one segment per group": put_case(
                    "p", lambda job: forms.put_per_group(job, ids, list(joined[job]))
                ),
            },
            args.rounds,
        )

        # Reads and fences of the 64 groups of one put.
        forms.put_groups_shared(
            "reads", ids, rows, encode_groups(job_id="reads", epoch=1, groups=columns).joined
        )
        generation = [1]

        def bump() -> int:
            generation[0] += 1
            return generation[0]

        report |= alternate(
            {
                "shm_open 64 groups, compact batch body": lambda r: timed(
                    lambda: forms.shm_open("reads", ids, bump(), True)
                ),
                "shm_open 64 groups, groups body": lambda r: timed(
                    lambda: forms.shm_open("reads", ids, bump(), False)
                ),
                "advance_generation 64 groups, compact": lambda r: timed(
                    lambda: forms.advance("reads", ids, bump(), True)
                ),
                "advance_generation 64 groups, groups": lambda r: timed(
                    lambda: forms.advance("reads", ids, bump(), False)
                ),
                "do_get 64 groups, compact batch ticket": lambda r: timed(
                    lambda: forms.get("reads", ids, generation[0], True)
                ),
                "do_get 64 groups, groups ticket": lambda r: timed(
                    lambda: forms.get("reads", ids, generation[0], False)
                ),
            },
            args.read_rounds,
        )

        # One small group: put over shm and over Flight.
        one = groups[0]
        small = {
            name: [one.encode(f"{name}-{r}", 1) for r in range(args.small_rounds + 1)]
            for name in ("i", "r", "fp", "fm")
        }

        def small_case(name: str, put: Callable[[str, pa.RecordBatch], None]) -> Callable[[int], float]:
            def run(r: int) -> float:
                job, batch = f"{name}-{r}", small[name][r]
                took = timed(lambda: put(job, batch))
                forms.drop(job, [one.group_id])
                return took

            return run

        report |= alternate(
            {
                "shm put 1 group of 8, shm_put (one call)": small_case(
                    "i", lambda job, b: forms.small_inline(job, one.group_id, b)
                ),
                "shm put 1 group of 8, reserve + write + publish": small_case(
                    "r", lambda job, b: forms.small_reserve(job, one.group_id, b)
                ),
                "Flight put 1 group of 8, kind put": small_case(
                    "fp", lambda job, b: forms.flight_put(job, one.group_id, b, False)
                ),
                "Flight put 1 group of 8, kind put_many of one": small_case(
                    "fm", lambda job, b: forms.flight_put(job, one.group_id, b, True)
                ),
            },
            args.small_rounds,
        )
        forms.close()
    finally:
        server.terminate()
        server.wait(30)
    report |= decode_cases(ids, args.read_rounds)

    for name, value in report.items():
        if isinstance(value, dict | str):
            print(f"{name:50s} {fmt(value)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
