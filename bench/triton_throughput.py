#!/usr/bin/env python3
"""Time from launch to ready, and throughput of the CI model at concurrency 1 and 16, with a real
tritonserver from the nvidia-pytriton wheel (CPU, Python backend, dynamic batching).

    python3 bench/triton_throughput.py [--runs 3] [--requests 2000] [--json]

Each run: render the repository, start the server through the library, poll /v2/health/ready,
warm up, load at concurrency 1 and 16 (HTTP, binary tensors, one keep-alive connection per thread),
read Triton's own nv_inference_count / nv_inference_exec_count, stop. Prints medians.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import yaml  # noqa: E402

from hkgpu_tune.core.profile import load_profile  # noqa: E402
from hkgpu_tune.serve.repository import render  # noqa: E402
from hkgpu_tune.serve.running import client, forms, launch  # noqa: E402
from hkgpu_tune.serve.measuring import gate  # noqa: E402

MODEL_PY = os.path.join(os.path.dirname(__file__), "..", "tests", "triton", "data", "doubler.py")


def free_ports(n):
    from hkgpu_tune.serve.running import client
    return client.free_ports(n)


def profile(root, delay_us):
    http, grpc, metrics = free_ports(3)
    return {"triton": {
        "server": "pytriton", "model_repository": f"{root}/models", "run_dir": f"{root}/run", "gpu": None,
        "user": "root",   # named: the bench machines have no unprivileged server user
        "http": {"port": http}, "grpc": {"port": grpc}, "metrics": {"port": metrics},
        "models": [{"name": "doubler", "backend": "python", "model_file": os.path.abspath(MODEL_PY),
                    "max_batch_size": 16,
                    "inputs": [{"name": "INPUT0", "data_type": "FP32", "dims": [4]}],
                    "outputs": [{"name": "OUTPUT0", "data_type": "FP32", "dims": [4]}],
                    "dynamic_batching": {"max_queue_delay_microseconds": delay_us},
                    "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}],
        "gate": {"ready_timeout_s": 120, "warmup_requests": 20}}}


def one_run(requests, delay_us):
    with tempfile.TemporaryDirectory(prefix="hkgpu-bench-") as root:
        path = os.path.join(root, "p.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(profile(root, delay_us), f)
        t = load_profile(path).section("triton")
        render.write_repository(t)
        forms.prepare_backends(t)
        t0 = time.monotonic()
        launch.start(t)
        try:
            launch.wait_ready(t)
            ready = time.monotonic() - t0
            m = t.models[0]
            gate.warm_up(t, m, t.gate.warmup_requests)
            out = {"ready_s": ready}
            for conc in (1, 16):
                before = client.model_counts(t.metrics.host, t.metrics.port, m.name)
                r = gate.load(t, m, requests, conc)
                after = client.model_counts(t.metrics.host, t.metrics.port, m.name)
                n = after["nv_inference_count"] - before["nv_inference_count"]
                ex = after["nv_inference_exec_count"] - before["nv_inference_exec_count"]
                out[f"c{conc}"] = {"throughput": r.throughput, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms,
                                   "errors": r.errors, "avg_batch": round(n / ex, 2) if ex else None}
            return out
        finally:
            stop = launch.stop(t)
            assert not stop["left"], stop


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--delay-us", type=int, default=1000, help="dynamic batching max_queue_delay_microseconds")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    runs = [one_run(a.requests, a.delay_us) for _ in range(a.runs)]
    med = {"ready_s": round(statistics.median(r["ready_s"] for r in runs), 3)}
    for c in ("c1", "c16"):
        med[c] = {k: statistics.median(r[c][k] for r in runs) for k in ("throughput", "p50_ms", "p99_ms")}
        med[c]["avg_batch"] = statistics.median(r[c]["avg_batch"] or 0 for r in runs)
        med[c]["errors"] = sum(r[c]["errors"] for r in runs)
    if a.json:
        print(json.dumps({"runs": runs, "median": med}, indent=2))
        return
    print(f"tritonserver (nvidia-pytriton wheel, CPU, {os.cpu_count()} cores), Python-backend doubler, "
          f"dynamic batching {a.delay_us} us, {a.runs} runs x {a.requests} requests, medians:")
    print(f"  launch -> ready (/v2/health/ready 200): {med['ready_s']:.2f} s")
    for c, label in (("c1", "concurrency 1 "), ("c16", "concurrency 16")):
        x = med[c]
        print(f"  {label}: {x['throughput']:.0f} req/s, p50 {x['p50_ms']:.2f} ms, p99 {x['p99_ms']:.2f} ms, "
              f"avg batch {x['avg_batch']:.1f} (Triton's count/exec_count), errors {x['errors']}")


if __name__ == "__main__":
    main()
