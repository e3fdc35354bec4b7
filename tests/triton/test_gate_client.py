"""The gate as apply runs it, on the real CPU tritonserver: outputs Triton will not send as JSON
(FP16, INT8, BYTES) are asked for in binary, and a gate whose load generator cannot offer the load
says "client-bound" (the deployment stays) instead of failing the server."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from hkgpu_tune.core.profile import load_profile
from hkgpu_tune.serve.repository import batch_backend
from hkgpu_tune.serve.running import client, launch

from tests.cpu_limit import NoCpuController, cpu_share

from .conftest import DATA, dump, free_ports, needs_server, profile_dict

pytestmark = [needs_server, pytest.mark.slow]

TYPED_PY = f"{DATA}/typed.py"
# the client-bound case's SLO: over Triton's own time per request, far under the p99 of one client
# process held to CLIENT_CPU of a CPU with 512 in flight (Little's law: 512 x its CPU time per request
# / CLIENT_CPU, over a second for any Python client on any machine). Where Triton's own time is over
# it, the test checks that the server is failed for that reason instead (xfail, below).
SLO_MS = 150
CLIENT_CPU = 0.1   # the gate's client: a tenth of one CPU (a cgroup's CPU quota), whatever the machine


def typed_profile(root, **kw) -> str:
    """The test profile with a model whose outputs are FP16, INT8 and BYTES."""
    doc = profile_dict(root, free_ports(3), **kw)
    m = doc["triton"]["models"][0]
    m.update(name="typed", model_file=TYPED_PY, outputs=[
        {"name": "HALF", "data_type": "FP16", "dims": [4]},
        {"name": "SMALL", "data_type": "INT8", "dims": [4]},
        {"name": "NAME", "data_type": "STRING", "dims": [1]}])
    root.mkdir(parents=True, exist_ok=True)
    path = root / "profile.yaml"
    path.write_text(dump(doc))
    return str(path)


def apply(path, state, preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", "apply", "--only", "triton", "-p", path,
                           "--state-dir", str(state), "--json"], capture_output=True, text=True, timeout=240,
                          preexec_fn=preexec_fn)


@pytest.fixture
def slow_client():
    """A preexec_fn that holds a subprocess (the gate's client: the server runs already, outside)
    to CLIENT_CPU of one CPU."""
    try:
        with cpu_share(CLIENT_CPU) as enter:
            yield enter
    except NoCpuController as e:
        pytest.skip(f"the client-bound case needs a client held to a share of a CPU on any machine: {e}")


def test_apply_gates_a_model_with_fp16_int8_and_bytes_outputs(tmp_path):
    path = typed_profile(tmp_path / "node", requests=64, concurrency=8, delay_us=1000)
    t = load_profile(path).section("triton")
    try:
        p = apply(path, tmp_path / "state")
        assert p.returncode == 0, p.stdout + p.stderr
        doc = json.loads(p.stdout)
        assert not doc["error"] and not doc["rolled_back"], doc
        assert len(doc["notes"]) == 1 and doc["notes"][0].startswith("triton gate passed: typed: p99 "), doc["notes"]
        # the figures are the server's: Triton counted every one of the gate's requests as a success
        counts = client.model_counts(t.http.host, t.metrics.port, "typed")
        assert counts["nv_inference_request_success"] >= 64 + 4, counts   # load + warm-up
        # every output came back binary, with its bytes (read by hand here, not with the gate's code)
        import http.client
        head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                       "parameters": {"binary_data_size": 16}}]}).encode()
        c = http.client.HTTPConnection(t.http.host, t.http.port, timeout=10)
        c.request("POST", "/v2/models/typed/infer", head + bytes(16),
                  {"Inference-Header-Content-Length": str(len(head))})
        r = c.getresponse()
        assert r.status == 400 and b"FP16" in r.read()   # the JSON answer the old gate asked for
        c.close()
    finally:
        launch.stop(t)


@pytest.mark.skipif(not batch_backend.available()[0], reason=f"hkbatch: {batch_backend.available()[1]}")
def test_a_client_bound_gate_keeps_the_deployment_and_says_so(tmp_path, slow_client):
    """A gate whose load generator cannot offer the load: one process, held to a tenth of a CPU
    (a cgroup's quota, the gate's client only: the server runs already), asked for 512 in flight. Its p99
    misses the SLO while Triton's own time per request is within it: the verdict is client-bound,
    apply keeps the reloaded deployment and says so in one line."""
    def profile(name, **kw):   # the hkbatch backend: batches gathered in C++, faster than one client process
        doc = profile_dict(tmp_path / name, free_ports(3), **kw)
        doc["triton"]["models"][0].update(name="rows", backend="hkbatch", model_file=f"{DATA}/batch_rows.py",
                                          max_batch_size=256)
        return doc
    light = profile("node", requests=32, concurrency=4, delay_us=0)
    (tmp_path / "node").mkdir(parents=True)
    path = str(tmp_path / "node" / "profile.yaml")
    with open(path, "w") as f:
        f.write(dump(light))
    t = load_profile(path).section("triton")
    try:
        p = apply(path, tmp_path / "state")
        assert p.returncode == 0 and json.loads(p.stdout)["notes"][0].startswith("triton gate passed: "), p.stdout
        pid = launch.status(t)["pid"]
        # a changed queue delay (a hot reload), and a gate one low-priority process cannot serve
        heavy = json.loads(json.dumps(light))
        heavy["triton"]["models"][0]["dynamic_batching"]["max_queue_delay_microseconds"] = 100
        heavy["triton"]["gate"].update(p99_ms=SLO_MS, load={"requests": 3000, "concurrency": 512, "processes": 1})
        with open(path, "w") as f:
            f.write(dump(heavy))
        assert load_profile(path).section("triton").gate.processes == 1
        p = apply(path, tmp_path / "state", preexec_fn=slow_client)
        out = json.loads(p.stdout)
        # the verdict follows Triton's own time per request, which this machine sets: within the SLO
        # the client is to blame (the case under test); on a machine too busy for Triton itself to
        # answer within it, the server is failed and the reason must say so (not a flaky test)
        own = re.search(r"Triton's own ([0-9.]+) ms per request", out["error"] or " ".join(out["notes"]))
        assert own, out
        if float(own.group(1)) > SLO_MS:
            assert p.returncode == 1 and out["rolled_back"], out
            assert out["error"].startswith("triton gate failed: rows: p99 latency ") and f"over the SLO of {SLO_MS} ms" in out["error"]
            pytest.xfail(f"Triton itself took {own.group(1)} ms a request on this machine (SLO {SLO_MS} ms; {out['error'][:400]}): the gate "
                         "failed the server, as it should; the client-bound case needs a server within the SLO")
        assert p.returncode == 0, p.stdout + p.stderr
        assert not out["error"] and not out["rolled_back"], out
        assert [c["key"] for c in out["changes"]] == ["served_config"] or out["changes"], out["changes"]
        assert len(out["notes"]) == 1, out["notes"]
        note = out["notes"][0]
        assert note.startswith("triton gate client-bound, deployment kept: rows: client-bound, p99 "), note
        assert "client 1 processes" in note and "says nothing about the server" in note
        # the same server serves the new config
        assert launch.status(t)["pid"] == pid
        cfg = client.Client(t.http.host, t.http.port).model_config("rows")
        assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == "100" or \
            cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 100, cfg["dynamic_batching"]
        # the one-line form a person reads
        p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "triton", "gate", "-p", path],
                           capture_output=True, text=True, timeout=240, preexec_fn=slow_client)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "\ngate client-bound: rows: client-bound, " in p.stdout, p.stdout
        # an SLO Triton's own time per request misses fails the server, client-bound or not
        p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "triton", "gate", "-p", path, "--p99-ms", "0.001"],
                           capture_output=True, text=True, timeout=240)
        assert p.returncode == 1 and "\ngate FAILED: rows: p99 latency " in p.stdout, p.stdout + p.stderr
    finally:
        launch.stop(t)
