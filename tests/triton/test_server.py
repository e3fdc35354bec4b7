"""A real tritonserver (the nvidia-pytriton wheel) launched by the library without systemd:
ready, warm-up, dynamic batching seen in Triton's own metrics, the latency gate, verify and a clean stop."""
from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import sys
import time

import psutil
import pytest

from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.profile import load_profile
from hkgpu_tune.core.report import DRIFT, OK
from hkgpu_tune.serve.repository import render
from hkgpu_tune.serve.running import client, forms, launch
from hkgpu_tune.serve.measuring import gate

from tests.helpers import gone, processes

from .conftest import dump, free_ports, needs_server, profile_dict

pytestmark = [needs_server, pytest.mark.slow]


def ours(root) -> list[psutil.Process]:
    """Processes whose command line names our test directory (the server and its Python stubs)."""
    return processes(lambda p: str(root) in " ".join(p.info["cmdline"] or []))


def write(root, doc) -> str:
    root.mkdir(parents=True, exist_ok=True)
    f = root / "profile.yaml"
    f.write_text(dump(doc))
    return str(f)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton")
    ports = free_ports(3)
    doc = profile_dict(root, ports)
    path = write(root, doc)
    t = load_profile(path).section("triton")
    render.write_repository(t)
    t0 = time.monotonic()
    st = launch.start(t)
    try:
        launch.wait_ready(t)
        ready_s = time.monotonic() - t0
        yield {"t": t, "root": root, "ports": ports, "doc": doc, "path": path, "start": st, "ready_s": ready_s}
    finally:
        launch.stop(t)


def test_ready_pinned_and_bound_to_loopback(server):
    t, st = server["t"], server["start"]
    assert server["ready_s"] < 60
    with client.Client(t.http.host, t.http.port) as c:
        assert c.ready() and c.model_ready("doubler")
    proc = psutil.Process(st["pid"])
    assert proc.cpu_affinity() == forms.placement(t)["cpus"]
    listening = {(cn.laddr.ip, cn.laddr.port) for cn in proc.net_connections("tcp") if cn.status == "LISTEN"}
    assert {p for _, p in listening} >= set(server["ports"]), launch.log_tail(t, 30)  # metrics included
    assert {ip.removeprefix("::ffff:") for ip, _ in listening} == {"127.0.0.1"}  # nothing on 0.0.0.0 unless asked


def test_inference_is_correct(server):
    t = server["t"]
    raw = struct.pack("<4f", 1.0, 2.0, 3.5, -4.0)
    with client.Client(t.http.host, t.http.port) as c:
        out = c.infer("doubler", [("INPUT0", "FP32", [1, 4], raw)])   # no output named: all of them, binary
        assert out["outputs"][0]["name"] == "OUTPUT0" and "data" not in out["outputs"][0]
        assert struct.unpack("<4f", out["outputs"][0]["raw"]) == (2.0, 4.0, 7.0, -8.0)
        out = c.infer("doubler", [("INPUT0", "FP32", [1, 4], raw)], outputs=("OUTPUT0",))
    assert struct.unpack("<4f", out["outputs"][0]["raw"]) == (2.0, 4.0, 7.0, -8.0)


def test_dynamic_batching_merges_concurrent_requests(server):
    t = server["t"]
    m = t.models[0]
    host, port = t.metrics.host, t.metrics.port
    gate.warm_up(t, m, 4)
    before = client.model_counts(host, port, "doubler")
    r = gate.load(t, m, requests=96, concurrency=16)
    assert r.errors == 0
    after = client.model_counts(host, port, "doubler")
    inferences = after["nv_inference_count"] - before["nv_inference_count"]
    executions = after["nv_inference_exec_count"] - before["nv_inference_exec_count"]
    assert inferences >= 96   # the 96 counted, after a second of the same load not counted
    assert 0 < executions < inferences, (executions, inferences)  # batches of several requests


def test_gate_passes_under_a_loose_slo(server):
    rep = gate.run_gate(server["t"], p99_ms=10_000, requests=48, concurrency=8)
    assert rep.passed, rep.message
    assert rep.loads[0].errors == 0 and rep.loads[0].requests == 48
    assert rep.message.startswith("doubler: p99 ") and "<= SLO 10000 ms" in rep.message


def test_gate_fails_with_the_figures_under_an_impossible_slo(server):
    rep = gate.run_gate(server["t"], p99_ms=0.001, requests=32, concurrency=4)
    assert not rep.passed
    r = rep.loads[0]
    own = f", Triton's own {r.server_request_ms:.2f} ms per request" if r.server_request_ms is not None else ""
    assert rep.message == f"doubler: p99 latency {r.p99_ms:.2f} ms is over the SLO of 0.001 ms{own} ({r.line()})"
    with pytest.raises(gate.GateFailed, match="triton gate failed: doubler: p99 latency"):
        gate.require(server["t"], p99_ms=0.001, requests=8, concurrency=2)
    # the CLI: exit 1 and the same figures
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "triton", "gate", "-p", server["path"],
                        "--p99-ms", "0.001", "--requests", "16", "--concurrency", "4"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert p.stdout.startswith("triton gate: profile ")   # then the verdict on a line of its own
    assert "\ngate FAILED: doubler: p99 latency " in p.stdout and "over the SLO of 0.001 ms" in p.stdout


def test_verify_ok_then_a_changed_served_config_is_drift(server, tmp_path):
    res = Engine(load_profile(server["path"]), only=["triton"]).verify()
    assert {(r.key, r.status) for r in res} == {
        ("repository", OK), ("service", OK), ("command", OK), ("server_ready", OK), ("model_ready", OK),
        ("served_config", OK), ("metrics", OK)}
    # the profile now asks for another queue delay and instance count: the running server serves the old
    doc = json.loads(json.dumps(server["doc"]))
    doc["triton"]["models"][0]["dynamic_batching"]["max_queue_delay_microseconds"] = 100
    doc["triton"]["models"][0]["instance_group"][0]["count"] = 2
    f = tmp_path / "changed.yaml"
    f.write_text(dump(doc))
    res = {r.key: r for r in Engine(load_profile(str(f)), only=["triton"]).verify()}
    sc = res["served_config"]
    assert sc.status == DRIFT
    assert "instance_group[0].count: served 1, profile 2" in sc.reason
    assert "dynamic_batching.max_queue_delay_microseconds: served 20000, profile 100" in sc.reason
    assert res["repository"].status == DRIFT and res["model_ready"].status == OK
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "verify", "--only", "triton", "-p", str(f), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    failed = {x["key"] for x in json.loads(p.stdout)["failures"]}
    assert failed == {"repository", "served_config"}


def test_port_in_use_is_a_clear_error(server, tmp_path):
    doc = profile_dict(tmp_path, (server["ports"][0], *free_ports(2)))
    t = load_profile(write(tmp_path, doc)).section("triton")
    render.write_repository(t)
    with pytest.raises(HkError) as e:
        launch.start(t)
    assert str(e.value) == (f"triton: the http port {server['ports'][0]} on 127.0.0.1 is already in use "
                            f"(another server? pick a free port under triton.http.port)")
    assert ours(tmp_path) == []


def test_a_clock_step_does_not_lose_the_server(server, monkeypatch):
    """The wall-clock boot time moves when NTP steps or slews the clock (by a second when it sits on
    a second boundary): the server is still the one we started; a recycled pid is not."""
    t = server["t"]
    assert launch.status(t)["active"]
    real = psutil._psplatform.boot_time
    for shift in (1.0, -1.0, -300.0):
        monkeypatch.setattr(psutil._psplatform, "boot_time", lambda s=shift: real() + s)
        assert launch.status(t)["active"], f"a boot time moved by {shift} s lost the server"
    monkeypatch.setattr(psutil._psplatform, "boot_time", real)
    # the same pid started at another moment is another process
    state = launch._load_state(t)
    monkeypatch.setattr(launch, "_load_state", lambda _t: state | {"start_ticks": state["start_ticks"] + 1})
    assert not launch.status(t)["active"]


def test_stop_leaves_no_process(server):
    t, root = server["t"], server["root"]
    assert ours(root), "the server and its stub run before the stop"
    started = psutil.Process(server["start"]["pid"]).create_time()
    rep = launch.stop(t)
    assert rep["stopped"] and rep["left"] == [] and rep["how"] == "SIGTERM", (rep, launch.log_tail(t, 30))
    # every client of the library and of these tests closed its connection: tritonserver did not wait
    # out its exit timeout for one (it did when a test kept a Client alive in a traceback)
    assert "note" not in rep and "Exit timeout expired" not in open(server["start"]["log"]).read(), rep
    assert ours(root) == []
    assert not launch.status(t)["active"]
    assert launch.stop(t)["how"] == "was not running"
    assert gone(server["start"]["pid"], started)   # its pid may be another process's by now


@pytest.mark.parametrize("seen_gone_early", [False, True])
def test_a_model_that_fails_to_load_gives_the_server_log(tmp_path, monkeypatch, seen_gone_early):
    """seen_gone_early: the race CI hit, forced. /proc calls the process gone (its exe link already
    unreadable) before it is a zombie, so its exit status is not there yet; the liveness check says
    gone from the start. wait_ready waits for the child's exit status instead of reporting a death
    it has not seen."""
    bad = tmp_path / "bad.py"
    bad.write_text("this is not python\n")
    doc = profile_dict(tmp_path, free_ports(3))
    doc["triton"]["models"][0]["model_file"] = str(bad)
    t = load_profile(write(tmp_path, doc)).section("triton")
    render.write_repository(t)
    launch.start(t)
    if seen_gone_early:
        monkeypatch.setattr(launch, "_alive", lambda st: False)
    try:
        with pytest.raises(HkError) as e:
            launch.wait_ready(t, timeout=60)
        assert str(e.value).startswith("triton: the server exited before it was ready")
        assert re.search(r"is gone \(see [^)]+\), exit code [1-9]\d*\)", str(e.value)), str(e.value)
        assert re.search(r"load failed for model 'doubler'|failed to load", str(e.value)), str(e.value)
    finally:
        monkeypatch.undo()
        launch.stop(t)
    assert ours(tmp_path) == []


def test_apply_starts_and_gates_rollback_stops(tmp_path):
    """The engine's verbs: apply renders and starts (the gate decides), rollback stops."""
    doc = profile_dict(tmp_path, free_ports(3), requests=32, concurrency=4)
    path = write(tmp_path / "ok", doc)
    prof = load_profile(path)
    eng = Engine(prof, only=["triton"], state_dir=str(tmp_path / "state"))
    try:
        rep = eng.apply()
        assert rep.error == "", rep.error
        assert {c.key for c in rep.changes} == {"repository", "service"}
        assert all(r.status == OK for r in rep.results), [r.to_dict() for r in rep.results if r.status != OK]
        assert Engine(prof, only=["triton"], state_dir=str(tmp_path / "state")).plan()[0] == []  # nothing left to do
        restored, errs = eng.rollback()
        assert errs == [] and len(restored) == 2
        assert ours(tmp_path / "ok") == []
    finally:
        launch.stop(prof.section("triton"))
    # an impossible SLO: the deployment fails with the figures and is rolled back
    doc = profile_dict(tmp_path / "slo", free_ports(3), p99_ms=0.001, requests=16, concurrency=4)
    prof = load_profile(write(tmp_path / "slo", doc))
    eng = Engine(prof, only=["triton"], state_dir=str(tmp_path / "state2"))
    try:
        rep = eng.apply()
        assert rep.rolled_back and rep.error.startswith("triton gate failed: doubler: p99 latency ")
        assert "over the SLO of 0.001 ms" in rep.error
        assert ours(tmp_path / "slo") == []
    finally:
        launch.stop(prof.section("triton"))


def test_port_taken_by_another_program(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        port = s.getsockname()[1]
        http, metrics = [p for p in free_ports(3) if p != port][:2]
        doc = profile_dict(tmp_path, (http, port, metrics))
        t = load_profile(write(tmp_path, doc)).section("triton")
        render.write_repository(t)
        with pytest.raises(HkError, match=f"the grpc port {port} on 127.0.0.1 is already in use"):
            launch.start(t)
    finally:
        s.close()


def test_cli_start_gate_stop(tmp_path):
    doc = profile_dict(tmp_path, free_ports(3), requests=16, concurrency=4)
    path = write(tmp_path, doc)

    def hk(*args):
        return subprocess.run([sys.executable, "-m", "hkgpu_tune", "triton", *args, "-p", path],
                              capture_output=True, text=True, timeout=120)
    try:
        p = hk("start", "--json")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert doc["service"]["active"] and doc["gate"]["passed"] and not doc["already_running"]
        assert doc["ready_s"] < 60
        p = hk("start", "--no-gate")
        assert p.returncode == 0 and "(already running)" in p.stdout
        p = hk("stop")
        assert p.returncode == 0 and " ".join(p.stdout.split()).startswith(f"triton stop: profile {tmp_path}"), p.stdout + p.stderr
        assert "\nstopped (SIGTERM" in p.stdout, p.stdout + p.stderr
        assert ours(tmp_path) == []
    finally:
        launch.stop(load_profile(path).section("triton"))

