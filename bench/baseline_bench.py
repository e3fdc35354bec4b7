#!/usr/bin/env python3
"""Time `hkgpu-tune baseline capture --quick` (and with --full a full capture) for a profile with
2 fabric and 3 WAN peers, all addresses of a peer namespace (198.18.0.0/15) with `baseline serve`
in it; and `baseline compare` of two snapshots, as a whole command and in-process, with and
without --png. Targets: quick <= 15 s, full <= 120 s, compare <= 1 s.

    sudo python3 bench/baseline_bench.py [--runs N] [--full] [--json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tests.baseline.netns import Bed  # noqa: E402


def timed(fn):
    t = time.perf_counter()
    r = fn()
    return time.perf_counter() - t, r


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--full", action="store_true", help="also one full capture")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = {"host_cpus": os.cpu_count(), "load_1m": os.getloadavg()[0]}
    bed = Bed("b", port=5321)
    tmp = tempfile.mkdtemp(prefix="hkbl-bench-")
    try:
        prof = bed.profile(os.path.join(tmp, "p.yaml"), extra="")
        bed.serve(600)
        quick = []
        for i in range(args.runs):
            snap = os.path.join(tmp, f"q{i}.json")
            s, p = timed(lambda: bed.hk("baseline", "capture", "-p", prof, "--quick", "--out", snap))
            if p.returncode != 0:
                print(p.stderr, file=sys.stderr)
            doc = json.load(open(snap))
            quick.append({"wall_s": round(s, 2), "rc": p.returncode, "timings_s": doc["timings_s"]})
        out["quick"] = {"runs": quick, "median_s": round(statistics.median(q["wall_s"] for q in quick), 2),
                        "max_s": max(q["wall_s"] for q in quick), "target_s": 15}
        if args.full:
            snap = os.path.join(tmp, "full.json")
            s, p = timed(lambda: bed.hk("baseline", "capture", "-p", prof, "--out", snap))
            out["full"] = {"wall_s": round(s, 2), "rc": p.returncode, "timings_s": json.load(open(snap))["timings_s"],
                           "target_s": 120}
        a, b = os.path.join(tmp, "q0.json"), os.path.join(tmp, f"q{args.runs - 1}.json")
        cmd = [sys.executable, "-m", "hkgpu_tune", "baseline", "compare", a, b, "--json"]
        walls = [timed(lambda: subprocess.run(cmd, capture_output=True, cwd=REPO))[0] for _ in range(5)]
        png = os.path.join(tmp, "c.png")
        pngs = [timed(lambda: subprocess.run(cmd + ["--png", png], capture_output=True, cwd=REPO))[0] for _ in range(3)]
        from hkgpu_tune.baseline import compare
        inproc = [timed(lambda: compare.compare(compare.load(a), compare.load(b)))[0] for _ in range(20)]
        out["compare"] = {"command_median_s": round(statistics.median(walls), 3),
                          "command_with_png_median_s": round(statistics.median(pngs), 3),
                          "in_process_median_ms": round(statistics.median(inproc) * 1000, 2),
                          "snapshot_bytes": os.path.getsize(a), "target_s": 1.0}
    finally:
        bed.close()
        subprocess.run(["rm", "-rf", tmp])
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        q = out["quick"]
        print(f"capture --quick (2 fabric + 3 WAN peers): median {q['median_s']} s, max {q['max_s']} s "
              f"over {len(q['runs'])} runs (target {q['target_s']} s); stages of the last: {q['runs'][-1]['timings_s']}")
        if "full" in out:
            print(f"capture (full): {out['full']['wall_s']} s (target 120 s); stages: {out['full']['timings_s']}")
        c = out["compare"]
        print(f"compare: command {c['command_median_s']} s, with --png {c['command_with_png_median_s']} s, "
              f"in-process {c['in_process_median_ms']} ms (target 1 s; snapshot {c['snapshot_bytes']} bytes)")
        print(f"machine: {out['host_cpus']} CPUs, load {out['load_1m']:.2f}")
    ok = q["max_s"] <= 15 and c["command_median_s"] <= 1.0 and ("full" not in out or out["full"]["wall_s"] <= 120)
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
