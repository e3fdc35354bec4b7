"""An independent, deliberately simple gRPC load client: tritonclient's own InferenceServerClient
(its InferInput / infer, as its users call it), one client per thread, threads in several
processes. It shares no code with the load generator (loadgen builds its protobuf request once
and calls the stub itself), so the two can be checked against each other at the same load.

>>> r = run("127.0.0.1", 8001, "resnet50", [("INPUT", "UINT8", [1, 3, 224, 224])],
...         concurrency=64, processes=8, duration_s=10)                        # doctest: +SKIP
"""
from __future__ import annotations

import threading
import time

from hkgpu_tune.serve.measuring.plain import fan_out

ENDPOINT = "grpc"   # the service endpoint (triton.grpc) run() speaks to

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
    return fan_out("plain-grpc", _process, (url, model, inputs), model, inputs, concurrency, processes, duration_s,
                   start_s=1.5)
