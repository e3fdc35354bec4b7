"""A model load must not stall the requests of other connections (real CPU tritonserver).

Triton answers a repository load on the front-end thread that took it, and each of its HTTP threads
owns a share of the connections: a load sent over HTTP held every request of that share for the whole
load (20 of 32 connections for 7.6 s here; on the H200, requests of 14 to 17 s during a reload under
load, docs/perf/README.md). apply sends loads over gRPC. The client here is plain http.client threads,
one connection each; nothing of hkgpu_tune measures."""
from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from .conftest import MODEL_PY, dump, free_ports, needs_server, profile_dict

pytestmark = [needs_server, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INIT_S = 4
CONNECTIONS = 24
SLOW_INIT = f'''import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep({INIT_S})

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", (pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2).astype(np.float32))])
            for r in requests]
'''


HOST_DIR = {}   # this module's own host directory (journal registry), beside other modules' servers


def cli(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=ROOT, **HOST_DIR)
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("stall")
    HOST_DIR["HKGPU_TUNE_HOST_DIR"] = str(tmp_path_factory.mktemp("stall-host"))
    (root / "slow_init.py").write_text(SLOW_INIT)
    ports = free_ports(3)

    def profile(name, slow_count):
        doc = profile_dict(root, ports, delay_us=100)
        fast = doc["triton"]["models"][0]
        slow = json.loads(json.dumps(fast))
        slow.update(name="slowinit", model_file=str(root / "slow_init.py"),
                    instance_group=[{"count": slow_count, "kind": "KIND_CPU"}])
        doc["triton"]["models"].append(slow)
        (root / name).write_text(dump(doc))
        return str(root / name)

    first = profile("p1.yaml", 1)
    p = cli("apply", "--only", "triton", "-p", first, "--state-dir", str(root / "state"))
    assert p.returncode == 0, p.stdout + p.stderr
    try:
        yield {"root": root, "ports": ports, "profile": profile}
    finally:
        r = cli("rollback", "-p", first, "--state-dir", str(root / "state"))
        assert r.returncode == 0, r.stdout + r.stderr   # stops the server it started


def loaded_while(port: int, action) -> tuple[list, float, float]:
    """(start, seconds) of every request to doubler that began while `action` ran, from
    CONNECTIONS threads with a keep-alive connection each."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                                   "data": [1, 2, 3, 4]}]}).encode()
    stop, recs, errors = threading.Event(), [], []

    def worker():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            while not stop.is_set():
                t = time.monotonic()
                c.request("POST", "/v2/models/doubler/infer", body)
                r = c.getresponse()
                r.read()
                if r.status != 200:
                    errors.append(r.status)
                recs.append((t, time.monotonic() - t))
        except OSError as e:
            errors.append(repr(e))
        finally:
            c.close()

    threads = [threading.Thread(target=worker) for _ in range(CONNECTIONS)]
    for t in threads:
        t.start()
    time.sleep(1)
    t0 = time.monotonic()
    action()
    t1 = time.monotonic()
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(90)
    assert not errors, errors[:5]
    return [r for r in recs if t0 <= r[0] <= t1], t0, t1


def test_a_reload_over_apply_stalls_no_connection(node):
    changed = node["profile"]("p2.yaml", 2)
    out = {}

    def apply():
        out["p"] = cli("apply", "--only", "triton", "-p", changed, "--state-dir", str(node["root"] / "state"))

    during, t0, t1 = loaded_while(node["ports"][0], apply)
    p = out["p"]
    assert p.returncode == 0, p.stdout + p.stderr
    assert t1 - t0 >= INIT_S, "the reload did not wait for the slow model's load: this test could not fail"
    assert len(during) > CONNECTIONS * 10, len(during)
    slowest = max(d for _, d in during)
    assert slowest < INIT_S / 2, f"a request took {slowest:.2f} s while slowinit loaded ({t1 - t0:.1f} s)"


def ready(port: int, model: str) -> bool:
    """Triton's own answer, read here with http.client (not with the client under test)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("GET", f"/v2/models/{model}/ready")
        r = c.getresponse()
        r.read()
        return r.status == 200
    finally:
        c.close()


def test_model_control_falls_back_to_http_where_grpc_is_not_reachable(node):
    """Unloaded first (by hand, over HTTP): the fallback must really load it, not find it loaded."""
    from hkgpu_tune.serve.running import client
    (closed,) = free_ports(1)
    port = node["ports"][0]
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v2/repository/models/doubler/unload", b"{}", {"Content-Type": "application/json"})
    assert c.getresponse().status == 200
    c.close()
    end = time.monotonic() + 30
    while ready(port, "doubler") and time.monotonic() < end:
        time.sleep(0.1)
    assert not ready(port, "doubler"), "doubler did not unload: the load below would prove nothing"
    with client.Client("127.0.0.1", port, timeout=60, grpc=("127.0.0.1", closed)) as cl:
        cl.load_model("doubler")
    assert ready(port, "doubler")


def test_a_load_that_fails_over_grpc_gives_triton_s_first_line(node):
    from hkgpu_tune.core.errors import HkError
    from hkgpu_tune.serve.running import client
    http_port, grpc_port, _ = node["ports"]
    with client.Client("127.0.0.1", http_port, timeout=60, grpc=("127.0.0.1", grpc_port)) as c:
        with pytest.raises(HkError) as e:
            c.load_model("no_such_model")
        assert str(e.value).startswith("triton: no_such_model did not load: "), e.value
        assert "\n" not in str(e.value) and "StatusCode" not in str(e.value), e.value
        assert c.model_ready("doubler")   # the others keep serving
