"""The sweep's confirming load: the chosen level measured again over a longer load, stepped down a
fifth while its p99 is over the SLO; the answer is the load that held, or a one-line failure."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from hkgpu_tune.serve.measuring import sweep, sweep_out


def load(conc, p99, errors=0, duration=5.0):
    return {"concurrency": conc, "p99_ms": p99, "p50_ms": p99 / 2, "img_s": conc * 100.0, "errors": errors,
            "requests": 1000, "duration_s": duration}


@pytest.fixture
def scripted(monkeypatch):
    """loadgen.run answering from a list of p99s (or (p99, errors)), recording the specs asked for."""
    asked = []

    def setup(answers):
        def run(spec):
            asked.append(spec)
            a = answers[len(asked) - 1]
            p99, errors = a if isinstance(a, tuple) else (a, 0)
            return load(spec.concurrency, p99, errors, spec.duration_s)
        monkeypatch.setattr(sweep.loadgen, "run", run)
        return asked
    return setup


def point(conc=100, p99=9.0):
    p = sweep.Point({"max_batch_size": 8}, "mb 8", False)
    p.best = load(conc, p99, duration=2.5)
    p.loads.append(p.best)
    return p


SERVER = SimpleNamespace(t=SimpleNamespace(http=SimpleNamespace(host="127.0.0.1", port=1),
                                           metrics=SimpleNamespace(port=2),
                                           grpc=SimpleNamespace(host="127.0.0.1", port=3)))
MODEL = SimpleNamespace(name="m", max_batch_size=8, inputs=[{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
                        outputs=[{"name": "OUT"}])


def test_a_level_that_holds_is_the_answer(scripted):
    asked = scripted([8.0])
    p = point()
    sweep.confirm(SERVER, MODEL, p, 7.5, 8, False, 10.0)
    assert p.confirmed is True and p.best["duration_s"] == 7.5 and p.best["confirm"]
    assert [s.concurrency for s in asked] == [100] and asked[0].duration_s == 7.5


def test_a_level_over_the_slo_steps_down_a_fifth_until_one_holds(scripted):
    asked = scripted([12.0, 11.0, 9.5])
    p = point()
    sweep.confirm(SERVER, MODEL, p, 7.5, 8, False, 10.0)
    assert [s.concurrency for s in asked] == [100, 80, 64]
    assert p.confirmed is True and p.best["concurrency"] == 64 and p.best["p99_ms"] == 9.5
    assert sum(1 for x in p.loads if x.get("confirm")) == 3   # every confirming load is kept


def test_nothing_held_is_a_one_line_failure(scripted):
    scripted([12.0, 11.0, 10.5])
    p = point()
    sweep.confirm(SERVER, MODEL, p, 7.5, 8, False, 10.0)
    assert p.confirmed is False and p.best["duration_s"] == 2.5   # the short load, marked unconfirmed
    rep = sweep.Report("m", 10.0, 60, points=[p], best=p)
    msg = sweep.failure(rep)
    assert msg == ("triton sweep: the best config (mb 8) did not hold p99 <= 10 ms under a longer load "
                   "(last: 64 in flight, p99 10.50 ms, 0 errors)")
    assert "NOT confirmed" in sweep_out.table(rep)


def test_errors_stop_the_confirming_at_once(scripted):
    asked = scripted([(5.0, 3)])
    p = point()
    sweep.confirm(SERVER, MODEL, p, 7.5, 8, False, 10.0)
    assert len(asked) == 1 and p.confirmed is False
    assert "3 errors" in sweep.failure(sweep.Report("m", 10.0, 60, points=[p], best=p))
