"""bench_auth: both round trips and both throughputs run and report their ratios."""

from __future__ import annotations

import json

import pytest

from trajflight.bench import bench_auth


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_round_trips_with_and_without_tokens_and_flight_with_and_without_tls_report(tmp_path, capsys):
    out = tmp_path / "auth.json"
    assert bench_auth.main(["--cycles", "2", "--repeats", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    for transport in ("flight", "auto"):
        rt = result[f"round_trip_{transport}"]
        assert rt["plain"]["cycles"] == rt["tokens"]["cycles"] == 2
        assert rt["tokens_over_plain_p50"] > 0
    throughput = result["flight_throughput"]
    assert throughput["plain"]["put_gbps"] > 0
    assert throughput["tls"]["get_gbps"] > 0
    ceiling = result["socket_ceiling"]  # the machine's own TLS cost, the reference for the figures above
    assert ceiling["plain_gbps"] > 0
    assert ceiling["tls_gbps"] > 0
    assert ceiling["tls_over_plain"] == ceiling["tls_gbps"] / ceiling["plain_gbps"]
    printed = capsys.readouterr().out
    assert "(target <= 1.05)" in printed
    assert "(target >= 0.70)" in printed
    assert "reference, one loopback socket" in printed
