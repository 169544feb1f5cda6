"""Authentication benchmark (issue 18): what bearer tokens cost a small round trip, and TLS Flight.

Same run, same machine, interleaved:

* small-group round trip with and without tokens: two ``LocalCluster(servers=1)`` planes (server
  processes; one plain, one with a deployment secret), each reached by ``trajflight.connect(address)``
  (the controller over Flight; the secure client with an admin credential, so that one client does
  every step, its storage tokens minted by the controller and refreshed), timing one cycle = put one
  group of 8 samples + lease it + fetch it to torch + commit. Cycles alternate between the planes, one
  each in turn (``--cycles`` x ``--repeats`` per plane); p50 and p90 over every cycle of a plane, and
  the median of the ratios of neighbouring cycles (tokens / plain). Both
  transports: ``flight`` (every call is a Flight call whose token the server verifies) and ``auto``
  (the same-host socket, which verifies a token once per connection).
* Flight throughput with and without TLS: a ``StorageServer`` plain and one serving ``grpc+tls://``
  (``trajflight.devcerts``), no tokens on either; one ``put_groups`` of the standard workload (64 groups x
  8 samples, about 10 MB of payload) then one ``get`` of all of it, alternating servers per repeat;
  payload GB/s, median and spread.
* the reference for TLS: the same bytes over one loopback TCP socket, plain and through Python's ``ssl``
  (OpenSSL, no gRPC), both ends in this process: what TLS costs this machine before Flight adds anything.

Targets (printed beside the figures, never decided here): tokens add at most 5% to the round trip's p50;
TLS costs at most 30% of Flight put and get throughput.

Usage::

    python bench/bench_auth.py [--cycles 40] [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import trajflight
from trajflight.devcerts import DevCerts, make_dev_certs
from trajflight.flight_server import GroupRead, StorageClient, StorageServer, StoreLimits
from trajflight.keys import Partition
from trajflight.workload import make_workload

SECRET = "bench:bench-auth-secret-0123456789abcdef"


def _cycle(writer: trajflight.Writer, trainer: trajflight.Trainer, batch_in: Any) -> float:
    """One round trip: put one group, lease it, fetch it to torch, commit. Seconds."""
    start = time.perf_counter()
    writer.put(batch_in)
    with trainer.lease(1, wait=10, renew=False) as batch:
        batch.fetch()
    return time.perf_counter() - start


def round_trips(cycles: int, repeats: int, transport: str) -> dict[str, dict[str, float]]:
    """p50/p90 of the round trip on a plain and a secure plane, cycles interleaved, and the median of
    the paired (same moment) ratios."""
    (group,) = make_workload(1, 8, seed=1, response_median=256)
    samples: dict[str, list[float]] = {"plain": [], "tokens": []}
    pairs: list[float] = []
    with (
        trajflight.LocalCluster(servers=1, capacity="1GiB") as plain,
        trajflight.LocalCluster(servers=1, capacity="1GiB", secret=SECRET) as secure,
    ):
        clients = {
            "plain": trajflight.connect(plain.address, transport=transport),  # type: ignore[arg-type]
            "tokens": trajflight.connect(
                secure.address,
                transport=transport,
                token=secure.mint("admin", sub="bench"),  # type: ignore[arg-type]
            ),
        }
        roles = {}
        for name, client in clients.items():
            client.open_job("bench", 1)
            roles[name] = (client.writer("bench", 1), client.trainer("bench", ttl=60.0))
        encoded = group.encode("bench", 1)
        for _ in range(2):  # warm both planes' connections
            for name in roles:
                _cycle(*roles[name], encoded)
        for i in range(repeats * cycles):
            # Cycle by cycle, alternating which plane goes first: both see the same load (this machine's
            # load moves block medians by more than the effect measured).
            order = ["plain", "tokens"] if i % 2 == 0 else ["tokens", "plain"]
            took = {name: _cycle(*roles[name], encoded) for name in order}
            for name in order:
                samples[name].append(took[name])
            pairs.append(took["tokens"] / took["plain"])
        for client in clients.values():
            client.close()
    out = {}
    for name, values in samples.items():
        values.sort()
        out[name] = {
            "p50_ms": 1000 * statistics.median(values),
            "p90_ms": 1000 * values[int(0.9 * (len(values) - 1))],
            "cycles": len(values),
        }
    out["paired"] = {"median_ratio": statistics.median(pairs)}
    return out


def flight_throughput(repeats: int, folder: str) -> dict[str, dict[str, float]]:
    """Put and get GB/s of the standard workload, plain and TLS servers alternating."""
    payload = sum(g.payload_bytes for g in make_workload(64, 8, seed=7))
    certs = make_dev_certs(folder)
    limits = StoreLimits(capacity_bytes=8 << 30)
    figures: dict[str, dict[str, list[float]]] = {
        "plain": {"put": [], "get": []},
        "tls": {"put": [], "get": []},
    }
    with (
        StorageServer(limits=limits) as plain_server,
        StorageServer(limits=limits, tls=certs.server) as tls_server,
        StorageClient(plain_server.location, timeout=120) as plain_client,
        StorageClient(tls_server.location, timeout=120, tls=certs.client) as tls_client,
    ):
        clients = {"plain": plain_client, "tls": tls_client}
        for r in range(repeats + 1):
            order = ["plain", "tls"] if r % 2 == 0 else ["tls", "plain"]
            for name in order:
                client = clients[name]
                groups = make_workload(64, 8, seed=7, first_group_id=r * 1000)  # the same data, new keys
                keys = [Partition("bench", 1, g.group_id) for g in groups]
                batches = [(k, g.encode("bench", 1)) for k, g in zip(keys, groups, strict=True)]
                start = time.perf_counter()
                client.put_groups(batches)
                put = time.perf_counter() - start
                start = time.perf_counter()
                table = client.get([GroupRead(k) for k in keys])
                get = time.perf_counter() - start
                if table.num_rows != 8 * len(groups):
                    raise RuntimeError(f"read {table.num_rows} rows of {8 * len(groups)}")
                if r > 0:  # the first repeat warms both servers
                    figures[name]["put"].append(payload / put / 1e9)
                    figures[name]["get"].append(payload / get / 1e9)
    return {
        name: {f"{op}_gbps": statistics.median(values) for op, values in ops.items()}
        | {f"{op}_spread": max(values) - min(values) for op, values in ops.items()}
        for name, ops in figures.items()
    }


def _socket_server(listener: socket.socket, context: ssl.SSLContext | None, rounds: int, nbytes: int) -> None:
    conn, _ = listener.accept()
    with conn if context is None else context.wrap_socket(conn, server_side=True) as stream:
        payload = memoryview(bytes(nbytes))
        for _ in range(rounds):
            stream.recv(1)
            stream.sendall(payload)


def socket_ceiling(repeats: int, certs: DevCerts, nbytes: int) -> dict[str, float]:
    """GB/s of ``nbytes`` sent over one loopback TCP socket, plain and through OpenSSL (Python's ``ssl``,
    TLS 1.3, the same certificates), both ends in this process: the machine's own TLS cost, with no gRPC
    or Flight in it, the reference the TLS figures above are read against."""
    out: dict[str, float] = {}
    for name in ("plain", "tls"):
        server_ctx = client_ctx = None
        if name == "tls":
            server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server_ctx.load_cert_chain(certs.directory / "server.pem", certs.directory / "server.key")
            client_ctx = ssl.create_default_context(cafile=certs.directory / "ca.pem")
            client_ctx.check_hostname = False  # the dev server certificate names localhost, not the IP
        with socket.create_server(("127.0.0.1", 0)) as listener:
            port = listener.getsockname()[1]
            rounds = repeats + 1
            server = threading.Thread(target=_socket_server, args=(listener, server_ctx, rounds, nbytes))
            server.start()
            raw = socket.create_connection(("127.0.0.1", port))
            rates = []
            with raw if client_ctx is None else client_ctx.wrap_socket(raw, server_hostname="localhost") as s:
                buffer = memoryview(bytearray(nbytes))
                for r in range(rounds):
                    start, got = time.perf_counter(), 0
                    s.sendall(b"g")
                    while got < nbytes:
                        got += s.recv_into(buffer[got:], nbytes - got)
                    if r > 0:  # the first warms the connection
                        rates.append(nbytes / (time.perf_counter() - start) / 1e9)
            server.join()
        out[f"{name}_gbps"] = statistics.median(rates)
    out["tls_over_plain"] = out["tls_gbps"] / out["plain_gbps"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=40, help="round trips per repeat and plane")
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="the cycles are run this many times over (per plane); throughput repeats",
    )
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {}
    for transport in ("flight", "auto"):
        rt = round_trips(args.cycles, args.repeats, transport)
        ratio = rt["tokens"]["p50_ms"] / rt["plain"]["p50_ms"]
        out[f"round_trip_{transport}"] = {**rt, "tokens_over_plain_p50": ratio}
        paired = rt["paired"]["median_ratio"]
        plain, tokens = rt["plain"], rt["tokens"]
        print(
            f"round trip ({transport}): plain p50 {plain['p50_ms']:.2f} ms (p90 {plain['p90_ms']:.2f}), "
            f"tokens p50 {tokens['p50_ms']:.2f} ms (p90 {tokens['p90_ms']:.2f}): "
            f"x{ratio:.3f}, paired x{paired:.3f} (target <= 1.05)",
            flush=True,
        )
    with tempfile.TemporaryDirectory() as folder:
        tp = flight_throughput(args.repeats, folder)
        payload = sum(g.payload_bytes for g in make_workload(64, 8, seed=7))
        ceiling = socket_ceiling(max(3, args.repeats), make_dev_certs(f"{folder}/socket"), payload)
    out["flight_throughput"] = tp
    out["socket_ceiling"] = ceiling
    for op in ("put", "get"):
        share = tp["tls"][f"{op}_gbps"] / tp["plain"][f"{op}_gbps"]
        out["flight_throughput"][f"tls_over_plain_{op}"] = share
        plain_tp, tls_tp = tp["plain"], tp["tls"]
        print(
            f"flight {op}: plain {plain_tp[f'{op}_gbps']:.2f} GB/s (spread {plain_tp[f'{op}_spread']:.2f}), "
            f"tls {tls_tp[f'{op}_gbps']:.2f} GB/s (spread {tls_tp[f'{op}_spread']:.2f}): "
            f"x{share:.3f} of plain (target >= 0.70)",
            flush=True,
        )
    print(
        f"reference, one loopback socket: plain {ceiling['plain_gbps']:.2f} GB/s, OpenSSL TLS "
        f"{ceiling['tls_gbps']:.2f} GB/s: x{ceiling['tls_over_plain']:.3f} of plain (the machine's TLS cost)",
        flush=True,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
