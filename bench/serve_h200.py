"""Serve and prove on the H200, side by side in one run (at most 10 minutes):

  naive   eager fp32 ResNet-50, batch 1, one request at a time, a plain HTTP server (bench/naive_server.py)
  tuned   the toolkit's Triton service started as operators start it (`hkgpu-tune apply --only triton`,
          its gate deciding; `--launch start` for `triton start --no-gate`) with the config `triton sweep`
          found best under the p99 SLO, MPS where it helps; inputs over the socket (binary HTTP) unless
          --shm; with --check, the load generator against the plain client at those in-flight counts
  limit   the same torch engine in-process: best batch, no server

All three are loaded by the same load generator (hkgpu_tune.serve.measuring.loadgen): one image per request,
several processes, many requests in flight. GPU utilisation is sampled with NVML over the tuned run.
Writes serve-h200.json and serve-h200.png into --out, and prints the targets with pass/fail.

    python3 bench/serve_h200.py --out docs/perf            # on the GPU machine
    python3 bench/serve_h200.py --quick --out /tmp/x       # a short run (smoke test)
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)   # bench/loadgen_check.py

from hkgpu_tune.core.errors import HkError  # noqa: E402
from hkgpu_tune.serve.measuring import loadgen, sweep, sweep_out  # noqa: E402

SETTINGS = ("persistence_mode,compute_mode,mig.mode.current,ecc.mode.current,power.limit,"
            "clocks.applications.graphics,clocks.applications.memory")
SERVED_SHARE = 0.85   # the service keeps at least this share of the sweep's figure, or the run warns
TARGETS = {"throughput_x_naive": 20.0, "tuned_p99_ms": 15.0, "gpu_util_pct": 80.0, "x_limit": 0.7,
           "p99_cut_at_naive_load_pct": 85.0, "launch_to_ready_s": 60.0}
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f} s] {msg}", flush=True)


def sh(*argv) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({argv[0]}: {e})"


def versions() -> dict:
    out = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    q = sh("nvidia-smi", "--query-gpu=name,driver_version,memory.total,pci.bus_id", "--format=csv,noheader")
    out["nvidia_smi"] = q
    parts = [p.strip() for p in q.split(",")]
    out["gpu"], out["driver"] = (parts[0], parts[1]) if len(parts) >= 2 else ("none", "none")
    out["cuda"] = next((ln.split("CUDA Version:")[1].split()[0] for ln in sh("nvidia-smi").splitlines()
                        if "CUDA Version:" in ln), "none")
    for mod in ("torch", "torchvision", "numpy", "aiohttp"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:   # absent, or broken (a torchvision built for another torch)
            out[mod] = "absent"
    try:
        from importlib.metadata import version
        out["nvidia_pytriton"] = version("nvidia-pytriton")
    except Exception:
        out["nvidia_pytriton"] = "absent"
    return out


class GpuSampler:
    """NVML utilisation every 100 ms, in a thread, between start() and stop(); averaged over the
    load generator's measured window (not its process start-up and warm-up, when the GPU idles)."""

    def __init__(self):
        self.samples: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nv, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as e:
            self.nv, self.why = None, str(e)

    def _run(self):
        while not self._stop.wait(0.1):
            u = self.nv.nvmlDeviceGetUtilizationRates(self.h)
            self.samples.append((time.monotonic() - T0, time.time(), u.gpu))

    def start(self):
        self.samples, self._stop = [], threading.Event()
        if self.nv:
            self.th = threading.Thread(target=self._run, daemon=True)
            self.th.start()
        return self

    def stop(self, window=None) -> dict:
        self._stop.set()
        if not self.nv:
            return {"gpu_util_pct": None, "why": self.why}
        self.th.join()
        vals = sorted(g for _, w, g in self.samples if window is None or window[0] <= w <= window[1])
        return {"gpu_util_pct": round(sum(vals) / len(vals), 1) if vals else None,
                "gpu_util_p10": vals[len(vals) // 10] if vals else None, "samples": len(vals),
                "over": "the load's measured window" if window else "start to stop",
                "series": [[round(t, 2), g] for t, _, g in self.samples]}


def free_port() -> int:
    from hkgpu_tune.serve.running import client
    return client.free_ports(1)[0]


# ---------------------------------------------------------------- limit
def limit_main(args) -> None:
    """In-process: the torch engine at each batch, input already on the GPU, and with the copies."""
    from hkgpu_tune.serve.repository.torch_model import TorchEngine
    import torch
    batches = [int(b) for b in args.limit_batches.split(",")]
    opts = json.loads(args.engine_opts or "{}")
    t0 = time.monotonic()
    eng = TorchEngine(args.model, batches, device="cuda:0", log=print, **opts)
    out = {"capture_s": round(time.monotonic() - t0, 1), "compile_s": eng.compile_s, "engine": opts, "batches": {}}
    for b in batches:
        for _ in range(5):
            eng.run_device(b)
        torch.cuda.synchronize()
        n, t1 = 0, time.perf_counter()
        while time.perf_counter() - t1 < args.limit_seconds:
            for _ in range(10):
                eng.run_device(b)
            torch.cuda.synchronize()
            n += 10
        dev = n * b / (time.perf_counter() - t1)
        m, t2 = 0, time.perf_counter()
        while time.perf_counter() - t2 < args.limit_seconds / 2:
            eng.run_pinned(b)
            m += 1
        pin = m * b / (time.perf_counter() - t2)
        out["batches"][b] = {"img_s": round(dev, 1), "ms_per_batch": round(b / dev * 1000, 3),
                             "with_copies_img_s": round(pin, 1)}
    best = max(out["batches"].items(), key=lambda kv: kv[1]["img_s"])
    out["limit_img_s"], out["limit_batch"] = best[1]["img_s"], int(best[0])
    print("LIMIT " + json.dumps(out), flush=True)


def engine_opts(args) -> dict:
    """The served model's engine settings (the profile's build and config parameters), for the limit."""
    from hkgpu_tune.serve.repository.torch_model import engine_options
    m = triton_section(args.profile).model(args.model)
    params = {k: v.get("string_value", "") for k, v in m.config.get("parameters", {}).items()}
    opts = engine_options(params, m.inputs[0]["data_type"])
    opts.pop("compile_budget_s", None)
    return opts


def run_limit(args) -> dict:
    p = subprocess.run([sys.executable, __file__, "--limit-only", "--model", args.model,
                        "--limit-batches", args.limit_batches, "--limit-seconds", str(args.limit_seconds),
                        "--engine-opts", json.dumps(engine_opts(args))],
                       capture_output=True, text=True, timeout=300)
    for ln in p.stdout.splitlines():
        if ln.startswith("LIMIT "):
            return json.loads(ln[6:])
    raise HkError(f"limit run failed (exit {p.returncode}): {p.stderr[-1500:]}")


# ---------------------------------------------------------------- naive
def run_naive(args) -> dict:
    port = free_port()
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "naive_server.py"), "--port", str(port),
                             "--model", args.model], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        t0 = time.monotonic()
        line = proc.stdout.readline()
        if "READY" not in line:
            raise HkError(f"naive server did not start: {proc.stderr.read()[-1500:]}")
        out = {"ready_s": round(time.monotonic() - t0, 1)}
        spec = loadgen.LoadSpec("127.0.0.1", port, args.model, "INPUT", "FP32", [1, 3, 224, 224],
                                raw_path="/infer", concurrency=1, processes=1, duration_s=args.naive_seconds,
                                warmup_s=1.0)
        out["one_at_a_time"] = loadgen.run(spec)
        log(f"naive, one client: {loadgen.line(out['one_at_a_time'])}")
        spec = dataclasses.replace(spec, concurrency=args.naive_concurrency, processes=2)
        out["saturated"] = loadgen.run(spec)
        log(f"naive, {args.naive_concurrency} in flight (saturation): {loadgen.line(out['saturated'])}")
        return out
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---------------------------------------------------------------- tuned
def hk(*argv, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def tuned_profile(args, workdir: str) -> str:
    """The bench profile, copied (the sweep writes its best config into the copy, not the source)."""
    dst = os.path.join(workdir, "profile.yaml")
    shutil.copyfile(args.profile, dst)
    return dst


def variant_profile(args, workdir: str) -> str:
    """The bench profile with --backend and --compile applied (the limit and the service both read it)."""
    text = open(args.profile).read()
    edits = []
    if args.backend != "auto":
        edits.append(("backend: auto", f"backend: {args.backend}"))
    if args.compile is not None:
        edits.append(('compile: {string_value: "true"}', f'compile: {{string_value: "{str(args.compile).lower()}"}}'))
    for old, new in edits:
        if old not in text:
            raise HkError(f"{args.profile}: expected {old!r} to change it to {new!r}")
        text = text.replace(old, new, 1)
    dst = os.path.join(workdir, "source-profile.yaml")
    with open(dst, "w") as f:
        f.write(text)
    return dst


def launch_by_apply(prof: str, res: dict) -> None:
    """`hkgpu-tune apply --only triton` from a stopped server: render, start, wait ready, the gate."""
    start = time.monotonic()
    state = os.path.join(os.path.dirname(prof), "state")
    p = hk("apply", "--only", "triton", "-p", prof, "--state-dir", state, "--json", timeout=400)
    res["apply_s"] = round(time.monotonic() - start, 1)
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        doc = {"error": (p.stderr or p.stdout).strip()[-1500:]}
    res["apply_exit"] = p.returncode
    res["gate"] = doc.get("notes") or []
    res["gate_passed"] = any(n.startswith("triton gate passed:") for n in res["gate"])
    res["gate_verdict"] = ("passed" if res["gate_passed"] else "client-bound" if any(
        n.startswith("triton gate client-bound") for n in res["gate"]) else "failed")
    if p.returncode != 0 or doc.get("error"):
        res["apply_error"] = doc.get("error") or p.stderr[-1500:]
        raise HkError(f"hkgpu-tune apply failed (exit {p.returncode}): {res['apply_error']}")
    log(f"apply --only triton: exit {p.returncode} in {res['apply_s']} s; " + " | ".join(res["gate"]))


def serve_and_measure(args, prof: str, t, model, res: dict, mps: bool) -> None:
    """Start the toolkit's service from the profile (apply with its gate, or triton start), measure, stop."""
    start = time.monotonic()
    res["launched_by"] = args.launch
    try:
        if args.launch == "apply":
            launch_by_apply(prof, res)
        else:
            p = hk("triton", "start", "-p", prof, "--no-gate", "--json", timeout=300)
            if p.returncode != 0:
                raise HkError(f"hkgpu-tune triton start failed: {(p.stderr or p.stdout).strip()[-1500:]}")
        from hkgpu_tune.serve.running import launch
        svc = launch.status(t)
    except BaseException:
        hk("triton", "stop", "-p", prof, "--json")
        raise
    # from the command to ready (apply: the gate's warm-up and load included)
    res["launch_to_ready_s"] = round(time.monotonic() - start, 1)
    res["service"] = {k: svc.get(k) for k in ("target", "pid", "how", "state") if k in svc}
    log(f"tuned service ready in {res['launch_to_ready_s']} s (CUDA graphs captured)")
    try:
        v = hk("verify", "--only", "triton", "-p", prof, "--json")
        res["verify_exit"] = v.returncode
        try:
            res["verify"] = [{k: r.get(k) for k in ("target", "key", "current", "status", "reason")}
                             for r in json.loads(v.stdout).get("results", [])]
        except ValueError:
            res["verify"] = v.stdout[-800:] + v.stderr[-800:]
        ok = []
        if args.plain_levels:   # the headline's load: the highest where the independent client holds the SLO
            res["plain_ladder"] = plain_ladder(args, t, model)
            ok = sorted((x for x in res["plain_ladder"] if x["errors"] == 0 and x["p99_ms"] <= args.slo_ms),
                        key=lambda x: x["concurrency"], reverse=True)
            log(f"the plain client held p99 {args.slo_ms:g} ms at " + (", ".join(str(x["concurrency"]) for x in ok)
                or "no level"))
        # the headline is a level every client agrees is inside the SLO: from the plain client's highest
        # down, the load generator's own load must hold it too (each try is kept in the record)
        res["headline_tries"] = []
        for i, cand in enumerate(ok or [None]):
            if cand is not None:
                args.concurrency_final = cand["concurrency"]
            spec = sweep.spec_for(t, model, args.concurrency_final, args.final_seconds, args.processes, args.shm,
                                  args.protocol)
            loadgen.run(dataclasses.replace(spec, duration_s=3, warmup_s=1))   # warm the connections and batcher
            sampler = GpuSampler().start()
            r = loadgen.run(spec)
            gpu = sampler.stop(r.get("window"))
            res["load"], res["gpu"], res["plain"] = r, gpu, cand
            agreed = cand is not None and r["errors"] == 0 and r["p99_ms"] <= args.slo_ms
            res["headline_tries"].append({"concurrency": args.concurrency_final, "loadgen_p99_ms": r["p99_ms"],
                                          "loadgen_img_s": r["img_s"], "plain_p99_ms": (cand or {}).get("p99_ms"),
                                          "plain_img_s": (cand or {}).get("img_s"), "agreed": agreed})
            log(f"tuned ({'MPS' if mps else 'no MPS'}), {args.concurrency_final} in flight: {loadgen.line(r)}; "
                f"GPU {gpu.get('gpu_util_pct')}%" + ("" if cand is None else
                f"; every client within the SLO: {agreed}"))
            if cand is None or agreed or i == len(ok) - 1 or i >= 2:
                break
        res["headline_agreed"] = bool(res["headline_tries"] and res["headline_tries"][-1]["agreed"])
        if args.protocols:
            res["protocols"] = protocols(args, t, model, spec)
        if args.naive_rate:
            o = loadgen.run(dataclasses.replace(spec, rate=args.naive_rate, concurrency=512,
                                                duration_s=args.naive_seconds))
            res["at_naive_load"] = o
            log(f"tuned at the naive server's saturation load ({args.naive_rate:.0f} req/s): {loadgen.line(o)}")
        if args.also_http:
            h = loadgen.run(dataclasses.replace(spec, shm=not args.shm, duration_s=args.naive_seconds))
            res["other_transport"] = h
            log(f"tuned, {h['transport']}: {loadgen.line(h)}")
        if args.check:
            import loadgen_check
            res["check"] = []
            for conc in args.check:
                c = loadgen_check.check(t, model, conc, args.check_seconds, None, None)
                res["check"].append(c)
                log(f"check at {conc} in flight: loadgen {c['loadgen']['img_s']:.0f} img/s p99 "
                    f"{c['loadgen']['p99_ms']:.2f} ms, plain {c['plain']['img_s']:.0f} img/s p99 "
                    f"{c['plain']['p99_ms']:.2f} ms (img/s ratio {c['img_s_ratio']}, p99 ratio {c['p99_ratio']}); "
                    f"gate p99 {c['gate']['p99_ms']:.2f} ms, ratio {c['gate_p99_ratio']}")
    finally:
        s = hk("triton", "stop", "-p", prof, "--json")
        res["stop_exit"] = s.returncode
        if args.launch == "apply":   # what apply recorded goes too: the journal refused the next bench's apply
            r = hk("rollback", "--state-dir", os.path.join(os.path.dirname(prof), "state"), "--json", timeout=300)
            res["rollback_exit"] = r.returncode


def plain_ladder(args, t, model) -> list[dict]:
    """The independent plain client (hkgpu_tune.serve.measuring.plain: standard library only, no code shared with
    the load generator) at each level, ascending, with NVML sampled over its window; stops at the
    first level over the SLO once one held."""
    from hkgpu_tune.serve.running import client
    from hkgpu_tune.serve.measuring import plain
    req = [(n, dt, shape) for n, dt, shape, _ in client.request_for(model)]
    out = []
    levels = list(args.plain_levels)
    while levels:
        conc = levels.pop(0)
        sampler = GpuSampler().start()
        t0 = time.time()
        r = plain.run(t.http.host, t.http.port, model.name, req, conc, processes=args.plain_processes or
                      loadgen.processes_for(conc, None), duration_s=args.plain_seconds)
        w0 = t0 + 1.0 + 0.05 * r["processes"] + 1.0   # plain.run's window
        gpu = sampler.stop([w0, w0 + args.plain_seconds])
        r["gpu_util_pct"] = gpu.get("gpu_util_pct")
        r["lowered"] = conc not in args.plain_levels
        out.append(r)
        log(f"plain client, {conc} in flight: {r['img_s']:.0f} img/s, p50 {r['p50_ms']:.2f} ms, p99 "
            f"{r['p99_ms']:.2f} ms, max {r['max_ms']:.1f} ms, {r['errors']} errors, GPU {r['gpu_util_pct']}%, "
            f"client CPU {r['client_cpu_cores']} cores")
        if r["errors"] or (r["p99_ms"] > args.slo_ms and any(x["p99_ms"] <= args.slo_ms for x in out)):
            break
        if not levels:
            levels = lower_levels(out, args.slo_ms)
    return out


def lower_levels(done: list[dict], slo_ms: float) -> list[int]:
    """Where the plain client held the SLO at no level asked for (a host slower than planned for): the
    next level down, a quarter under the lowest tried, at most three steps below the ladder."""
    if any(x["p99_ms"] <= slo_ms for x in done) or sum(x.get("lowered", False) for x in done) >= 3:
        return []
    low = min(x["concurrency"] for x in done)
    nxt = (low * 3 // 4) // 8 * 8
    if nxt < 8:
        return []
    return [nxt]


def protocols(args, t, model, spec) -> dict:
    """At the headline's load: the load generator over HTTP and over gRPC, and each against an
    independent client of the same protocol (plain: http.client; plain_grpc: tritonclient's own)."""
    from hkgpu_tune.serve.running import client
    from hkgpu_tune.serve.measuring import plain, plain_grpc
    req = [(n, dt, shape) for n, dt, shape, _ in client.request_for(model)]
    conc, secs = spec.concurrency, args.protocol_seconds
    out = {}
    for proto in args.protocols:
        lg_spec = dataclasses.replace(spec, protocol=proto, grpc_port=t.grpc.port, duration_s=secs, shm=False,
                                      request=spec.request or client.request_for(model))
        sampler = GpuSampler().start()
        lg = loadgen.run(lg_spec)
        lg["gpu_util_pct"] = sampler.stop(lg.get("window")).get("gpu_util_pct")
        sampler = GpuSampler().start()
        t0 = time.time()
        if proto == "grpc":
            pl = plain_grpc.run(t.grpc.host, t.grpc.port, model.name, req, conc, processes=spec.processes,
                                duration_s=secs)
            w0 = t0 + 1.5 + 0.05 * pl["processes"] + 1.0
        else:
            pl = plain.run(t.http.host, t.http.port, model.name, req, conc, processes=spec.processes, duration_s=secs)
            w0 = t0 + 1.0 + 0.05 * pl["processes"] + 1.0
        pl["gpu_util_pct"] = sampler.stop([w0, w0 + secs]).get("gpu_util_pct")
        keep = ("img_s", "p50_ms", "p99_ms", "max_ms", "errors", "processes", "client_cpu_cores", "gpu_util_pct")
        out[proto] = {"concurrency": conc, "seconds": secs,
                      "loadgen": {k: lg.get(k) for k in keep + ("client_bound", "transport", "server")},
                      "independent": {"client": pl["client"], **{k: pl.get(k) for k in keep}},
                      "img_s_ratio": round(lg["img_s"] / pl["img_s"], 3) if pl["img_s"] else None,
                      "p99_ratio": round(lg["p99_ms"] / pl["p99_ms"], 3) if pl["p99_ms"] else None}
        log(f"{proto}, {conc} in flight: load generator {lg['img_s']:.0f} img/s p99 {lg['p99_ms']:.2f} ms GPU "
            f"{lg['gpu_util_pct']}%; {pl['client']} {pl['img_s']:.0f} img/s p99 {pl['p99_ms']:.2f} ms GPU "
            f"{pl['gpu_util_pct']}% (img/s ratio {out[proto]['img_s_ratio']})")
    return out


def triton_section(path: str):
    from hkgpu_tune.core.profile import load_profile
    from hkgpu_tune.subsystems import triton
    return triton.check_models(triton.section(load_profile(path)))   # with the mps section's directories


def run_tuned(args, workdir: str, res: dict) -> None:
    """Sweep without MPS (and with it, where the profile has an mps section), then serve the best."""
    prof = tuned_profile(args, workdir)
    t = triton_section(prof)
    model = t.model(args.model)
    res.update(engine=model.engine, engine_why=model.engine_reason)
    mps_on = False
    if args.mps and t.mps is not None and shutil.which("nvidia-cuda-mps-control"):
        p = hk("mps", "start", "-p", prof)
        res["mps_start"] = (p.stdout + p.stderr).strip()[-400:]
        mps_on = p.returncode == 0 and sweep.mps_running(t)
        log(f"MPS daemon {'started' if mps_on else 'not started: ' + res['mps_start']}")
    try:
        runs = [] if mps_on and args.instances == [0] else [
            (False, sweep.Grid(max_batch=args.max_batch, delay_us=args.delay_us, instances=args.instances,
                               preferred=args.preferred,
                               mps=[False], concurrency=args.concurrency))]
        if mps_on:
            runs.append((True, sweep.Grid(max_batch=args.max_batch, delay_us=args.delay_us, preferred=args.preferred,
                                          instances=args.mps_instances, mps=[True], concurrency=args.concurrency)))
        merged = None
        spent = 0.0
        for i, (mps, grid) in enumerate(runs):
            budget = (args.sweep_budget_s - spent) / (len(runs) - i)
            rep = sweep.run(t, args.model, grid, args.select_p99_ms, budget, duration_s=args.sweep_seconds,
                            processes=args.processes, shm=args.shm, log=log, verbose=True, protocol=args.protocol)
            spent += rep.seconds
            if merged is None:
                merged = rep
            else:
                merged.points += rep.points
                merged.skipped += rep.skipped
                merged.seconds += rep.seconds
            fits = [p for p in merged.points if p.best]
            merged.best = max(fits, key=lambda p: (p.best["img_s"], -p.best["p99_ms"])) if fits else None
            res["sweep"] = merged.to_dict()
        res["sweep_table"] = sweep_out.table(merged)
        print(res["sweep_table"], flush=True)
        bad = sweep.failure(merged)
        if bad:
            raise HkError(bad)
        best_mps = merged.best.mps
        if not best_mps and "\nmps:" in open(prof).read():
            # the best config runs without MPS: the service gets no MPS environment
            text = open(prof).read()
            with open(prof, "w") as f:
                f.write(text.split("\nmps:")[0] + "\n")
        sweep.write_back(prof, args.model, merged)
        res["best_config"] = merged.best.label
        if not args.concurrency_final:   # the load level at which the best config did best
            args.concurrency_final = merged.best.best["concurrency"]
        t = triton_section(prof)
        model = t.model(args.model)
        res["mps"] = best_mps
        serve_and_measure(args, prof, t, model, res, best_mps)
    finally:
        if mps_on:
            p = hk("mps", "stop", "-p", args.profile)
            res["mps_stop"] = (p.stdout + p.stderr).strip()[-300:]


# ---------------------------------------------------------------- report
def chart(rec: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(2, 2, figsize=(13, 9), dpi=100)
    a = ax[0][0]
    names = ["naive", "tuned", "in-process limit"]
    vals = [rec.get("naive_img_s") or 0, rec.get("tuned_img_s") or 0, rec.get("limit_img_s") or 0]
    bars = a.bar(names, vals, color=["#bbbbbb", "#2a7ab9", "#7bb661"])
    a.bar_label(bars, labels=[f"{v:,.0f}" for v in vals])
    a.set_ylabel("img/s")
    a.set_title("throughput (ResNet-50, one image per request)")
    a = ax[0][1]
    nl = rec.get("naive_sat_p99_ms") or 0
    tl = rec.get("tuned_p99_at_naive_load_ms") or 0
    bars = a.bar(["naive at saturation", "tuned, same offered load"], [nl, tl], color=["#bbbbbb", "#2a7ab9"])
    a.bar_label(bars, labels=[f"{nl:.1f} ms", f"{tl:.1f} ms"])
    a.set_ylabel("client p99 (ms)")
    a.set_title(f"p99 at the naive server's saturation load ({rec.get('naive_img_s') or 0:.0f} req/s)")
    a = ax[1][0]
    sw = (rec.get("tuned") or {}).get("sweep") or {}
    for p in sw.get("points", []):
        if p["loads"]:
            a.plot([r["p99_ms"] for r in p["loads"]], [r["img_s"] for r in p["loads"]], marker="o", ms=3, lw=1,
                   label=p["label"])
    if rec.get("slo_ms"):
        a.axvline(rec["slo_ms"], color="red", ls="--", lw=1, label=f"SLO {rec['slo_ms']:g} ms")
    if sw.get("slo_ms") and sw["slo_ms"] != rec.get("slo_ms"):
        a.axvline(sw["slo_ms"], color="orange", ls=":", lw=1, label=f"chosen within p99 {sw['slo_ms']:g} ms")
    if sw.get("best") and sw["best"].get("best"):
        b = sw["best"]["best"]
        a.scatter([b["p99_ms"]], [b["img_s"]], s=200, facecolors="none", edgecolors="black", lw=2, zorder=5,
                  label="chosen")
    a.set_xscale("log")
    a.set_xlabel("client p99 (ms)")
    a.set_ylabel("img/s")
    a.set_title("triton sweep")
    a.legend(fontsize=6)
    a.grid(True, alpha=0.3)
    a = ax[1][1]
    series = ((rec.get("tuned") or {}).get("gpu") or {}).get("series") or []
    if series:
        t0 = series[0][0]
        a.plot([s[0] - t0 for s in series], [s[1] for s in series], lw=1)
    a.axhline(80, color="red", ls="--", lw=1, label="target 80%")
    a.set_ylim(0, 105)
    a.set_xlabel("s into the tuned load")
    a.set_ylabel("GPU utilisation (NVML, %)")
    a.set_title(f"GPU during the tuned load: mean {rec.get('gpu_util_pct')}%")
    a.legend(fontsize=7)
    fig.suptitle(f"hkgpu-tune serving bench, {rec.get('gpu')}, {rec.get('date')}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def summarise(rec: dict) -> dict:
    naive, tuned, limit = rec.get("naive") or {}, rec.get("tuned") or {}, rec.get("limit") or {}
    rec["naive_img_s"] = (naive.get("saturated") or {}).get("img_s")
    rec["naive_one_at_a_time_img_s"] = (naive.get("one_at_a_time") or {}).get("img_s")
    rec["naive_sat_p99_ms"] = (naive.get("saturated") or {}).get("p99_ms")
    rec["tuned_img_s"] = (tuned.get("load") or {}).get("img_s")
    rec["tuned_p99_ms"] = (tuned.get("load") or {}).get("p99_ms")
    rec["tuned_p99_at_naive_load_ms"] = (tuned.get("at_naive_load") or {}).get("p99_ms")
    rec["gpu_util_pct"] = (tuned.get("gpu") or {}).get("gpu_util_pct")
    rec["limit_img_s"] = limit.get("limit_img_s")
    rec["launch_to_ready_s"] = tuned.get("launch_to_ready_s")
    rec["launched_by"] = tuned.get("launched_by")
    rec["gate_passed"] = tuned.get("gate_passed")
    rec["transport"] = (tuned.get("load") or {}).get("transport")
    checks = {}

    def ratio(a, b):
        return round(a / b, 2) if a and b else None
    eng = limit.get("engine") or {}
    rec["engine"] = None if not eng else "compiled" if eng.get("compile") else "eager"
    sw = tuned.get("sweep") or {}
    n_configs = len(sw.get("points") or [])
    rec["config_source"] = "sweep" if n_configs > 1 else "given" if n_configs == 1 else None
    rec["sweep_configs"] = n_configs
    pl = tuned.get("plain") or {}
    rec["plain_img_s"], rec["plain_p99_ms"] = pl.get("img_s"), pl.get("p99_ms")
    rec["plain_gpu_util_pct"], rec["plain_concurrency"] = pl.get("gpu_util_pct"), pl.get("concurrency")
    rec["plain_x_limit"] = round(pl["img_s"] / rec["limit_img_s"], 3) if pl.get("img_s") and rec["limit_img_s"] else None
    rec["plain_x_naive"] = round(pl["img_s"] / rec["naive_img_s"], 1) if pl.get("img_s") and rec["naive_img_s"] else None
    if tuned.get("protocols"):
        rec["protocols"] = tuned["protocols"]
    rec["headline_agreed"], rec["headline_tries"] = tuned.get("headline_agreed"), tuned.get("headline_tries")
    rec["throughput_x_naive"] = ratio(rec["tuned_img_s"], rec["naive_img_s"])
    rec["x_limit"] = ratio(rec["tuned_img_s"], rec["limit_img_s"])
    rec["p99_cut_at_naive_load_pct"] = (round(100 * (1 - rec["tuned_p99_at_naive_load_ms"] / rec["naive_sat_p99_ms"]), 1)
                                        if rec["tuned_p99_at_naive_load_ms"] and rec["naive_sat_p99_ms"] else None)
    for k, target in TARGETS.items():
        v = rec.get(k)
        ok = None if v is None else (v <= target if k in ("tuned_p99_ms", "launch_to_ready_s") else v >= target)
        checks[k] = {"value": v, "target": target, "pass": ok}
    for k, target, low in (("plain_x_limit", TARGETS["x_limit"], False), ("plain_p99_ms", TARGETS["tuned_p99_ms"], True),
                           ("plain_gpu_util_pct", TARGETS["gpu_util_pct"], False),
                           ("plain_x_naive", TARGETS["throughput_x_naive"], False)):
        v = rec.get(k)
        checks[k] = {"value": v, "target": target, "pass": None if v is None else (v <= target if low else v >= target)}
    if rec["headline_agreed"] is not None:   # the plain client and the load generator both inside the SLO there
        checks["headline_agreed"] = {"value": rec["headline_agreed"], "target": True, "pass": rec["headline_agreed"]}
    rec["targets"] = checks
    # the service against the sweep's own figure for the same config and load: far below it, the
    # service is not running what was measured (a --write that dropped a setting did exactly that)
    swept = ((tuned.get("sweep") or {}).get("best") or {}).get("best") or {}
    rec["served_x_sweep"] = ratio(rec["tuned_img_s"], swept.get("img_s"))
    same_load = (tuned.get("load") or {}).get("concurrency") == swept.get("concurrency")
    if same_load and rec["served_x_sweep"] is not None and rec["served_x_sweep"] < SERVED_SHARE:
        rec.setdefault("warnings", []).append(
            f"the service served {rec['tuned_img_s']:.0f} img/s, {rec['served_x_sweep']} of the sweep's "
            f"{swept['img_s']:.0f} for the same config and load (expected {SERVED_SHARE} or more): check that the "
            f"served config is the measured one")
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "perf"))
    ap.add_argument("--profile", default=os.path.join(HERE, "h200-resnet50.yaml"))
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--quick", action="store_true", help="short loads and a small sweep (smoke test)")
    ap.add_argument("--slo-ms", type=float, default=15.0)
    ap.add_argument("--select-p99-ms", type=float, default=13.5,
                    help="the sweep picks the best load with p99 within this (a margin under --slo-ms, so a "
                         "re-run on a slower machine of the same kind stays under the SLO)")
    ap.add_argument("--no-naive", action="store_true")
    ap.add_argument("--no-limit", action="store_true")
    ap.add_argument("--no-mps", dest="mps", action="store_false")
    ap.add_argument("--backend", choices=("auto", "hkbatch", "python"), default="auto",
                    help="the torch engine's Triton backend (the profile's build: backend)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.compile the engine or not (default: as the profile says)")
    ap.add_argument("--also-http", action="store_true", help="also measure the other transport at the best config")
    ap.add_argument("--shm", action=argparse.BooleanOptionalAction, default=False,
                    help="inputs in system shared memory, or binary HTTP bodies over the socket (default)")
    ap.add_argument("--processes", type=int, help="load generator processes (default: one per 4 in flight)")
    ap.add_argument("--launch", choices=("apply", "start"), default="apply",
                    help="start the tuned service with `apply --only triton` and its gate (default) or "
                         "`triton start --no-gate`")
    ap.add_argument("--check", type=lambda v: [int(x) for x in v.split(",")], default=[],
                    help="in-flight counts at which to check the load generator and the gate against the plain "
                         "client on the tuned service (bench/loadgen_check.py)")
    ap.add_argument("--check-seconds", type=float, default=6.0)
    ints = lambda v: [int(x) for x in v.split(",")]  # noqa: E731
    ap.add_argument("--max-batch", type=ints, default=[32])
    ap.add_argument("--delay-us", type=ints, default=[200])
    ap.add_argument("--instances", type=ints, default=[0],
                    help="instance counts swept without MPS (0: none, where MPS runs)")
    ap.add_argument("--mps-instances", type=ints, default=[8, 12], help="instance counts swept with MPS")
    ap.add_argument("--preferred", type=sweep.preferred_choices, default=[],
                    help="preferred batch sizes swept, ';' between choices: e.g. '16,32,64;none' (default: the profile's)")
    ap.add_argument("--concurrency", type=ints, default=[56, 64, 72, 80, 96])
    ap.add_argument("--concurrency-final", type=int, default=0, help="default: the sweep's best level")
    ap.add_argument("--sweep-budget-s", type=float, default=200)
    ap.add_argument("--sweep-seconds", type=float, default=3)
    ap.add_argument("--final-seconds", type=float, default=15)
    ap.add_argument("--naive-seconds", type=float, default=8)
    ap.add_argument("--naive-concurrency", type=int, default=8)
    ap.add_argument("--plain-levels", type=ints, default=[],
                    help="in-flight counts for the independent plain client on the served config; the headline "
                         "load is the highest whose p99 it measures within --slo-ms (default: the sweep's level)")
    ap.add_argument("--plain-seconds", type=float, default=8)
    ap.add_argument("--plain-processes", type=int, help="the plain client's processes (default: one per 4 in flight)")
    ap.add_argument("--protocol", choices=("http", "grpc"), default="http",
                    help="the sweep's and the tuned load's protocol (HTTP with binary tensors, or gRPC)")
    ap.add_argument("--protocols", type=lambda v: [x for x in v.split(",") if x], default=[],
                    help="at the headline load, the load generator and an independent client over each of these "
                         "protocols (http,grpc)")
    ap.add_argument("--protocol-seconds", type=float, default=6)
    ap.add_argument("--limit-batches", default="32,64,128,256")
    ap.add_argument("--limit-seconds", type=float, default=2)
    ap.add_argument("--limit-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine-opts", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.limit_only:
        limit_main(args)
        return 0
    if args.quick:
        args.sweep_budget_s, args.sweep_seconds, args.final_seconds, args.naive_seconds = 60, 2, 5, 4
        args.max_batch, args.delay_us = args.max_batch[:1], args.delay_us[:1]
        args.instances, args.mps_instances = args.instances[:1], args.mps_instances[:1]
        args.concurrency, args.limit_seconds = args.concurrency[:2], 1
    os.makedirs(args.out, exist_ok=True)
    rec = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "python3 bench/serve_h200.py " + " ".join(sys.argv[1:]), **versions(),
           "slo_ms": args.slo_ms, "select_p99_ms": args.select_p99_ms}
    rec["settings_before"] = sh("nvidia-smi", f"--query-gpu={SETTINGS}", "--format=csv")
    log(f"{rec['gpu']}, driver {rec['driver']}, CUDA {rec['cuda']}, torch {rec['torch']}")
    workdir = "/tmp/hkgpu-bench"
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    rec["source_profile"] = os.path.relpath(args.profile, REPO)
    args.profile = variant_profile(args, workdir)
    errors = []
    try:
        if not args.no_limit:
            rec["limit"] = run_limit(args)
            log(f"in-process limit: {rec['limit']['limit_img_s']:.0f} img/s at batch {rec['limit']['limit_batch']} "
                f"(compiled in {rec['limit']['compile_s']} s, ready with graphs in {rec['limit']['capture_s']} s, "
                f"engine {rec['limit']['engine']}): {rec['limit']['batches']}")
        args.naive_rate = None
        if not args.no_naive:
            rec["naive"] = run_naive(args)
            args.naive_rate = rec["naive"]["saturated"]["img_s"]
        rec["tuned"] = {}
        try:
            run_tuned(args, workdir, rec["tuned"])
        except HkError as e:
            errors.append(str(e))
            log(f"tuned: {e}")
    finally:
        rec["settings_after"] = sh("nvidia-smi", f"--query-gpu={SETTINGS}", "--format=csv")
        rec["settings_unchanged"] = rec["settings_after"] == rec["settings_before"]
        rec["mps_left"] = [ln for ln in sh("ps", "-eo", "pid,stat,args").splitlines()
                           if "nvidia-cuda-mps" in ln and " Z" not in ln]   # a reaped-late zombie is no daemon
        rec["errors"] = errors
        summarise(rec)
        path = os.path.join(args.out, "serve-h200.json")
        with open(path, "w") as f:
            json.dump(rec, f, indent=1, default=str)
        try:
            chart(rec, os.path.join(args.out, "serve-h200.png"))
        except Exception as e:  # the JSON is the record; say why the chart is missing
            log(f"chart not written: {type(e).__name__}: {e}")
    log("targets: " + "; ".join(f"{k} {v['value']} ({'pass' if v['pass'] else 'FAIL' if v['pass'] is False else 'n/a'}"
                                f", target {v['target']})" for k, v in rec["targets"].items()))
    log(f"settings unchanged: {rec['settings_unchanged']}; MPS processes left: {rec['mps_left'] or 'none'}")
    for w in rec.get("warnings", []):
        log(f"WARNING: {w}")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
