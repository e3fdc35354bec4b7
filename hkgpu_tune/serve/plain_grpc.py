"""An independent, deliberately simple gRPC load client: tritonclient's own InferenceServerClient
(its InferInput / infer, as its users call it), one client per thread, threads in several
processes. It shares no code with the load generator (loadgen builds its protobuf request once
and calls the stub itself), so the two can be checked against each other at the same load.

>>> r = run("127.0.0.1", 8001, "resnet50", [("INPUT", "UINT8", [1, 3, 224, 224])],
...         concurrency=64, processes=8, duration_s=10)                        # doctest: +SKIP
"""
from __future__ import annotations

import math
import multiprocessing
import os
import threading
import time

NUMPY = {"BOOL": "bool", "UINT8": "uint8", "INT8": "int8", "UINT16": "uint16", "INT16": "int16", "FP16": "float16",
         "UINT32": "uint32", "INT32": "int32", "FP32": "float32", "UINT64": "uint64", "INT64": "int64",
         "FP64": "float64"}


def _process(url, model, inputs, threads, t_start, t_end, q):
    import numpy as np
    import tritonclient.grpc as tg
    lat, errs, first = [], [0], [""]
    lock = threading.Lock()

    def worker():
        c = tg.InferenceServerClient(url)
        ins = []
        for name, dt, shape in inputs:
            i = tg.InferInput(name, shape, dt)
            i.set_data_from_numpy(np.zeros(shape, dtype=NUMPY[dt]))
            ins.append(i)
        mine = []
        while time.time() < t_end:
            t0 = time.time()
            try:
                c.infer(model, ins)
                ok = True
            except Exception as e:   # tritonclient's InferenceServerException, or the channel's
                ok = False
                first[0] = first[0] or f"{type(e).__name__}: {e}"[:200]
            t1 = time.time()
            if t_start <= t1 <= t_end:
                if ok:
                    mine.append((t1 - t0) * 1000)
                else:
                    with lock:
                        errs[0] += 1
        c.close()
        with lock:
            lat.extend(mine)

    time.sleep(max(0.0, t_start - 1.0 - time.time()))
    cpu0 = time.process_time()
    ths = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    q.put({"lat": lat, "errors": errs[0], "first_error": first[0], "cpu_s": time.process_time() - cpu0})


def run(host: str, port: int, model: str, inputs: list[tuple[str, str, list[int]]], concurrency: int,
        processes: int = 8, duration_s: float = 10.0) -> dict:
    """`concurrency` requests in flight over gRPC for duration_s after a one-second warm-up; the same
    figures as plain.run."""
    processes = max(1, min(processes, concurrency))
    url = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    t_start = time.time() + 1.5 + 0.05 * processes + 1.0
    t_end = t_start + duration_s
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    procs = [ctx.Process(target=_process, args=(url, model, inputs, n, t_start, t_end, q), daemon=True)
             for n in shares]
    for p in procs:
        p.start()
    parts = [q.get(timeout=duration_s + 120) for _ in procs]
    for p in procs:
        p.join(5)
    lat = sorted(x for r in parts for x in r["lat"])

    def pct(p):
        return round(lat[max(1, math.ceil(len(lat) * p / 100)) - 1], 3) if lat else 0.0
    return {"client": "plain-grpc", "model": model, "concurrency": concurrency, "processes": processes,
            "duration_s": duration_s, "requests": len(lat), "errors": sum(r["errors"] for r in parts),
            "first_error": next((r["first_error"] for r in parts if r["first_error"]), ""),
            "img_s": round(len(lat) * inputs[0][2][0] / duration_s, 1), "p50_ms": pct(50), "p99_ms": pct(99),
            "max_ms": round(lat[-1], 3) if lat else 0.0,
            "client_cpu_cores": round(sum(r["cpu_s"] for r in parts) / (duration_s + 1.0), 2), "cpus": os.cpu_count()}
