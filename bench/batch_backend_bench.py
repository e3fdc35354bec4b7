"""The hkbatch backend against Triton's Python backend, side by side in one server: the same
no-compute model (image-sized UINT8 requests of one image each, dynamic batching), loads taken
in turn (python, hkbatch, python, hkbatch), img/s and p99 per backend and their ratio.

    python3 bench/batch_backend_bench.py [--seconds 5] [--concurrency 32] [--processes 2]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import yaml  # noqa: E402

from hkgpu_tune.core.profile import load_profile  # noqa: E402
from hkgpu_tune.serve.repository import render  # noqa: E402
from hkgpu_tune.serve.running import launch  # noqa: E402
from hkgpu_tune.serve.measuring import loadgen, sweep  # noqa: E402


def model(name, backend, instances):
    return {"name": name, "backend": backend, "model_file": os.path.join(HERE, "models", f"pixels_{backend}.py"),
            "max_batch_size": 64, "inputs": [{"name": "INPUT", "data_type": "UINT8", "dims": [3, 224, 224]}],
            "outputs": [{"name": "OUTPUT", "data_type": "FP16", "dims": [1000]}],
            "dynamic_batching": {"max_queue_delay_microseconds": 1000},
            "instance_group": [{"count": instances, "kind": "KIND_CPU"}]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--instances", type=int, default=2)
    args = ap.parse_args()
    from tests.triton.conftest import free_ports
    root = tempfile.mkdtemp(prefix="hkbatch-bench-")
    http, grpc, metrics = free_ports(3)
    doc = {"name": "hkbatch-bench", "triton": {
        "server": "pytriton", "model_repository": f"{root}/models", "run_dir": f"{root}/run", "gpu": None,
        "user": "root",   # named: the bench machines have no unprivileged server user
        "http": {"port": http}, "grpc": {"port": grpc}, "metrics": {"port": metrics},
        "models": [model("python", "python", args.instances), model("hkbatch", "hkbatch", args.instances)],
        "gate": {"ready_timeout_s": 60, "warmup_requests": 2, "load": {"requests": 16, "concurrency": 4}}}}
    with open(f"{root}/profile.yaml", "w") as f:
        yaml.safe_dump(doc, f)
    t = load_profile(f"{root}/profile.yaml").section("triton")
    render.write_repository(t)
    launch.start(t)
    res = {"python": [], "hkbatch": []}
    try:
        launch.wait_ready(t)
        for rnd in range(2):
            for name in res:
                spec = sweep.spec_for(t, t.model(name), args.concurrency, args.seconds, args.processes, False)
                r = loadgen.run(spec)
                res[name].append(r)
                print(f"round {rnd + 1} {name:8s} {loadgen.line(r)}", flush=True)
    finally:
        launch.stop(t)
    best = {k: max(v, key=lambda r: r["img_s"]) for k, v in res.items()}
    print(f"hkbatch / python: {best['hkbatch']['img_s'] / best['python']['img_s']:.2f}x img/s, "
          f"p99 {best['hkbatch']['p99_ms']:.1f} ms against {best['python']['p99_ms']:.1f} ms "
          f"({os.cpu_count()} CPUs shared by the server and {args.processes} load processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
