"""The gate's verdict from its measured figures (the load itself is tested against a real
tritonserver in test_gate_client.py): a late client clears the server only when Triton's own time
per request, read from its metrics, is within the SLO; unread, the gate fails."""
from types import SimpleNamespace

import pytest

from hkgpu_tune.serve.measuring import gate


def figures(p99, bound="", server=None, errors=0):
    return gate.LoadResult("m", 100, 8, errors, 1.0, p99 / 2, p99 * 0.9, p99, p99 * 1.1, 100.0,
                           client_bound=bound, server_request_ms=server)


def stand_in(metrics_port=0):
    return SimpleNamespace(gate=SimpleNamespace(p99_ms=20.0, requests=100, concurrency=8, processes=None,
                                                warmup_requests=1, protocol="http", live_min_req_s=5.0,
                                                live_window_s=5.0, canary=4),
                           metrics=SimpleNamespace(port=metrics_port, host="127.0.0.1"),
                           models=[SimpleNamespace(name="m")])


@pytest.mark.parametrize("p99, bound, server, verdict", [
    (10.0, "", 4.0, "passed"),
    (30.0, "", 4.0, "failed"),                           # the client was not late: the server missed
    (30.0, "a client process used 99% of a core", 4.0, "client-bound"),
    (30.0, "a client process used 99% of a core", 25.0, "failed"),   # Triton's own time misses too
    (30.0, "a client process used 99% of a core", None, "failed"),   # nothing clears the server
])
def test_verdict(monkeypatch, p99, bound, server, verdict):
    t = stand_in()
    monkeypatch.setattr(gate, "warm_up", lambda *a, **k: 0.0)
    monkeypatch.setattr(gate, "load", lambda *a, **k: figures(p99, bound, server))
    rep = gate.run_gate(t)
    assert rep.mode == "load"
    assert rep.verdict == verdict, rep.message
    if server is not None and verdict != "passed":   # the reason names the server's own time, the figure the verdict turned on
        assert f"Triton's own {server:.2f} ms per request" in rep.message, rep.message
    if server is None and bound:
        assert "could not be read" in rep.message and "not cleared" in rep.message
        with pytest.raises(gate.GateFailed):
            gate.require(t)


@pytest.mark.parametrize("rate, p99, server, server_p99, failures, verdict, says, judged_by", [
    (2.0, 10.0, 4.0, 8.0, 0, "passed", "judged by the gate's own load", ""),   # under live.min_req_s: its own load
    (500.0, 10.0, 4.0, 8.0, 0, "passed", "judged by live traffic: 500 req/s", "canary"),
    (500.0, 30.0, 4.0, None, 0, "failed", "p99 latency 30.00 ms is over the SLO", "canary"),   # no summary: the canary rules
    (500.0, 10.0, 25.0, 8.0, 0, "failed", "Triton's own time per request 25.00 ms is over the SLO", "triton"),
    (500.0, 10.0, 4.0, 25.0, 0, "failed", "Triton's own p99 per request 25.00 ms is over the SLO", "triton"),
    (500.0, 30.0, 4.0, 25.0, 0, "failed", "Triton's own p99 per request 25.00 ms is over the SLO", "triton"),
    # the node was already over its SLO outside Triton: Triton's own p99 and mean clear the config
    (500.0, 30.0, 4.0, 12.0, 0, "passed", "judged by Triton's own figures: p99 12.00 ms", "triton"),
    (500.0, 30.0, 4.0, 12.0, 3, "failed", "requests failed or none answered beside live traffic", ""),
    (500.0, 10.0, 4.0, 8.0, 3, "failed", "requests failed or none answered beside live traffic", ""),
])
def test_busy_node_verdict(monkeypatch, rate, p99, server, server_p99, failures, verdict, says, judged_by):
    """Live traffic seen (Triton's count rising while the gate sends nothing): a canary and Triton's
    figures judge the config. Triton's own p99 or mean over the SLO, or a failed live request, fails it;
    a canary over the SLO fails it unless Triton's own p99 and mean, read from its metrics, are within
    (the time was spent outside Triton, as it was for the live traffic before the reload)."""
    t = stand_in(metrics_port=8002)
    monkeypatch.setattr(gate, "warm_up", lambda *a, **k: 0.0)
    monkeypatch.setattr(gate, "live_rate", lambda *a, **k: rate)
    monkeypatch.setattr(gate, "load", lambda *a, **k: figures(p99, "", server))

    def canary(t, m, live_req_s, protocol="http"):
        return gate.LoadResult("m", 400, 4, 0, 5.0, p99 / 2, p99 * 0.9, p99, p99 * 1.1, 80.0, mode="live",
                               live_req_s=live_req_s, server_request_ms=server, server_req_s=live_req_s + 80,
                               server_queue_ms=0.5, server_failures=failures, server_p99_ms=server_p99)
    monkeypatch.setattr(gate, "canary", canary)
    rep = gate.run_gate(t)
    assert rep.verdict == verdict and says in rep.message, rep.message
    assert rep.mode == ("live" if rate >= 5.0 else "load") and rep.to_dict()["mode"] == rep.mode
    assert rep.loads[0].judged_by == judged_by and rep.to_dict()["loads"][0]["judged_by"] == judged_by
