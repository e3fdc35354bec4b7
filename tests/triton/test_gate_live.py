"""The gate on a busy node, on the real CPU tritonserver: an independent client (bench/reload_client.py,
plain http.client, no hkgpu_tune code) keeps 8 requests in flight while `hkgpu-tune apply` reloads the
model. The gate sees the live traffic in Triton's own counts and judges the new config by what that
traffic gets (a canary of a few requests in flight and Triton's per-model figures over a window)
instead of adding its full load, and says so. A good reload passes; a slow config (every request
waits out a 400 ms queue delay) fails and the previous config serves again; no live request fails.
The gate's own loads (the first apply, with nothing else running) go over gRPC (gate.load.protocol)."""
from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time

import pytest

from .conftest import dump, free_ports, needs_server, profile_dict
from .test_reload_under_load import ROOT, cli, reload_client, server_pids

pytestmark = [needs_server, pytest.mark.slow]

SLO_MS = 150


@pytest.fixture(scope="module")
def busy(tmp_path_factory):
    root = tmp_path_factory.mktemp("busy")
    ports = free_ports(3)
    state = str(root / "state")
    n = {"i": 0}

    def profile(count=2, delay_us=2000):
        doc = profile_dict(root, ports, delay_us=delay_us, p99_ms=SLO_MS, requests=64, concurrency=8)
        doc["triton"]["models"][0]["instance_group"] = [{"count": count, "kind": "KIND_CPU"}]
        doc["triton"]["gate"]["load"]["protocol"] = "grpc"
        doc["triton"]["gate"]["live"] = {"window_s": 3, "canary": 2}
        n["i"] += 1
        path = root / f"p{n['i']}.yaml"
        path.write_text(dump(doc))
        return str(path)

    first = profile()
    p = cli("apply", "--only", "triton", "-p", first, "--state-dir", state, "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    notes = json.loads(p.stdout)["notes"]
    (pid,) = server_pids(ports[0])
    stop = root / "stop"
    load = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", "reload_client.py"), "--port", str(ports[0]),
                             "--model", "doubler", "--input", "INPUT0", "--output", "OUTPUT0", "--dtype", "FP32",
                             "--shape", "4", "--procs", "2", "--threads", "4", "--duration", "600",
                             "--stop-file", str(stop), "--out", str(root / "load")])
    try:
        time.sleep(3)
        yield {"profile": profile, "state": state, "port": ports[0], "metrics": ports[2], "pid": pid,
               "first_notes": notes, "stop": stop, "load": load, "root": root}
    finally:
        stop.write_text("")
        load.wait(60)
        from hkgpu_tune.core.profile import load_profile
        from hkgpu_tune.serve.running import launch
        launch.stop(load_profile(first).section("triton"))


def served(port: int) -> dict:
    """The config Triton serves, read over HTTP by hand."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", "/v2/models/doubler/config")
        return json.loads(c.getresponse().read())
    finally:
        c.close()


def flat(text: str) -> str:
    return " ".join(text.split())


def test_idle_node_is_gated_by_its_own_load_over_grpc(busy):
    (note,) = busy["first_notes"]
    assert note.startswith("triton gate passed:") and "judged by the gate's own load" in note, note
    assert "64 requests at concurrency 8 (grpc)" in note, note


def test_reloads_on_a_busy_node(busy):
    t0 = time.time()
    good = cli("apply", "--only", "triton", "-p", busy["profile"](count=3), "--state-dir", busy["state"])
    t1 = time.time()
    out = flat(good.stdout + good.stderr)
    assert good.returncode == 0, out
    assert "triton gate passed" in out and "judged by live traffic" in out, out
    assert served(busy["port"])["instance_group"][0]["count"] == 3

    t2 = time.time()
    slow = cli("apply", "--only", "triton", "-p", busy["profile"](count=3, delay_us=400_000), "--state-dir",
               busy["state"])
    t3 = time.time()
    out = flat(slow.stdout + slow.stderr)
    errs = [ln for ln in (slow.stdout + slow.stderr).splitlines() if ln.startswith("error:")]
    assert slow.returncode == 1 and len(errs) == 1 and "Traceback" not in out, out
    assert "gate failed" in out and "judged by live traffic" in out, out
    assert "the previous config is serving again" in out, out
    assert served(busy["port"])["dynamic_batching"]["max_queue_delay_microseconds"] == 2000

    busy["stop"].write_text("")
    busy["load"].wait(60)
    recs = reload_client.load(str(busy["root"] / "load"))
    for a, b in ((t0, t1 + 1), (t2, t3 + 1)):
        w = reload_client.window(recs, a, b)
        assert w["requests"] > 8 and w["failed_requests"] == 0, w
    assert server_pids(busy["port"]) == [busy["pid"]]
