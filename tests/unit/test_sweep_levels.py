"""The sweep's choice of load levels (hkgpu_tune.serve.measuring.sweep.measure), with a load generator whose
p99 grows with the load in a known way; the real server runs in tests/triton/test_sweep.py."""
from types import SimpleNamespace

from hkgpu_tune.serve.measuring import loadgen, sweep


def test_the_ramp_halving_and_bisection_in_order(monkeypatch):
    """The order of load levels, with p99 = 0.15 ms per request in flight (SLO 13.5 ms: 90 fits)."""
    def fake_run(spec):
        c = spec
        return {"concurrency": c, "p99_ms": 0.15 * c, "errors": 0, "requests": 100, "img_s": 100.0 * c}
    monkeypatch.setattr(sweep, "spec_for", lambda t, model, conc, *a: conc)
    monkeypatch.setattr(sweep.loadgen, "run", fake_run)
    monkeypatch.setattr(sweep.loadgen, "line", lambda r: "")

    def order(levels):
        pt = sweep.Point({}, "x", False)
        sweep.measure(SimpleNamespace(t=None), None, pt, levels, 1.0, 2, False, 13.5)
        return [x["concurrency"] for x in pt.loads], pt.best["concurrency"]
    assert order([96, 128]) == ([96, 48, 72, 84], 84)       # over at the lowest: halve, then bisect
    assert order([32, 64, 128]) == ([32, 64, 128, 96, 80], 80)
    assert order([88, 89]) == ([88, 89], 89)                 # nothing over: nothing to bisect
    assert order([80, 96]) == ([80, 96, 88], 88)            # 88 fits; 88..96 is within 88 // 8: stop


def test_each_load_protocol_has_its_plain_client():
    assert sorted(sweep.PLAIN) == sorted(loadgen.PROTOCOLS)
    assert {p: m.ENDPOINT for p, m in sweep.PLAIN.items()} == {"http": "http", "grpc": "grpc"}
