"""Time in-process GPU verify of all GPUs with one NVML init (target <= 20 ms on the H200).

    python3 bench/gpu_verify.py [--runs 50] [--profile tests/fixtures/gpu/profile-h200.yaml]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from hkgpu_tune.backends import Backends  # noqa: E402
from hkgpu_tune.backends.nvml import Nvml  # noqa: E402
from hkgpu_tune.profile import load_profile  # noqa: E402
from hkgpu_tune.subsystems import gpu  # noqa: E402


def ms(t):
    return round(t * 1000, 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--profile", default=os.path.join(os.path.dirname(__file__), "..", "tests/fixtures/gpu/profile-h200.yaml"))
    a = ap.parse_args()
    prof = load_profile(a.profile)
    nv = Nvml()
    t0 = time.perf_counter()
    nv.count()                                   # the one nvmlInit of this process
    init = time.perf_counter() - t0
    plug = gpu.Plugin(prof, Backends(nvml=nv))
    t0 = time.perf_counter()
    first = plug.verify()                        # first verify: handles looked up
    first_t = time.perf_counter() - t0
    runs = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        res = plug.verify()
        runs.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    facts = plug.facts()
    facts_t = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run(["nvidia-smi", "--query-gpu=persistence_mode,compute_mode", "--format=csv,noheader"],
                   capture_output=True, check=False)
    smi_t = time.perf_counter() - t0
    runs.sort()
    out = {"gpus": len(facts.get("gpus", [])), "results_per_verify": len(res),
           "statuses": sorted({r.status for r in first}),
           "nvml_init_ms": ms(init), "first_verify_ms": ms(first_t),
           "verify_ms": {"min": ms(runs[0]), "median": ms(statistics.median(runs)),
                         "p95": ms(runs[int(len(runs) * 0.95) - 1]), "max": ms(runs[-1]), "runs": a.runs},
           "init_plus_first_verify_ms": ms(init + first_t),
           "full_facts_ms": ms(facts_t), "nvidia_smi_one_call_ms": ms(smi_t)}
    print(json.dumps(out, indent=2))
    nv.close()


if __name__ == "__main__":
    main()
