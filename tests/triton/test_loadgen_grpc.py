"""The load generator over gRPC (protocol "grpc") on the real CPU tritonserver, beside the independent
gRPC client (plain_grpc: tritonclient's own InferenceServerClient): every request the generator counts
is one Triton counted as a success, errors are counted not hidden, and a wrong setting is one line.
Which of the two is faster at a load is a bench question (bench/serve_h200.py --protocols), not a test's."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.profile import load_profile
from hkgpu_tune.serve.repository import render
from hkgpu_tune.serve.running import client, launch
from hkgpu_tune.serve.measuring import loadgen, plain_grpc, sweep

from .conftest import dump, free_ports, needs_server, profile_dict
from .test_reload_under_load import ROOT

pytestmark = [needs_server, pytest.mark.slow]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("loadgen-grpc")
    p = root / "p.yaml"
    p.write_text(dump(profile_dict(root, free_ports(3), delay_us=500)))
    t = load_profile(str(p)).section("triton")
    render.write_repository(t)
    launch.start(t)
    launch.wait_ready(t)
    yield t
    launch.stop(t)


def test_grpc_load_is_counted_by_triton(served):
    t = served
    m = t.model("doubler")
    before = client.model_counts(t.http.host, t.metrics.port, "doubler")["nv_inference_request_success"]
    spec = dataclasses.replace(sweep.spec_for(t, m, 8, 0.0, 2, False, "grpc"), requests=300, warmup_s=0.5)
    r = loadgen.run(spec)
    after = client.model_counts(t.http.host, t.metrics.port, "doubler")["nv_inference_request_success"]
    assert r["transport"] == "grpc" and r["errors"] == 0 and r["requests"] == 300, r
    assert after - before >= 300, (before, after)   # the warm-up's requests come on top
    assert r["server"]["requests"] >= 300 and r["server"]["failures"] == 0, r["server"]
    assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]


def test_independent_grpc_client_at_the_same_load(served):
    t = served
    r = plain_grpc.run(t.grpc.host, t.grpc.port, "doubler", [("INPUT0", "FP32", [1, 4])], 8, processes=2,
                       duration_s=1.5)
    assert r["client"] == "plain-grpc" and r["errors"] == 0 and r["requests"] > 0, r


def test_grpc_errors_are_counted(served):
    t = served
    spec = dataclasses.replace(sweep.spec_for(t, t.model("doubler"), 4, 1.0, 1, False, "grpc"), model="absent")
    r = loadgen.run(spec)
    assert r["errors"] > 0 and r["requests"] == 0 and "gRPC" in r["first_error"], r


@pytest.mark.parametrize("change, msg", [({"shm": True}, "no shared memory"), ({"protocol": "grpcs"}, "expected one of"),
                                         ({"grpc_port": None}, "gRPC port")])
def test_bad_grpc_settings_are_one_line(served, change, msg):
    spec = dataclasses.replace(sweep.spec_for(served, served.model("doubler"), 4, 1.0, 1, False, "grpc"), **change)
    with pytest.raises(HkError, match=msg):
        loadgen.run(spec)


def sweep_cli(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", "triton", "sweep", *args], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)


def test_sweep_over_grpc_is_checked_by_the_grpc_client(tmp_path):
    """`triton sweep --protocol grpc` as users run it: its loads go over gRPC, and the check beside
    its choice runs tritonclient's own gRPC client."""
    p = tmp_path / "p.yaml"
    p.write_text(dump(profile_dict(tmp_path, free_ports(3), delay_us=500)))
    r = sweep_cli("-p", str(p), "--instances", "1", "--concurrency", "4", "--duration-s", "1", "--budget-s", "60",
                  "--slo-ms", "2000", "--protocol", "grpc", "--json")
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    out = json.loads(r.stdout)
    assert out["transport"] == "grpc" and all(x["transport"] == "grpc" for x in out["points"][0]["loads"]), out
    assert out["check"]["plain"]["client"] == "plain-grpc" and out["check"]["plain"]["errors"] == 0, out["check"]


def test_sweep_refuses_grpc_with_shm(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(dump(profile_dict(tmp_path, free_ports(3))))
    r = sweep_cli("-p", str(p), "--protocol", "grpc", "--shm", "--slo-ms", "20", timeout=60)
    assert r.returncode == 1 and "leave out --shm" in r.stderr + r.stdout and "Traceback" not in r.stderr, r.stderr
