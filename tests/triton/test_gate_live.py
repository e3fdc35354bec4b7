"""The gate on a busy node, on the real CPU tritonserver: an independent client (bench/reload_client.py,
plain http.client, no hkgpu_tune code) keeps 8 requests in flight while `hkgpu-tune apply` reloads the
model. The gate sees the live traffic in Triton's own counts and judges the new config by what that
traffic gets (a canary of a few requests in flight and Triton's per-model figures over a window)
instead of adding its full load, and says so. A good reload passes; a slow config (every batch takes
400 ms more: the test model's sleep_ms) fails and the previous config serves again; no live request fails.
The gate's own loads (the first apply, with nothing else running) go over gRPC (gate.load.protocol)."""
from __future__ import annotations

import http.client
import json
import math
import os
import re
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

    def profile(count=2, delay_us=2000, p99_ms=SLO_MS, sleep_ms=None):
        doc = profile_dict(root, ports, delay_us=delay_us, p99_ms=p99_ms, requests=64, concurrency=8)
        doc["triton"]["models"][0]["instance_group"] = [{"count": count, "kind": "KIND_CPU"}]
        if sleep_ms:   # tests/triton/data/doubler.py sleeps this long per batch
            doc["triton"]["models"][0]["config"] = {"parameters": {"sleep_ms": {"string_value": str(sleep_ms)}}}
        doc["triton"]["gate"]["load"]["protocol"] = "grpc"
        # no_worse 8: on this 2-core machine, busy with other tests, the canary's p99 and Triton's time
        # per request moved up to 3x between windows of one config (the default 1.2x is a GPU node's);
        # a model 200 ms slower per batch is 20x or more over before's
        doc["triton"]["gate"]["live"] = {"window_s": 3, "canary": 2, "no_worse": 8}
        n["i"] += 1
        path = root / f"p{n['i']}.yaml"
        path.write_text(dump(doc))
        return str(path)

    first = profile()
    p = cli("apply", "--only", "triton", "-p", first, "--state-dir", state, "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    notes = json.loads(p.stdout)["notes"]
    (pid,) = server_pids(ports[0])
    load, stop = start_load(root, ports[0], "load")
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


def get(port: int, path: str) -> bytes:
    """A GET to Triton on 127.0.0.1, by hand (http.client, not hkgpu_tune)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path)
        return c.getresponse().read()
    finally:
        c.close()


def served(port: int) -> dict:
    """The config Triton serves, read over HTTP by hand."""
    return json.loads(get(port, "/v2/models/doubler/config"))


def flat(text: str) -> str:
    return " ".join(text.split())


def test_idle_node_is_gated_by_its_own_load_over_grpc(busy):
    (note,) = busy["first_notes"]
    assert note.startswith("triton gate passed:") and "judged by the gate's own load" in note, note
    assert "64 requests at concurrency 8 (grpc)" in note, note


def start_load(root, port: int, name: str):
    """An independent client (bench/reload_client.py, 8 in flight) until its stop file appears; its
    records go to root/name."""
    stop = root / f"stop-{name}"
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", "reload_client.py"), "--port", str(port),
                          "--model", "doubler", "--input", "INPUT0", "--output", "OUTPUT0", "--dtype", "FP32",
                          "--shape", "4", "--procs", "2", "--threads", "4", "--duration", "600",
                          "--stop-file", str(stop), "--out", str(root / name)])
    return p, stop


def told(p) -> str:
    """What a failed `apply --json` said, the gate's words first (the whole JSON buries them)."""
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        return p.stderr + p.stdout
    return "\n".join([p.stderr, *doc.get("notes", []), json.dumps(doc.get("failures"))])


def gate_figures(text: str) -> tuple[float, float]:
    """The canary's p99 and Triton's own p99 from the gate's line (live mode)."""
    canary = re.search(r"a canary of \d+ in flight \(\w+\): p50 [\d.]+ ms, p99 ([\d.]+) ms", text)
    triton = re.search(r"ms queued\), p99 ([\d.]+) ms", text)
    assert canary and triton, text
    return float(canary.group(1)), float(triton.group(1))


def test_a_node_over_its_slo_outside_triton_keeps_a_good_reload(busy):
    """A node whose clients already see more than the SLO while Triton's own p99 is within it (on a GPU
    node: the front end and clients on a busy host). Here the gap is made the way it arises: the apply
    (and so its canary) runs at nice 19 on one CPU beside two busy loops at nice 10 on the same CPU (busy
    loops on every CPU left too small a gap in some runs: canary 15-24 ms, Triton 7.6-8.5 ms), so the
    canary's client side is late while Triton, at nice 0 and free to use the other CPUs, is not. A probe reload measures both p99s; a good reload with the SLO
    set between them passes, judged by Triton's own figures, and the config is served. Triton's request
    summary, what the gate read, is checked on /metrics by hand. No live request fails."""
    # its own client beside the module's, so the test does not depend on whether that one still runs
    load, stop = start_load(busy["root"], busy["port"], "load-over")
    cpu = sorted(os.sched_getaffinity(0))[0]   # the canary and two busy loops share one CPU
    burners = [subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nos.nice(10)\n"
                                 "while True: pass"]) for _ in range(2)]

    def nice_apply(*args):
        p = subprocess.run(["taskset", "-c", str(cpu), "nice", "-n", "19", sys.executable, "-m", "hkgpu_tune", "apply", "--only", "triton",
                            *args, "--state-dir", busy["state"]], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
        return p.returncode, flat(p.stdout + p.stderr)
    try:
        time.sleep(3)
        rc, out = nice_apply("-p", busy["profile"](count=4))
        assert rc == 0 and "judged by live traffic" in out, out
        canary_p99, triton_p99 = gate_figures(out)
        text = get(busy["metrics"], "/metrics").decode()
        assert re.search(r'nv_inference_request_summary_us\{[^}]*model="doubler"[^}]*quantile="0.99"[^}]*\} ', text), \
            "Triton exports no request summary"
        if canary_p99 < 4 * triton_p99:
            pytest.xfail(f"the canary at nice 19 was not late here: its p99 {canary_p99} ms against "
                         f"Triton's own {triton_p99} ms leaves no room for an SLO between them")
        slo = round(math.sqrt(canary_p99 * triton_p99), 2)   # 2x Triton's p99 or more, half the canary's or less
        rc, out = nice_apply("-p", busy["profile"](count=1, p99_ms=slo))
        assert rc == 0 and "triton gate passed" in out, out
        assert served(busy["port"])["instance_group"][0]["count"] == 1
        c2, t2 = gate_figures(out)
        print(f"probe: canary p99 {canary_p99} ms, Triton p99 {triton_p99} ms; SLO {slo} ms; canary {c2}, Triton {t2}")
        if c2 > slo:   # the canary over the SLO: Triton's own figures cleared the config, and it says so
            assert "judged by Triton's own figures" in out and t2 <= slo, out
        else:
            assert "judged by Triton's own figures" not in out, out
    finally:
        for b in burners:
            b.kill()
            b.wait()
        stop.write_text("")
        load.wait(60)
    recs = reload_client.load(str(busy["root"] / "load-over"))
    assert recs and not [r for r in recs if r[2] != 200], "a live request failed"


def test_reloads_on_a_busy_node(busy):
    t0 = time.time()
    good = cli("apply", "--only", "triton", "-p", busy["profile"](count=3), "--state-dir", busy["state"])
    t1 = time.time()
    out = flat(good.stdout + good.stderr)
    assert good.returncode == 0, out
    assert "triton gate passed" in out and "judged by live traffic" in out, out
    assert served(busy["port"])["instance_group"][0]["count"] == 3

    t2 = time.time()
    slow = cli("apply", "--only", "triton", "-p", busy["profile"](count=3, sleep_ms=400), "--state-dir",
               busy["state"])
    t3 = time.time()
    out = flat(slow.stdout + slow.stderr)
    errs = [ln for ln in (slow.stdout + slow.stderr).splitlines() if ln.startswith("error:")]
    assert slow.returncode == 1 and len(errs) == 1 and "Traceback" not in out, out
    assert "gate failed" in out and "judged by live traffic" in out, out
    assert "the previous config is serving again" in out, out
    assert "sleep_ms" not in served(busy["port"]).get("parameters", {})

    busy["stop"].write_text("")
    busy["load"].wait(60)
    recs = reload_client.load(str(busy["root"] / "load"))
    for a, b in ((t0, t1 + 1), (t2, t3 + 1)):
        w = reload_client.window(recs, a, b)
        assert w["requests"] > 8 and w["failed_requests"] == 0, w
    assert server_pids(busy["port"]) == [busy["pid"]]


def test_a_node_over_its_slo_before_the_reload_keeps_a_good_one_and_fails_a_slow_one(busy):
    """The live load already over the SLO with the config serving (an SLO of 0.01 ms, which no request
    meets): apply measures the old config under the live traffic before the reload, so a good reload
    (a shorter queue delay) passes, judged against before and saying the node is over its SLO, while a
    config whose every batch takes 200 ms more (the model's sleep_ms) is worse than before and fails,
    the previous config serving again. No live request fails. (A 400 ms queue delay is no slow config
    here: with live requests in flight Triton's batcher hardly waits, 4 ms per request.)"""
    load, stop = start_load(busy["root"], busy["port"], "load-before")
    try:
        time.sleep(3)
        cur = served(busy["port"])
        count = cur["instance_group"][0]["count"]
        delay = cur["dynamic_batching"]["max_queue_delay_microseconds"]
        shorter = delay // 2 if delay > 200 else 2000   # no longer a wait than the config serving
        t0 = time.time()
        good = cli("apply", "--only", "triton", "-p", busy["profile"](count=count, delay_us=shorter, p99_ms=0.01),
                   "--state-dir", busy["state"], "--json")
        t1 = time.time()
        assert good.returncode == 0, told(good)
        (note,) = json.loads(good.stdout)["notes"]
        note = flat(note)
        assert note.startswith("triton gate passed:") and "as before the reload" in note, note
        assert "the node is over its SLO under this traffic; the new config is no worse" in note, note
        assert served(busy["port"])["dynamic_batching"]["max_queue_delay_microseconds"] == shorter

        slow = cli("apply", "--only", "triton", "-p", busy["profile"](count=count, delay_us=shorter, p99_ms=0.01,
                                                                     sleep_ms=200),
                   "--state-dir", busy["state"])
        t2 = time.time()
        out = flat(slow.stdout + slow.stderr)
        errs = [ln for ln in (slow.stdout + slow.stderr).splitlines() if ln.startswith("error:")]
        assert slow.returncode == 1 and len(errs) == 1 and "Traceback" not in out, out
        assert "gate failed" in out and "as before the reload" not in out, out
        assert "the previous config is serving again" in out, out
        assert served(busy["port"])["dynamic_batching"]["max_queue_delay_microseconds"] == shorter
        assert "sleep_ms" not in served(busy["port"]).get("parameters", {})
    finally:
        stop.write_text("")
        load.wait(60)
    recs = reload_client.load(str(busy["root"] / "load-before"))
    w = reload_client.window(recs, t0, t2 + 1)
    assert w["requests"] > 8 and w["failed_requests"] == 0, w
    print(f"good reload {t1 - t0:.1f} s, slow one {t2 - t1:.1f} s; live requests over both: {w}\n{note}\n{out}")
