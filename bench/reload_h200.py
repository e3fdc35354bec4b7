#!/usr/bin/env python3
"""Hot reload under load on a GPU, as operators run it: `hkgpu-tune apply` (the CLI, with its gate)
starts a ResNet-50 torch-engine service (hkbatch, CUDA graphs); an independent client
(bench/reload_client.py) keeps --in-flight requests going; then, under that load, `apply` of
(a) the instance count, (b) the queue delay, (c) new trained weights (a state_dict, sha256-pinned),
and two reloads that must fail: weights of another architecture (the load fails) and a slower config
(one instance of batch 2: the gate, judging it against the old config under the same load, fails it;
its window slows the live load by design, so it is kept out of the 2x-steady target and reported as
reload_slow_*).
Writes OUT/reload.json (the docs/perf record) and OUT/steps.log.

    python3 bench/reload_h200.py --out /tmp/out [--in-flight 64] [--fp16]
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import subprocess
import sys
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import reload_client  # noqa: E402

WORK = "/tmp/hkgpu-reload"
PORT = 8000


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def make_weights() -> dict:
    """Two trained-weight files made here (no download): resnet50 and, for the bad reload, resnet18."""
    import torch
    import torchvision
    out = {}
    for name, arch in (("r50", "resnet50"), ("r18", "resnet18")):
        torch.manual_seed(7)
        path = f"{WORK}/weights-{name}.pt"
        torch.save(getattr(torchvision.models, arch)(weights=None).state_dict(), path)
        out[name] = {"file": path, "sha256": sha256(path), "format": "state_dict"}
    return out


HTTP_THREADS = None   # --http-threads: triton.connections.http_thread_count (None: Triton's default, 8)
SERVED = {"max_batch": 64, "preferred": [32, 64], "gate_p99_ms": 2000.0}   # --max-batch, --preferred, --gate-p99-ms


def profile(i: int, count=4, delay_us=2000, weights=None, p99_ms=None, fp16=False, max_batch=None,
            preferred=None) -> str:
    p99_ms = SERVED["gate_p99_ms"] if p99_ms is None else p99_ms
    build = {"torchvision": "resnet50", "engine": "torch", "backend": "hkbatch", "fp16": fp16,
             "cuda_graphs": True, "channels_last": True}
    if weights:
        build["weights"] = weights
    doc = {"name": "reload-h200", "triton": {
        "server": "pytriton", "model_repository": f"{WORK}/models", "run_dir": f"{WORK}/run", "gpu": 0,
        "user": "root",   # named: the GPU machine has no unprivileged server user
        "http": {"port": PORT}, "grpc": {"port": PORT + 1}, "metrics": {"port": PORT + 2},
        "models": [{
            "name": "resnet50", "platform": "tensorrt_plan", "max_batch_size": max_batch or SERVED["max_batch"],
            "inputs": [{"name": "INPUT", "data_type": "UINT8", "dims": [3, 224, 224]}],
            "outputs": [{"name": "OUTPUT", "data_type": "FP16" if fp16 else "FP32", "dims": [1000]}],
            "dynamic_batching": {"max_queue_delay_microseconds": delay_us, "preferred_batch_size": preferred or SERVED["preferred"]},
            "instance_group": [{"count": count, "kind": "KIND_GPU"}],
            "build": build}],
        "gate": {"ready_timeout_s": 300, "warmup_requests": 8, "load": {"requests": 400, "concurrency": 8},
                 "p99_ms": p99_ms}}}
    if HTTP_THREADS:
        doc["triton"]["connections"] = {"http_thread_count": HTTP_THREADS}
    path = f"{WORK}/profile-{i}.yaml"
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


def cli(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))


def server_pids() -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"tritonserver") and f"--http-port={PORT}".encode() in argv:
                out.append(int(d))
    return out


def served_config() -> dict:
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
    try:
        c.request("GET", "/v2/models/resnet50/config")
        return json.loads(c.getresponse().read())
    finally:
        c.close()


def start_load(out: str, procs: int, threads: int, stop: str, dtype="UINT8") -> subprocess.Popen:
    if os.path.exists(stop):
        os.unlink(stop)
    return subprocess.Popen([sys.executable, os.path.join(HERE, "reload_client.py"), "--port", str(PORT),
                             "--model", "resnet50", "--input", "INPUT", "--output", "OUTPUT", "--dtype", dtype,
                             "--shape", "3,224,224", "--procs", str(procs), "--threads", str(threads),
                             "--duration", "540", "--stop-file", stop, "--out", out], stdout=subprocess.DEVNULL)


def stop_load(p: subprocess.Popen, stop: str, out: str) -> list:
    with open(stop, "w"):
        pass
    p.wait(120)
    return reload_client.load(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--in-flight", type=int, default=96)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--preferred", default="32,64")
    ap.add_argument("--gate-p99-ms", type=float, default=2000.0,
                    help="the gate's p99 SLO in every good profile (on a busy node it judges by live traffic)")
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--steady-s", type=float, default=20)
    ap.add_argument("--max-s", type=float, default=12)
    ap.add_argument("--fp16", action="store_true", help="fp16 engine and FP16 outputs (needs a gate that asks "
                                                       "for binary outputs)")
    ap.add_argument("--http-threads", type=int, help="Triton's HTTP threads (default: Triton's, 8)")
    ap.add_argument("--steps", default="", help="only the steps whose names start with these (comma-separated)")
    a = ap.parse_args()
    global HTTP_THREADS
    HTTP_THREADS = a.http_threads
    SERVED.update(max_batch=a.max_batch, preferred=[int(x) for x in a.preferred.split(",")], gate_p99_ms=a.gate_p99_ms)
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(WORK, exist_ok=True)
    rec = {"date": time.strftime("%Y-%m-%d"), "load_in_flight": a.in_flight, "steps": {},
           "http_thread_count": a.http_threads, "fp16": a.fp16, "max_batch": a.max_batch,
           "preferred": SERVED["preferred"], "gate_p99_ms": a.gate_p99_ms, "client": "bench/reload_client.py",
           "command": "python3 bench/reload_h200.py " + " ".join(sys.argv[1:])}
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        rec["gpu"] = pynvml.nvmlDeviceGetName(h)
        rec["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception as e:  # noqa: BLE001 - the record says what it could not read
        rec["gpu"] = f"unknown ({e})"
    rec["commit"] = os.environ.get("HK_COMMIT", "")
    w = make_weights()
    log(f"weights: {w}")
    fp16 = a.fp16
    n = iter(range(1, 100))

    p0 = profile(next(n), fp16=fp16)
    t = time.time()
    r = cli("apply", "--only", "triton", "-p", p0, "--state-dir", f"{WORK}/state", timeout=400)
    log(f"first apply rc={r.returncode} in {time.time() - t:.1f} s\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    rec["first_apply"] = {"rc": r.returncode, "seconds": round(time.time() - t, 1)}
    if r.returncode != 0:
        json.dump(rec, open(f"{a.out}/reload.json", "w"), indent=1)
        return 1
    pids = server_pids()
    log(f"server pids {pids}")

    # the served maximum at twice the load's in-flight count, then the load itself
    stop = f"{WORK}/stop"
    lp = start_load(f"{WORK}/max", a.procs, 2 * a.in_flight // a.procs, stop)
    time.sleep(a.max_s)
    mx = stop_load(lp, stop, f"{WORK}/max")
    mx_w = reload_client.window(mx, mx[0][0] + 2, mx[-1][0]) if mx else {}
    rec["served_max"] = {"in_flight": 2 * a.in_flight, **mx_w}
    log(f"served max: {mx_w}")

    lp = start_load(f"{WORK}/load", a.procs, a.in_flight // a.procs, stop)
    t_load = time.time()
    time.sleep(a.steady_s)
    t_steady = (t_load + 2, time.time())
    windows = {}
    last_good = [p0]

    def step(name, path, expect_rc):
        if a.steps and not name.startswith(tuple(a.steps.split(","))):
            return
        cfg_before = served_config()
        t0 = time.time()
        r = cli("apply", "--only", "triton", "-p", path, "--state-dir", f"{WORK}/state", timeout=400)
        t1 = time.time()
        errs = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("error:")]
        log(f"{name}: rc={r.returncode} in {t1 - t0:.1f} s errors={errs}\n{r.stdout[-800:]}")
        time.sleep(2)
        out = r.stdout + r.stderr
        flat = " ".join(out.split())   # the CLI wraps its notes
        gate_mode = "live" if "judged by live traffic" in flat else "load" if "judged by the gate's own load" in flat else None
        judged_by = ("before" if "as before the reload" in flat else
                     "triton" if ("judged by Triton's own figures" in flat or "gate failed" in flat and
                                  re.search(r"Triton's own (p99|time) per request [\d.]+ ms is over", flat)) else
                     "canary" if gate_mode == "live" else None)
        st = {"rc": r.returncode, "expected_rc": expect_rc, "seconds": round(t1 - t0, 1), "error_lines": errs,
              "gate_mode": gate_mode, "gate_judged_by": judged_by, "gate_lines": [ln.strip()[:600] for ln in out.splitlines() if "gate" in ln][:3],
              "traceback": "Traceback" in r.stdout + r.stderr, "pids_after": server_pids()}
        if expect_rc:
            after = served_config()
            st["put_back_ok"] = (r.returncode == 1 and len(errs) == 1 and not st["traceback"]
                                 and errs[0].endswith("the previous config is serving again (rolled back)")
                                 and after.get("instance_group") == cfg_before.get("instance_group")
                                 and after.get("parameters") == cfg_before.get("parameters")
                                 and after.get("dynamic_batching") == cfg_before.get("dynamic_batching"))
        rec["steps"][name] = st
        if expect_rc == 0 and r.returncode == 0:
            last_good[0] = path
        windows[name] = (t0, t1 + 2)
        with open(f"{a.out}/reload-partial.json", "w") as f:   # what a run cut short still shows
            json.dump(rec, f, indent=1)

    step("a_instances_4_to_8", profile(next(n), count=8, fp16=fp16), 0)
    step("b_queue_delay_2000_to_1000", profile(next(n), count=8, delay_us=1000, fp16=fp16), 0)
    good = profile(next(n), count=8, delay_us=1000, weights=w["r50"], fp16=fp16)
    step("c_new_weights", good, 0)
    step("bad_wrong_architecture", profile(next(n), count=8, delay_us=1000, weights=w["r18"], fp16=fp16), 1)
    step("bad_slower_config", profile(next(n), count=1, delay_us=1000, weights=w["r50"], fp16=fp16, max_batch=2,
                                      preferred=[2]), 1)
    time.sleep(3)
    recs = stop_load(lp, stop, f"{WORK}/load")
    v = cli("verify", "--only", "triton", "-p", last_good[0], "--json", timeout=120)
    rec["verify_after"] = {"rc": v.returncode, "not_ok": [x for x in _results(v.stdout) if x.get("status") != "ok"]}

    steady = reload_client.window(recs, *t_steady)
    rec["steady"] = {k: v for k, v in steady.items() if k != "errors"}
    rec["steady_p99_ms"] = steady["p99_ms"]
    rec["load_fraction_of_max"] = round(steady["req_per_s"] / mx_w["req_per_s"], 2) if mx_w.get("req_per_s") else None
    good_w = [reload_client.window(recs, *windows[k]) for k in windows if not k.startswith("bad")]
    bad_w = [reload_client.window(recs, *windows[k]) for k in windows if k.startswith("bad") and k != "bad_slower_config"]
    slow_w = [reload_client.window(recs, *windows[k]) for k in windows if k == "bad_slower_config"]
    for k in windows:
        rec["steps"][k]["window"] = reload_client.window(recs, *windows[k])
    rec["reload_good_failed_requests"] = sum(x["failed_requests"] for x in good_w)
    rec["reload_good_p99_ms"] = max(((x["p99_ms"] or 0) for x in good_w), default=None)
    rec["reload_good_max_ms"] = max(((x["max_ms"] or 0) for x in good_w), default=None)
    rec["reload_bad_max_ms"] = max(((x["max_ms"] or 0) for x in bad_w), default=None)
    rec["reload_bad_p99_ms"] = max(((x["p99_ms"] or 0) for x in bad_w), default=None)
    rec["reload_slow_p99_ms"] = max(((x["p99_ms"] or 0) for x in slow_w), default=None)
    rec["reload_slow_max_ms"] = max(((x["max_ms"] or 0) for x in slow_w), default=None)
    rec["gate_modes"] = {k: rec["steps"][k].get("gate_mode") for k in windows}
    rec["gate_judged_by"] = {k: rec["steps"][k].get("gate_judged_by") for k in windows}
    rec["reload_bad_failed_requests"] = sum(x["failed_requests"] for x in bad_w + slow_w)
    rec["reload_bad_put_back_ok"] = all(rec["steps"][k].get("put_back_ok") for k in windows if k.startswith("bad"))
    rec["good_reloads_ok"] = all(rec["steps"][k]["rc"] == 0 for k in windows if not k.startswith("bad"))
    rec["same_pid"] = all(rec["steps"][k]["pids_after"] == pids for k in windows) and server_pids() == pids
    rec["verify_clean_after"] = v.returncode == 0
    rec["targets"] = {"zero_failed": rec["reload_good_failed_requests"] == 0 and rec["reload_bad_failed_requests"] == 0,
                      "reload_p99_within_2x_steady": bool(steady["p99_ms"]) and
                      max(rec["reload_good_p99_ms"] or 0, rec["reload_bad_p99_ms"] or 0) <= 2 * steady["p99_ms"],
                      "no_request_over_1s": max(rec["reload_good_max_ms"] or 0, rec["reload_bad_max_ms"] or 0,
                                                rec["reload_slow_max_ms"] or 0) <= 1000,
                      "load_at_least_96_in_flight": a.in_flight >= 96,
                      "good_reloads_pass_their_gate": rec["good_reloads_ok"],
                      "bad_reloads_put_back": rec["reload_bad_put_back_ok"],
                      "same_pid": rec["same_pid"], "verify_clean_after": rec["verify_clean_after"],
                      "load_at_least_half_of_max": (rec["load_fraction_of_max"] or 0) >= 0.5}
    rec["windows"] = {k: [round(a - t_load, 1), round(b - t_load, 1)] for k, (a, b) in windows.items()}
    rec["series"] = reload_client.series(recs, t_load)
    with open(f"{a.out}/reload.json", "w") as f:
        json.dump(rec, f, indent=1)
    log(json.dumps({k: v for k, v in rec.items() if k not in ("series", "steps")}, indent=1))
    return 0


def _results(text: str) -> list:
    try:
        doc = json.loads(text)
    except ValueError:
        return [{"status": "unparsed", "text": text[-500:]}]
    return doc.get("results", doc) if isinstance(doc, dict) else doc


if __name__ == "__main__":
    sys.exit(main())
