"""The engine benchmark of a snapshot: trtexec where TensorRT is installed and a plan is named
(baseline.engine.plan), else the torch engine (triton/torch_model.py) where torch sees a CUDA GPU,
else `unsupported` with the reason. Repeated in rounds: img/s per round and per-batch latency.

>>> run(settings.Engine(), quick=False)["status"]     # on a node without a GPU   # doctest: +SKIP
'unsupported'
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import statistics
import subprocess
import tempfile
import time

ROUNDS = 5


def run(cfg, quick: bool, enabled: bool = True) -> dict:
    if not enabled:
        return {"status": "skipped", "reason": "left out (--no-engine)"}
    if quick:
        return {"status": "skipped", "reason": "--quick leaves the engine benchmark out"}
    from hkgpu_tune.serve.repository.tensorrt import trtexec_path
    trt = trtexec_path()
    plan = getattr(cfg, "plan", None)
    if trt and plan and os.path.isfile(plan):
        return _trtexec(trt, plan, cfg)
    why_trt = "no trtexec (TensorRT is not installed)" if not trt else "trtexec found but no engine plan named"
    if importlib.util.find_spec("torch") is None:
        return {"status": "unsupported", "reason": f"{why_trt}; torch is not installed"}
    try:
        import torch
        if not torch.cuda.is_available():
            return {"status": "unsupported", "reason": f"{why_trt}; torch sees no CUDA GPU"}
        return _torch(cfg)
    except Exception as e:  # noqa: BLE001 - a failed benchmark is a row, not a crash of the capture
        return {"status": "error", "tool": "torch", "reason": " ".join(str(e).split())[:300] or type(e).__name__}


def _result(tool, model, batch, rates, lat_ms, extra=None) -> dict:
    srt = sorted(lat_ms)
    return {"status": "ok", "tool": tool, "model": model, "batch": batch, "img_s": [round(r, 2) for r in rates],
            "latency_ms": [round(x, 4) for x in lat_ms[-2000:]],
            "latency_p50_ms": srt[len(srt) // 2] if srt else None,
            "latency_p99_ms": srt[min(len(srt) - 1, int(len(srt) * 0.99))] if srt else None, **(extra or {})}


def _torch(cfg) -> dict:
    import torch
    from hkgpu_tune.serve.repository.torch_model import TorchEngine
    import numpy as np
    eng = TorchEngine(cfg.model, batches=[cfg.batch], device="cuda:0")
    x = np.random.default_rng(0).standard_normal((cfg.batch, 3, 224, 224)).astype(eng.np_dtype)
    eng.host_in_np[:cfg.batch] = x
    for _ in range(10):
        eng.run_pinned(cfg.batch)
    rates, lat = [], []
    per_round = cfg.seconds / ROUNDS
    for _ in range(ROUNDS):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < per_round:
            t = time.perf_counter()
            eng.run_pinned(cfg.batch)
            lat.append((time.perf_counter() - t) * 1000)
            n += 1
        rates.append(n * cfg.batch / (time.perf_counter() - t0))
    return _result("torch", cfg.model, cfg.batch, rates, lat,
                   {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__})


def _shapes(plan: str, batch: int) -> str | None:
    """--shapes for the plan's inputs at `batch`, from the build flags kept beside the plan
    (tensorrt.key_path: --optShapes=NAME:BxCxHxW,...); None for a plan built elsewhere."""
    from hkgpu_tune.serve.repository.tensorrt import key_path
    try:
        with open(key_path(plan)) as f:
            flags = json.load(f)["key"]["flags"]
        spec = next(a.split("=", 1)[1] for a in flags if a.startswith("--optShapes="))
        pairs = [p.rpartition(":") for p in spec.split(",")]
        return "--shapes=" + ",".join(f"{n}:{batch}x{d.partition('x')[2]}" if "x" in d else f"{n}:{batch}"
                                      for n, _, d in pairs)
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None


OVERRIDE = re.compile(r"no shapes were provided\. Automatically overriding shape to: (\d+)")


def _trtexec(exe: str, plan: str, cfg) -> dict:
    """trtexec --loadEngine in ROUNDS runs; its --exportTimes JSON (one object per inference with
    latencyMs) is read with json. The batch: --shapes from the plan's build flags; without them
    trtexec runs a dynamic input at 1 (and says so), and that is the batch the rate counts."""
    rates, lat = [], []
    shapes = _shapes(plan, cfg.batch)
    batch = cfg.batch
    with tempfile.TemporaryDirectory(prefix="hkgpu-trt-") as tmp:
        for i in range(ROUNDS):
            times = os.path.join(tmp, f"times{i}.json")
            dur = max(1, round(cfg.seconds / ROUNDS))
            argv = [exe, f"--loadEngine={plan}", f"--duration={dur}", "--warmUp=200", f"--exportTimes={times}"]
            argv += [shapes] if shapes else []
            try:
                p = subprocess.run(argv, capture_output=True, text=True, timeout=dur + 120)
            except subprocess.TimeoutExpired:
                return {"status": "error", "tool": "trtexec", "reason": f"trtexec gave no result in {dur + 120} s"}
            if p.returncode != 0:
                tail = (p.stderr or p.stdout).strip().splitlines()
                return {"status": "error", "tool": "trtexec",
                        "reason": f"trtexec exited {p.returncode}: {tail[-1][:200] if tail else 'no output'}"}
            ran = OVERRIDE.search(p.stdout + p.stderr)
            if ran and not shapes:
                batch = int(ran.group(1))
            try:
                with open(times) as f:
                    recs = json.load(f)
                ms = [float(r["latencyMs"]) for r in recs]
            except (OSError, ValueError, KeyError, TypeError) as e:
                return {"status": "error", "tool": "trtexec", "reason": f"trtexec --exportTimes unreadable: {e}"}
            if not ms:
                return {"status": "error", "tool": "trtexec", "reason": "trtexec timed no inference"}
            lat += ms
            rates.append(batch * 1000 / statistics.fmean(ms))
    extra = {} if batch == cfg.batch else {"note": f"no input shapes known for this plan: trtexec ran batch {batch}"}
    return _result("trtexec", os.path.basename(plan), batch, rates, lat, extra)
