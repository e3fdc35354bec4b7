"""The load generator against the real CPU tritonserver: closed and open loop, binary HTTP and
system shared memory, Triton's own figures over the same window, errors counted not hidden."""
from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import pytest

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.profile import load_profile
from hkgpu_tune.serve.repository import render
from hkgpu_tune.serve.running import launch
from hkgpu_tune.serve.measuring import loadgen

from .conftest import dump, free_ports, needs_server, profile_dict


def test_percentile_is_the_nearest_rank():
    rng = np.random.default_rng(7)
    vals = sorted(rng.exponential(3.0, 997).tolist())
    for q in (50, 95, 99, 100):
        assert loadgen.percentile(vals, q) == np.percentile(vals, q, method="inverted_cdf")
    assert loadgen.percentile([], 99) == 0.0


def test_unknown_data_type_is_one_line():
    spec = loadgen.LoadSpec("127.0.0.1", 1, "m", "IN", "FP8", [1, 4])
    with pytest.raises(HkError, match="no test data for data type FP8"):
        loadgen.run(spec)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("loadgen")
    p = root / "p.yaml"
    p.write_text(dump(profile_dict(root, free_ports(3), delay_us=0)))
    t = load_profile(str(p)).section("triton")
    render.write_repository(t)
    launch.start(t)
    try:
        launch.wait_ready(t)
        yield t
    finally:
        launch.stop(t)


def spec(t, **kw):
    base = loadgen.LoadSpec(t.http.host, t.http.port, "doubler", "INPUT0", "FP32", [1, 4], "OUTPUT0",
                            concurrency=8, processes=2, duration_s=1.5, warmup_s=0.5, metrics_port=t.metrics.port)
    return dataclasses.replace(base, **kw)


@needs_server
@pytest.mark.parametrize("shm", [False, True])
def test_closed_loop_counts_what_triton_counts(served, shm):
    t0 = time.time()
    r = loadgen.run(spec(served, shm=shm))
    # the measured window (what GPU samples are averaged over): the duration, after start-up and warm-up
    w0, w1 = r["window"]
    assert w1 - w0 == pytest.approx(1.5, abs=0.01) and t0 < w0 < w1 <= time.time()
    assert r["errors"] == 0 and r["requests"] > 50, r
    assert r["transport"] == ("http+shm" if shm else "http-binary")
    assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] <= r["max_ms"]
    assert r["img_s"] == pytest.approx(r["requests"] / 1.5, rel=0.01)
    sv = r["server"]
    # Triton's own rate is close to the client's (its figures are read when this process gets to it:
    # its window is not the client's, its rate is over its own)
    assert sv["req_s"] == pytest.approx(r["req_s"], rel=0.25), (sv, r["req_s"])
    assert sv["avg_batch"] >= 1 and sv["compute_infer_us"] > 0
    assert r["client_cpu_cores"] > 0
    if shm:   # the region is unregistered and unlinked afterwards
        assert not [f for f in os.listdir("/dev/shm") if f.startswith("hkgpu-")]


@needs_server
def test_open_loop_holds_the_rate(served):
    r = loadgen.run(spec(served, rate=120, concurrency=64, duration_s=2.0))
    assert r["mode"] == "open" and r["errors"] == 0
    assert r["requests"] == pytest.approx(240, rel=0.2), r


@needs_server
def test_errors_are_counted_with_the_first_reason(served):
    r = loadgen.run(spec(served, model="no_such_model", metrics_port=None))
    assert r["requests"] == 0 and r["errors"] > 0, r
    assert "HTTP 4" in r["first_error"] and "no_such_model" in r["first_error"], r["first_error"]
