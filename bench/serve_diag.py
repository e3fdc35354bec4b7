"""Where the tuned service's time goes, on the GPU machine, in one run (at most about 8 minutes):

  engines  the torch engine in-process, one variant at a time (batch norm folded, UINT8 input,
           torch.compile cold and then from its cache): ready time and img/s per batch
  serving  one MPS sweep server, each variant loaded through the repository API and loaded by the
           load generator at a few levels; execute()'s own phases read from HKGPU_ENGINE_STATS

    python3 bench/serve_diag.py --out /tmp/diag          # on the GPU machine
Writes diag.json into --out; every line is also printed.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f} s] {msg}", flush=True)


def engine_main(opts: dict, batches: list[int], seconds: float) -> None:
    from hkgpu_tune.serve.repository.torch_model import TorchEngine
    import torch
    t0 = time.monotonic()
    eng = TorchEngine("resnet50", batches, device="cuda:0", log=print, **opts)
    out = {"ready_s": round(time.monotonic() - t0, 1), "compile_s": eng.compile_s, "batches": {}}
    for b in batches:
        for _ in range(5):
            eng.run_device(b)
        torch.cuda.synchronize()
        n, t1 = 0, time.perf_counter()
        while time.perf_counter() - t1 < seconds:
            for _ in range(10):
                eng.run_device(b)
            torch.cuda.synchronize()
            n += 10
        dev = n * b / (time.perf_counter() - t1)
        m, t2 = 0, time.perf_counter()
        while time.perf_counter() - t2 < seconds / 2:
            eng.run_pinned(b)
            m += 1
        out["batches"][b] = {"img_s": round(dev, 1), "ms": round(b / dev * 1000, 3),
                             "pinned_img_s": round(m * b / (time.perf_counter() - t2), 1)}
    print("ENGINE " + json.dumps(out), flush=True)


def run_engine(name: str, opts: dict, batches, seconds: float, timeout: int) -> dict:
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, __file__, "--engine", json.dumps(opts), "--batches",
                            ",".join(map(str, batches)), "--seconds", str(seconds)],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"name": name, "error": f"over {timeout} s"}
    for ln in p.stdout.splitlines():
        if ln.startswith("ENGINE "):
            r = json.loads(ln[7:])
            r.update(name=name, wall_s=round(time.monotonic() - t0, 1))
            return r
    return {"name": name, "error": (p.stderr or p.stdout)[-1200:]}


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):   # caught mid-rewrite
        return None


def variant_cfg(base: dict, mb: int, delay: int, inst: int, params: dict, dtype: str, preferred=()) -> dict:
    cfg = copy.deepcopy(base)
    cfg["max_batch_size"] = mb
    cfg["dynamic_batching"] = {"max_queue_delay_microseconds": delay}
    if preferred:
        cfg["dynamic_batching"]["preferred_batch_size"] = list(preferred)
    cfg["instance_group"][0]["count"] = inst
    cfg["input"][0]["data_type"] = "TYPE_" + dtype
    ps = dict(cfg.get("parameters", {}))
    for k, v in params.items():
        ps[k] = {"string_value": v}
    cfg["parameters"] = ps
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/hkgpu-diag")
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--batches", default="1,8,32,256")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--no-engines", action="store_true")
    ap.add_argument("--engines", default="eager fp16,fold_bn,fold_bn uint8,compile cold,compile warm")
    ap.add_argument("--no-serving", action="store_true")
    ap.add_argument("--compile-timeout", type=int, default=150)
    ap.add_argument("--levels", default="64,80")
    ap.add_argument("--load-seconds", type=float, default=3)
    ap.add_argument("--stop-p99-ms", type=float, default=20, help="a variant's levels stop past this p99")
    ap.add_argument("--variants", default="",
                    help="compiled UINT8 variants instead of the built-in list: MB:DELAY_US:INSTANCES[:PREF+PREF] "
                         "separated by ';', e.g. '64:1000:2;128:2000:3:64+128'")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.engine:
        engine_main(json.loads(args.engine), batches, args.seconds)
        return 0
    os.makedirs(args.out, exist_ok=True)
    res = {"engines": [], "serving": []}
    cache = "/tmp/hkgpu-bench/inductor-cache"

    def save():
        with open(os.path.join(args.out, "diag.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)

    comp_opts = {"input_type": "UINT8", "compile": True, "compile_cache_dir": cache}

    def engines(todo):
        for name, opts, to in todo:
            r = run_engine(name, opts, [b for b in batches if b <= 32] if opts.get("compile") else batches,
                           args.seconds, to)   # compiled for the served max_batch: the server reads its cache
            res["engines"].append(r)
            log(f"engine {name}: {json.dumps(r)[:900]}")
            save()

    if not args.no_engines:
        shutil.rmtree(cache, ignore_errors=True)
        todo = [("eager fp16", {}, 120), ("fold_bn", {"fold_bn": True}, 120),
                ("fold_bn uint8", {"fold_bn": True, "input_type": "UINT8"}, 120),
                ("compile cold", comp_opts, args.compile_timeout)]
        engines([e for e in todo if e[0] in args.engines.split(",")])
    if args.no_serving:
        return 0

    from hkgpu_tune.core.errors import HkError
    from hkgpu_tune.serve.measuring import loadgen, sweep
    from serve_h200 import triton_section, hk
    prof = os.path.join(tempfile.mkdtemp(prefix="hkgpu-diag-"), "profile.yaml")
    shutil.copyfile(os.path.join(HERE, "h200-resnet50.yaml"), prof)
    t = triton_section(prof)
    model = t.model("resnet50")
    stats = tempfile.mkdtemp(prefix="hkgpu-stats-")
    os.environ["HKGPU_ENGINE_STATS"] = stats
    os.environ["HKGPU_ENGINE_STATS_EVERY"] = "0.2"
    p = hk("mps", "start", "-p", prof)
    mps = p.returncode == 0 and sweep.mps_running(t)
    log(f"MPS {'on' if mps else 'off: ' + (p.stdout + p.stderr)[-300:]}")
    u8 = {"sync": "blocking"}
    variants = [  # name, max_batch, delay, instances, params, input type, loadgen processes, preferred
        ("uint8, 8 inst, spin", 32, 200, 8, {"sync": "spin"}, "UINT8", 6, ()),
        ("uint8, 8 inst, blocking", 32, 200, 8, u8, "UINT8", 6, ()),
        ("uint8, 4 inst, blocking", 32, 200, 4, u8, "UINT8", 6, ()),
        ("uint8, 12 inst, blocking", 32, 200, 12, u8, "UINT8", 6, ()),
        ("uint8, 6 inst, blocking, mb 16", 16, 200, 6, u8, "UINT8", 6, ()),
        ("compile uint8, 8 inst, blocking", 32, 200, 8, {"compile": "true", "compile_cache_dir": cache, **u8},
         "UINT8", 6, ()),
    ]
    if args.variants:
        comp = {"compile": "true", "compile_cache_dir": cache, **u8}
        variants = []
        for v in args.variants.split(";"):
            f = v.strip().split(":")
            pref = tuple(int(x) for x in f[3].split("+")) if len(f) > 3 else ()
            mb, delay, inst = int(f[0]), int(f[1]), int(f[2])
            name = f"mb {mb}, delay {delay}, {inst} inst" + (f", pref {'+'.join(map(str, pref))}" if pref else "")
            variants.append((name, mb, delay, inst, comp, "UINT8", 8, pref))
    if not any(e.get("name") == "compile cold" and not e.get("error") for e in res["engines"]):
        variants = [v for v in variants if "compile" not in v[4]]   # a cold compile in 8 stubs would outlast the call
        log("compile variants left out: the in-process compile failed or was too slow")
    levels = [int(x) for x in args.levels.split(",")]
    server = None
    try:
        server = sweep.Server(t, tempfile.mkdtemp(prefix="hkgpu-diag-sweep-"), mps)
        log(f"server ready in {server.ready_s:.1f} s")
        for name, mb, delay, inst, params, dtype, procs, pref in variants:
            # the stats are cumulative per stub process (a stub may serve several variants): deltas
            before = {f: read_json(f) for f in glob.glob(os.path.join(stats, "*.json"))}
            cfg = variant_cfg(model.config, mb, delay, inst, params, dtype, pref)
            m = dataclasses.replace(model, config=cfg)
            row = {"name": name, "mb": mb, "delay": delay, "instances": inst, "params": params, "input": dtype,
                   "processes": procs, "loads": []}
            res["serving"].append(row)
            try:
                row["load_s"] = round(server.load("resnet50", cfg), 1)
            except HkError as e:
                row["error"] = str(e)
                log(f"{name}: {e}")
                save()
                continue
            log(f"{name}: loaded in {row['load_s']} s")
            for conc in levels:
                r = loadgen.run(sweep.spec_for(server.t, m, conc, args.load_seconds, procs, True))
                row["loads"].append(r)
                log(f"  {name}, {conc} in flight: {loadgen.line(r)}; machine CPU {r['machine_cpu_pct']}%")
                if r["p99_ms"] > args.stop_p99_ms:
                    break
            time.sleep(0.5)
            row["execute"] = []
            for f in sorted(glob.glob(os.path.join(stats, "*.json"))):
                a, b = read_json(f), before.get(f) or {"execs": 0, "requests": 0, "sums_s": {}}
                if not a or a["execs"] <= b["execs"]:
                    continue
                n = a["execs"] - b["execs"]
                row["execute"].append({"execs": n, "avg_batch": round((a["requests"] - b["requests"]) / n, 2),
                                       "us_per_exec": {k: round((v - b["sums_s"].get(k, 0)) / n * 1e6, 1)
                                                       for k, v in a["sums_s"].items()}})
            if row["execute"]:
                ex = row["execute"]   # weighted by calls: an unloaded stub's last write adds only a few
                n = sum(e["execs"] for e in ex)
                avg = {k: round(sum(e["us_per_exec"][k] * e["execs"] for e in ex) / n, 1) for k in ex[0]["us_per_exec"]}
                log(f"  {name}: execute() per call over {n} calls: {avg} us, "
                    f"batch {sum(e['avg_batch'] * e['execs'] for e in ex) / n:.1f}")
            save()
    finally:
        if server is not None:
            try:
                server.close()
            except HkError as e:
                log(str(e))
        if mps:
            p = hk("mps", "stop", "-p", prof)
            log(f"MPS stopped: {(p.stdout + p.stderr).strip()[-200:]}")
        save()
    if not args.no_engines:
        engines([e for e in (("compile warm", comp_opts, 90),) if e[0] in args.engines.split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
