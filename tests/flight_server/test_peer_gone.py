"""A call whose peer went away mid-call (shut down, restarting, killed) is an UnavailableError that says
to retry or reconnect, never an untyped TrajflightError or a KeyboardInterrupt.

Regression for issue 14/19: a client of a controller or storage server being restarted got
``TrajflightError: ...: Flight call failed: ... CANCELLED``. And a cancelled ``do_get`` read with
``read_all()`` raised KeyboardInterrupt in the main thread (pyarrow's SignalStopHandler turns any
ArrowCancelled into a simulated SIGINT), so the error never reached the client's mapping at all.
"""

from __future__ import annotations

import os
import signal
import threading

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from flight_testkit import make_group, server_process

from trajflight._control_client import FlightTransport
from trajflight.errors import TrajflightError, UnavailableError
from trajflight.flight_server import StorageClient
from trajflight.flight_server._errors import from_flight_error, translate_errors
from trajflight.keys import Partition

KEY = Partition("job-a", 0, 1)


class ShuttingDownServer(flight.FlightServerBase):
    """A server whose shutdown cancels the calls it cannot finish, as gRPC does past a shutdown's
    deadline and as a controller does with its parked long-polls: every handler parks until
    :meth:`close`, which makes each one end with CANCELLED, then shuts the server down."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.location = f"grpc://127.0.0.1:{self.port}"
        self.parked = threading.Event()
        self._closing = threading.Event()

    def _park(self) -> None:
        self.parked.set()
        self._closing.wait(30)
        raise flight.FlightCancelledError("server shutting down")

    def do_action(self, context, action):
        self._park()

    def do_get(self, context, ticket):
        batch = make_group(KEY)

        def stream():
            yield batch
            self._park()

        return flight.GeneratorStream(batch.schema, stream())

    def do_put(self, context, descriptor, reader, writer):
        reader.read_chunk()
        self._park()

    def close(self) -> None:
        self._closing.set()
        threading.Thread(target=self.shutdown, daemon=True).start()


def _close_once_parked(server: ShuttingDownServer) -> threading.Thread:
    def run() -> None:
        if server.parked.wait(30):
            server.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


CALLS = {
    "get": lambda c: c.get([KEY]),
    "action": lambda c: c.health(),
    "put": lambda c: c.put_groups([(KEY, pa.Table.from_batches([make_group(KEY)] * 4))]),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_call_cancelled_by_a_server_shutting_down_is_unavailable(call):
    """Regression: CANCELLED came back as a plain TrajflightError ("Flight call failed"); a cancelled
    get raised KeyboardInterrupt instead."""
    server = ShuttingDownServer()
    closer = _close_once_parked(server)
    try:
        with StorageClient(server.location, timeout=30) as client:
            with pytest.raises(UnavailableError, match=r"cancelled.*retry") as info:
                CALLS[call](client)
            assert type(info.value) is UnavailableError
    finally:
        server.close()
        closer.join(10)


def test_a_controller_call_cancelled_by_its_restart_is_unavailable():
    """The controller's transport shares the mapping: a restart mid-call is retryable. (Over Flight: this
    stand-in server has no same-host socket to offer.)"""
    server = ShuttingDownServer()
    closer = _close_once_parked(server)
    transport = FlightTransport(server.location, local=False)
    try:
        with pytest.raises(UnavailableError, match=r"controller call: the call was cancelled"):
            transport.invoke("counts", {"job_id": "j"}, timeout=30)
    finally:
        transport.close()
        server.close()
        closer.join(10)


def test_a_storage_server_killed_mid_call_is_unavailable():
    """A real server process, stopped so that the call is in flight, then killed."""
    with server_process() as (proc, location), StorageClient(location, timeout=30) as client:
        client.put_groups([(KEY, make_group(KEY))])
        os.kill(proc.pid, signal.SIGSTOP)
        killer = threading.Timer(0.5, os.kill, (proc.pid, signal.SIGKILL))
        killer.start()
        try:
            with pytest.raises(UnavailableError, match="retry or reconnect"):
                client.get([KEY])
        finally:
            killer.join(10)


@pytest.mark.parametrize(
    "raw",
    [
        flight.FlightCancelledError("Cancelled. gRPC client debug context: CANCELLED"),
        pa.ArrowCancelled("Operation cancelled"),
        flight.FlightInternalError("Flight returned internal error: Stream removed (Socket closed)"),
        pa.ArrowException("gRPC returned unavailable error, with message: Connection reset by peer"),
        OSError("Could not write record batch: UNAVAILABLE: Broken pipe"),
        OSError("Invalid IPC stream: the call's stream is gone"),
    ],
    ids=[
        "flight-cancelled",
        "arrow-cancelled",
        "internal-stream-removed",
        "arrow-unavailable",
        "oserror",
        "oserror-plain",
    ],
)
def test_raw_forms_of_a_peer_gone_map_to_unavailable(raw):
    with pytest.raises(UnavailableError, match="retry") as info, translate_errors("get"):
        raise raw
    assert info.value.message.startswith("get: ")
    assert info.value.__cause__ is raw


def test_other_untyped_failures_stay_trajflight_errors():
    err = from_flight_error(flight.FlightInternalError("boom"), "get")
    assert type(err) is TrajflightError
    # A typed error from a server keeps its class, even when its text mentions a cancellation.
    typed = flight.FlightServerError("[trajflight:not_found] the reservation was cancelled")
    assert type(from_flight_error(typed)).__name__ == "NotFoundError"
