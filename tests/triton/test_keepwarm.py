"""Keep-warm against a real tritonserver: idle, it sends its small request each period; while a
client keeps the model busy, it sends nothing. Triton's own /metrics counts the requests."""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from hkgpu_tune.core.profile import load_profile
from hkgpu_tune.serve.repository import render
from hkgpu_tune.serve.running import client, launch

from .conftest import dump, free_ports, needs_server, profile_dict

pytestmark = [needs_server, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("kw")
    doc = profile_dict(root, free_ports(3))
    path = root / "profile.yaml"
    path.write_text(dump(doc))
    t = load_profile(str(path)).section("triton")
    render.write_repository(t)
    st = launch.start(t)
    try:
        launch.wait_ready(t)
        yield t, str(path), st["pid"]
    finally:
        launch.stop(t)


def successes(t) -> float:
    """nv_inference_request_success of the model, read with a plain GET (not the tool's client)."""
    text = urllib.request.urlopen(f"http://{t.metrics.host}:{t.metrics.port}/metrics", timeout=5).read().decode()
    return sum(float(m.group(1)) for m in
               re.finditer(r'^nv_inference_request_success\{[^}]*model="doubler"[^}]*\} (\S+)$', text, re.M))


def keepwarm(path, *args):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune.serve.running.keepwarm", "--profile", path, *args],
                          capture_output=True, text=True, timeout=60)


def test_idle_model_gets_one_request_per_period(server):
    t, path, _ = server
    before = successes(t)
    p = keepwarm(path, "--idle-s", "1", "--period-s", "0.5", "--duration-s", "4")
    assert p.returncode == 0, p.stderr
    sent = int(re.search(r"sent (\d+) request", p.stdout).group(1))
    assert successes(t) - before == sent
    assert 4 <= sent <= 7          # idle from 1 s to 4 s at one per 0.5 s


def test_busy_model_gets_none(server):
    t, path, _ = server
    stop = threading.Event()

    def traffic():
        c = client.Client(t.http.host, t.http.port)
        req = client.request_for(t.models[0])
        while not stop.is_set():
            c.infer("doubler", req)
            time.sleep(0.2)
        c.close()

    th = threading.Thread(target=traffic)
    th.start()
    try:
        p = keepwarm(path, "--idle-s", "1", "--period-s", "0.5", "--duration-s", "4")
    finally:
        stop.set()
        th.join()
    assert p.returncode == 0 and "sent 0 request" in p.stdout, p.stdout + p.stderr


def test_bad_arguments_are_one_line(server, tmp_path):
    _, path, _ = server
    p = keepwarm(path, "--model", "nope")
    assert p.returncode == 1 and p.stderr.strip() == "keepwarm: --model nope: not in the profile's triton.models"
    p = keepwarm(path, "--idle-s", "1", "--period-s", "5")
    assert p.returncode == 1 and "period_s <= idle_s" in p.stderr and "Traceback" not in p.stderr


def test_server_runs_with_the_connection_defaults(server):
    """tritonserver took triton.connections' options (it is ready with them: see the fixture)."""
    import psutil
    _, _, pid = server
    cmd = psutil.Process(pid).cmdline()
    for opt in ("--grpc-keepalive-time=60000", "--grpc-keepalive-permit-without-calls=1",
                "--grpc-http2-min-recv-ping-interval-without-data=10000"):
        assert opt in cmd, cmd
