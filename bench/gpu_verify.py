"""Time in-process GPU verify of all GPUs with one NVML init (target <= 20 ms on the H200).

    python3 bench/gpu_verify.py [--runs 100] [--profile tests/fixtures/gpu/profile-h200.yaml]

Prints JSON: the binding's import, nvmlInit, the first verify (handles and first NVML calls),
steady-state verify over --runs, full facts, one nvidia-smi call and a whole `hkgpu-tune verify
--only gpu` process for comparison. `--breakdown` (a separate, fresh process) times the first call of
each NVML field that verify reads.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
HERE = os.path.dirname(os.path.abspath(__file__))
PROFILE = os.path.join(HERE, "..", "tests", "fixtures", "gpu", "profile-h200.yaml")


def ms(t):
    return round(t * 1000, 2)


def breakdown():
    from hkgpu_tune.backends.nvml import Nvml
    nv = Nvml()
    t0 = time.perf_counter()
    n = nv.count()
    out = {"init_ms": ms(time.perf_counter() - t0)}
    t0 = time.perf_counter()
    for i in range(n):
        nv._h(i)
    out["handles_ms"] = ms(time.perf_counter() - t0)
    for k in ("pci_bus_id", "persistence", "compute_mode", "pcie", "pstate"):
        t0 = time.perf_counter()
        for i in range(n):
            nv.gpu(i, (k,))
        out[f"first_{k}_ms"] = ms(time.perf_counter() - t0)
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--profile", default=PROFILE)
    ap.add_argument("--breakdown", action="store_true")
    a = ap.parse_args()
    if a.breakdown:
        return breakdown()
    t0 = time.perf_counter()
    import pynvml  # noqa: F401 - the binding's import, timed apart from nvmlInit
    imp = time.perf_counter() - t0
    from hkgpu_tune.backends import Backends
    from hkgpu_tune.backends.nvml import Nvml
    from hkgpu_tune.core.profile import load_profile
    from hkgpu_tune.subsystems import gpu

    plug = gpu.Plugin(load_profile(a.profile), Backends(nvml=Nvml()))
    t0 = time.perf_counter()
    plug.b.nvml.count()                          # the one nvmlInit of this process
    init = time.perf_counter() - t0
    t0 = time.perf_counter()
    first = plug.verify()                        # first verify: handles and first NVML calls
    first_t = time.perf_counter() - t0
    runs = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        res = plug.verify()
        runs.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    facts = plug.facts()
    facts_t = time.perf_counter() - t0
    plug.b.close()
    t0 = time.perf_counter()
    subprocess.run(["nvidia-smi", "--query-gpu=persistence_mode,compute_mode", "--format=csv,noheader"],
                   capture_output=True, check=False)
    smi_t = time.perf_counter() - t0
    t0 = time.perf_counter()
    cli = subprocess.run([sys.executable, "-m", "hkgpu_tune", "verify", "--only", "gpu", "-p", a.profile, "--json"],
                         capture_output=True, check=False, cwd=os.path.join(HERE, ".."))
    cli_t = time.perf_counter() - t0
    bd = subprocess.run([sys.executable, os.path.abspath(__file__), "--breakdown"], capture_output=True, text=True)
    runs.sort()
    print(json.dumps({
        "gpus": len(facts.get("gpus", [])), "results_per_verify": len(res),
        "statuses": sorted({r.status for r in first}),
        "import_pynvml_ms": ms(imp), "nvml_init_ms": ms(init), "first_verify_ms": ms(first_t),
        "init_plus_first_verify_ms": ms(init + first_t),
        "verify_ms": {"min": ms(runs[0]), "median": ms(statistics.median(runs)),
                      "p95": ms(runs[max(0, int(len(runs) * 0.95) - 1)]), "max": ms(runs[-1]), "runs": a.runs},
        "full_facts_ms": ms(facts_t), "nvidia_smi_one_call_ms": ms(smi_t),
        "cli_verify_gpu_process_ms": ms(cli_t), "cli_rc": cli.returncode,
        "breakdown_fresh_process": json.loads(bd.stdout) if bd.returncode == 0 else bd.stderr[-300:],
    }, indent=2))


if __name__ == "__main__":
    main()
