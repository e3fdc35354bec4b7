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


def live(p99, server, server_p99, failures=0, late=""):
    return gate.LoadResult("m", 2400, 4, 0, 5.0, p99 / 2, p99 * 0.9, p99, p99 * 1.1, 480.0, mode="live",
                           live_req_s=9000.0, server_request_ms=server, server_req_s=9480.0, server_queue_ms=0.8,
                           server_failures=failures, server_p99_ms=server_p99, client_bound=late)


LATE = "it got the CPU 40.0 ms late on average"


# (before: canary p99, Triton mean, Triton p99) -> (after: the same); SLO 20 ms. The figures of the
# 2026-12-07 H100 run (canary 13-15 ms, Triton's p99 17-22 ms, the live load's own p99 20 ms) scaled.
@pytest.mark.parametrize("before, after, failures, verdict, says, judged_by", [
    # the old config over the SLO too, the new one no worse: passes and says the node is over its SLO
    ((18.0, 8.0, 26.0), (17.0, 8.2, 25.0), 0, "passed", "as before the reload (Triton's own p99 per request 26.00 ms)", "before"),
    ((30.0, 8.0, 26.0), (35.0, 9.0, 27.0), 0, "passed", "the node is over its SLO under this traffic", "before"),
    ((22.0, 21.0, 30.0), (24.0, 23.0, 31.0), 0, "passed", "Triton's own 21.00 ms -> 23.00 ms per request", "before"),
    # worse than before by more than NO_WORSE, by the canary's p99 (a few requests waiting) or Triton's
    # own time per request (a slower model) -> fails
    ((18.0, 8.0, 26.0), (40.0, 8.2, 25.0), 0, "failed", "Triton's own p99 per request 25.00 ms is over the SLO", "triton"),
    ((18.0, 8.0, 26.0), (18.0, 12.0, 25.0), 0, "failed", "Triton's own p99 per request 25.00 ms is over the SLO", "triton"),
    ((18.0, 15.0, 26.0), (18.0, 25.0, 40.0), 0, "failed", "Triton's own time per request 25.00 ms is over the SLO", "triton"),
    ((30.0, 8.0, None), (90.0, 8.0, None), 0, "failed", "p99 latency 90.00 ms is over the SLO", "canary"),
    # no Triton figures (no metrics port): the canary's p99 against before's
    ((30.0, None, None), (35.0, None, None), 0, "passed", "canary p99 30.00 -> 35.00 ms", "before"),
    ((30.0, None, None), (90.0, None, None), 0, "failed", "p99 latency 90.00 ms is over the SLO", "canary"),
    # the old config within the SLO: the new one over it fails as before
    ((12.0, 8.0, 15.0), (12.5, 8.0, 25.0), 0, "failed", "Triton's own p99 per request 25.00 ms is over the SLO", "triton"),
    ((12.0, 8.0, None), (30.0, 8.0, None), 0, "failed", "p99 latency 30.00 ms is over the SLO", "canary"),
    # a failed request fails whatever before was
    ((18.0, 8.0, 26.0), (17.0, 8.2, 25.0), 2, "failed", "requests failed or none answered", ""),
    # within the SLO after: the canary decides, before does not matter
    ((18.0, 8.0, 26.0), (12.0, 8.0, 15.0), 0, "passed", "p99 12.00 ms <= SLO 20 ms", "canary"),
])
def test_a_node_over_its_slo_before_the_reload(monkeypatch, before, after, failures, verdict, says, judged_by):
    """before_reload's figures (the old config under the same live traffic): a new config over the SLO
    passes only when the old one was over it too and the new one is within NO_WORSE of it."""
    t = stand_in(metrics_port=8002)
    monkeypatch.setattr(gate, "warm_up", lambda *a, **k: 0.0)
    monkeypatch.setattr(gate, "live_rate", lambda *a, **k: 9000.0)
    monkeypatch.setattr(gate, "canary", lambda *a, **k: live(*after, failures=failures))
    rep = gate.run_gate(t, before={"m": live(*before)})
    assert rep.verdict == verdict and says in rep.message, rep.message
    assert rep.loads[0].judged_by == judged_by
    assert [x["p99_ms"] for x in rep.to_dict()["before"]] == [before[0]]
    # without before's figures the same result is judged as it always was
    if judged_by == "before":
        assert gate.run_gate(t).verdict == "failed"


@pytest.mark.parametrize("before, after, verdict, says", [
    # a client-bound canary on either side: its p99 is the client's, Triton's own mean decides alone
    (live(90.0, 8.0, 26.0, late=LATE), live(17.0, 8.2, 25.0), "passed", "the canary's p99 not compared"),
    (live(10.0, 8.0, 26.0), live(90.0, 8.2, 25.0, late=LATE), "passed", "Triton's own 8.00 ms -> 8.20 ms"),
    (live(90.0, 8.0, 26.0, late=LATE), live(17.0, 12.0, 25.0), "failed", "Triton's own p99 per request 25.00 ms"),
    # nothing comparable (no Triton figures, a late canary): never "no worse"
    (live(90.0, None, None, late=LATE), live(30.0, None, None), "failed", "p99 latency 30.00 ms is over the SLO"),
])
def test_a_late_canary_is_no_baseline(monkeypatch, before, after, verdict, says):
    t = stand_in(metrics_port=8002)
    monkeypatch.setattr(gate, "warm_up", lambda *a, **k: 0.0)
    monkeypatch.setattr(gate, "live_rate", lambda *a, **k: 9000.0)
    monkeypatch.setattr(gate, "canary", lambda *a, **k: after)
    rep = gate.run_gate(t, before={"m": before})
    assert rep.verdict == verdict and says in rep.message, rep.message


def test_before_reload_reads_only_models_with_live_traffic(monkeypatch):
    t = stand_in(metrics_port=8002)
    t.models = [SimpleNamespace(name="busy"), SimpleNamespace(name="idle"), SimpleNamespace(name="other")]
    rates = {"busy": 900.0, "idle": 1.0, "other": 900.0}
    monkeypatch.setattr(gate, "live_rate", lambda t, m, s: rates[m.name])
    monkeypatch.setattr(gate, "canary", lambda t, m, rate, proto: live(10.0, 4.0, 8.0))
    got = gate.before_reload(t, ["busy", "idle"])
    assert list(got) == ["busy"] and got["busy"].mode == "live"

    monkeypatch.setattr(gate, "live_rate", lambda t, m, s: 900.0)
    # a late canary is kept with Triton's own time per request (no_worse then compares that alone),
    # never without it: a late client's p99 is no baseline
    monkeypatch.setattr(gate, "canary", lambda t, m, rate, proto: live(60.0, 4.0, 8.0, late=LATE))
    assert list(gate.before_reload(t, ["busy"])) == ["busy"]
    monkeypatch.setattr(gate, "canary", lambda t, m, rate, proto: live(60.0, None, None, late=LATE))
    assert gate.before_reload(t, ["busy"]) == {}

    def unreadable(t, m, s):
        raise gate.HkError("metrics: connection refused")
    monkeypatch.setattr(gate, "live_rate", unreadable)
    assert gate.before_reload(t, ["busy"]) == {}


def test_a_starved_canary_is_client_bound_not_a_failed_server(monkeypatch):
    """A canary whose processes did not get the CPU in its window (a 2-core machine running two suites:
    0 requests, and Triton first read after the window ended) measured nothing: client-bound, the
    deployment kept and said so; a canary that sent requests and got no answer still fails."""
    from hkgpu_tune.serve.measuring import loadgen
    t = stand_in(metrics_port=8002)
    monkeypatch.setattr(gate, "warm_up", lambda *a, **k: 0.0)
    monkeypatch.setattr(gate, "live_rate", lambda *a, **k: 3900.0)
    base = {"requests": 0, "errors": 0, "duration_s": 3.0, "client_busiest_process": 0.1, "client_loop_lag_ms": 0.0,
            "p50_ms": 0.0, "mean_ms": 0.0}
    starved = loadgen.client_bound({**base, "sent": 0})
    assert "sent no request in its window" in starved
    assert loadgen.client_bound({**base, "sent": 40}) == ""   # sent, never answered: the server

    for why, verdict in ((starved, "client-bound"), ("", "failed")):
        monkeypatch.setattr(gate, "canary", lambda *a, why=why, **k: gate.LoadResult(
            "m", 0, 4, 0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0, mode="live", live_req_s=3900.0, client_bound=why))
        rep = gate.run_gate(t)
        assert rep.verdict == verdict, rep.message
        if why:
            assert "the canary measured nothing" in rep.message and starved in rep.message, rep.message
        else:
            assert "requests failed or none answered" in rep.message, rep.message
