"""The gate's verdict from its measured figures (the load itself is tested against a real
tritonserver in test_gate_client.py): a late client clears the server only when Triton's own time
per request, read from its metrics, is within the SLO; unread, the gate fails."""
from types import SimpleNamespace

import pytest

from hkgpu_tune.serve import gate


def figures(p99, bound="", server=None, errors=0):
    return gate.LoadResult("m", 100, 8, errors, 1.0, p99 / 2, p99 * 0.9, p99, p99 * 1.1, 100.0,
                           client_bound=bound, server_request_ms=server)


@pytest.mark.parametrize("p99, bound, server, verdict", [
    (10.0, "", 4.0, "passed"),
    (30.0, "", 4.0, "failed"),                           # the client was not late: the server missed
    (30.0, "a client process used 99% of a core", 4.0, "client-bound"),
    (30.0, "a client process used 99% of a core", 25.0, "failed"),   # Triton's own time misses too
    (30.0, "a client process used 99% of a core", None, "failed"),   # nothing clears the server
])
def test_verdict(monkeypatch, p99, bound, server, verdict):
    t = SimpleNamespace(gate=SimpleNamespace(p99_ms=20.0, requests=100, concurrency=8, processes=None,
                                             warmup_requests=1), models=[SimpleNamespace(name="m")])
    monkeypatch.setattr(gate, "warm_up", lambda *a, **k: 0.0)
    monkeypatch.setattr(gate, "load", lambda *a, **k: figures(p99, bound, server))
    rep = gate.run_gate(t)
    assert rep.verdict == verdict, rep.message
    if server is not None and verdict != "passed":   # the reason names the server's own time, the figure the verdict turned on
        assert f"Triton's own {server:.2f} ms per request" in rep.message, rep.message
    if server is None and bound:
        assert "could not be read" in rep.message and "not cleared" in rep.message
        with pytest.raises(gate.GateFailed):
            gate.require(t)
