"""The references measured in the same run: numpy memcpy (the floor) and a bare Flight server (the ceiling).

* ``memcpy``: ``np.copyto`` of every payload array into one pre-faulted buffer, group by group. It moves
  the same bytes with no protocol, no serialisation and no process boundary: no system can beat it on one
  machine. Its get figures are the same copy of the columns asked for (layout has no meaning there).
* ``flight`` (the strongest ordinary form): the bare ``pyarrow.flight`` server of
  ``bench_flight_server.py`` (it keeps each put as the table received and serves a ticket of paths with
  ``RecordBatchStream``) in its own process; the client holds the whole workload as one record batch
  (``encode_groups``' joined batch, user columns included, built before the clock, as Ray's batch is),
  sends it in one ``do_put`` and reads it back in one ``do_get`` decoded to torch with
  :func:`trajflight.codec.decode`, as trajflight's client does. No controller, no leases, no fencing, no
  capacity accounting: the transport's ceiling.
* ``flight-per-group``: the same server; the client encodes each group as trajflight's ``Writer.put``
  does (in the timing), does one ``do_put`` per group, and reads everything in one ``do_get``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from trajflight.workload import SyntheticGroup

from ._system import ALL_COLUMNS, GetVariant, System, encode_with_users, group_arrays, payload_of

__all__ = ["FlightPerGroupSystem", "FlightSystem", "MemcpySystem"]

JOB = "bench"


class MemcpySystem(System):
    """numpy memcpy of the same payload into a pre-faulted buffer."""

    name = "memcpy"
    role = "reference"
    form = "np.copyto per column"
    description = "numpy copyto of the payload bytes (physical floor)"
    has_servers = False
    supports_batched = True

    def __init__(self, groups: Sequence[SyntheticGroup]) -> None:
        super().__init__(groups)
        self._arrays = [group_arrays(g) for g in self.groups]
        self._dst = np.empty(0, dtype=np.uint8)

    def setup(self) -> None:
        self._dst = np.ones(payload_of(self.groups), dtype=np.uint8)  # pre-faulted

    def _copy(self, parts: Sequence[dict[str, np.ndarray]], columns: Sequence[str]) -> None:
        pos = 0
        dst = self._dst
        for part in parts:
            for name in columns:
                src = part[name].view(np.uint8)
                np.copyto(dst[pos : pos + src.nbytes], src)
                pos += src.nbytes

    def put_all(self) -> None:
        self._copy(self._arrays, ALL_COLUMNS)

    def put_batched_all(self) -> None:
        self._copy(self._arrays, ALL_COLUMNS)  # the same copies: there is no call to batch

    def get(self, variant: GetVariant) -> Any:
        self._copy(self._arrays, variant.columns or ALL_COLUMNS)

    def small_roundtrip(self, index: int) -> None:
        self._copy([self._arrays[index % len(self._arrays)]], ALL_COLUMNS)


class FlightPerGroupSystem(System):
    """A bare ``pyarrow.flight`` server process: one ``do_put`` per group, one ``do_get`` of all."""

    name = "flight-per-group"
    role = "reference"
    form = "one do_put per group"
    strongest = False
    description = "bare pyarrow.flight server, 1 process: do_put per group, one do_get"
    memory_note = "RSS of the server process"
    supports_batched = True

    def __init__(self, groups: Sequence[SyntheticGroup]) -> None:
        super().__init__(groups)
        self._proc: Any = None
        self._client: Any = None
        self._options: Any = None
        self._paths: list[list[str]] = []
        self._small: list[list[str]] = []

    def setup(self) -> None:
        import pyarrow.flight as flight
        import pyarrow.ipc as ipc

        from .bench_flight_server import bare_server

        self._proc = bare_server()
        self._client = flight.FlightClient(self._proc.location)
        self._options = flight.FlightCallOptions(
            timeout=120, read_options=ipc.IpcReadOptions(ensure_alignment=ipc.Alignment.DataTypeSpecific)
        )
        self._flight = flight

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._proc is not None:
            self._proc.stop()
            if self._proc.proc.stdout is not None:  # bench_flight_server.Proc leaves its pipe open
                self._proc.proc.stdout.close()
            self._proc = None

    def server_pids(self) -> list[int]:
        return [self._proc.proc.pid] if self._proc is not None else []

    def _put(self, g: SyntheticGroup, path: list[str], users: dict[str, np.ndarray] | None = None) -> None:
        self._send(encode_with_users(g, JOB, 1, users), path)

    def _send(self, batch: Any, path: list[str]) -> None:
        descriptor = self._flight.FlightDescriptor.for_path(*path)
        writer, _ = self._client.do_put(descriptor, batch.schema, options=self._options)
        writer.write_batch(batch)
        writer.close()

    def _get(self, paths: list[list[str]], columns: Sequence[str] | None, layout: str) -> Any:
        from trajflight.codec import decode

        body = {"paths": paths, "columns": list(columns) if columns else None}
        ticket = self._flight.Ticket(json.dumps(body).encode())
        table = self._client.do_get(ticket, options=self._options).read_all()
        return decode(table, layout=layout)  # type: ignore[arg-type]

    def put_all(self) -> None:
        self._paths = []
        for g, users in zip(self.groups, self.users, strict=True):
            path = [JOB, "1", str(g.group_id)]
            self._put(g, path, users)
            self._paths.append(path)

    def get(self, variant: GetVariant) -> Any:
        return self._get(self._paths, variant.columns, variant.layout)

    def put_batched_all(self) -> None:
        from .bench_flight_server import bare_put_batched

        batches = [encode_with_users(g, JOB, 1, u) for g, u in zip(self.groups, self.users, strict=True)]
        bare_put_batched(self._client, batches)

    def drain(self) -> None:
        list(self._client.do_action(self._flight.Action("clear", b""), options=self._options))
        self._paths = []

    def small_roundtrip(self, index: int) -> None:
        g = self.groups[index % len(self.groups)]
        path = ["small", str(index), str(g.group_id)]
        self._put(g, path, self.users[index % len(self.groups)])
        self._get([path], None, "jagged")

    def small_cleanup(self) -> None:
        self.drain()


class FlightSystem(FlightPerGroupSystem):
    """The bare Flight server's strongest ordinary form: the whole batch in one ``do_put`` stream, read
    back in one ``do_get``. It has no call per group: its put is the batch's one put."""

    name = "flight"
    form = "one stream of the batch"
    strongest = True
    description = "bare pyarrow.flight server, 1 process: one do_put of the joined batch, one do_get"

    def __init__(self, groups: Sequence[SyntheticGroup]) -> None:
        super().__init__(groups)
        self._joined: Any = None
        self._one: list[Any] = []

    def setup(self) -> None:
        from trajflight.codec import encode_groups

        super().setup()
        pairs = list(zip(self.groups, self.users, strict=True))
        columns = [{**g.columns(extra=u), "group_id": g.group_id} for g, u in pairs]
        self._joined = encode_groups(job_id=JOB, epoch=1, groups=columns).joined
        self._one = [encode_with_users(g, JOB, 1, u) for g, u in pairs]

    def put_all(self) -> None:
        path = [JOB, "1", "batch"]
        self._send(self._joined, path)
        self._paths = [path]

    def put_batched_all(self) -> None:
        self.put_all()

    def small_roundtrip(self, index: int) -> None:
        path = ["small", str(index)]
        self._send(self._one[index % len(self._one)], path)
        self._get([path], None, "jagged")
