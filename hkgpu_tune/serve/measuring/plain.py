"""An independent, deliberately simple load client for Triton's HTTP API: the yardstick the load
generator (loadgen) and the gate are checked against. Standard library only (http.client with
keep-alive, one thread per request in flight, several processes), binary tensors both ways. It
shares no code with loadgen or client, so a fault in those cannot hide here.

>>> r = run("127.0.0.1", 8000, "resnet50", [("INPUT", "UINT8", [1, 3, 224, 224])],
...         concurrency=64, processes=8, duration_s=10)                        # doctest: +SKIP
>>> r["img_s"], r["p99_ms"]                                                    # doctest: +SKIP
"""
from __future__ import annotations

import http.client
import json
import math
import multiprocessing
import os
import threading
import time

ENDPOINT = "http"   # the service endpoint (triton.http) run() speaks to; plain_grpc's is grpc
BYTES_PER = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2, "UINT32": 4,
             "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}


def body_for(inputs: list[tuple[str, str, list[int]]]) -> tuple[bytes, int]:
    """One request: a JSON header (every output in binary) and zero-filled tensors after it."""
    parts, heads = [], []
    for name, dt, shape in inputs:
        n = math.prod(shape)
        raw = (b"\x01\x00\x00\x000" * n) if dt in ("BYTES", "STRING") else bytes(BYTES_PER[dt] * n)
        heads.append({"name": name, "datatype": "BYTES" if dt == "STRING" else dt, "shape": shape,
                      "parameters": {"binary_data_size": len(raw)}})
        parts.append(raw)
    head = json.dumps({"inputs": heads, "parameters": {"binary_data_output": True}}).encode()
    return head + b"".join(parts), len(head)


def _process(host, port, model, body, head_len, threads, t_start, t_end, q):
    lat, errs, first = [], [0], [""]
    lock = threading.Lock()
    path = f"/v2/models/{model}/infer"
    hdrs = {"Inference-Header-Content-Length": str(head_len), "Content-Type": "application/octet-stream"}

    def worker():
        conn = http.client.HTTPConnection(host, port, timeout=30)
        mine = []
        while time.time() < t_end:
            t0 = time.time()
            try:
                conn.request("POST", path, body, hdrs)
                r = conn.getresponse()
                data = r.read()
                ok = r.status == 200
                if not ok and not first[0]:
                    first[0] = f"HTTP {r.status}: {data[:200]!r}"
            except (OSError, http.client.HTTPException) as e:
                ok = False
                first[0] = first[0] or f"{type(e).__name__}: {e}"
                conn.close()
                conn = http.client.HTTPConnection(host, port, timeout=30)
            t1 = time.time()
            if t_start <= t1 <= t_end:
                if ok:
                    mine.append((t1 - t0) * 1000)
                else:
                    with lock:
                        errs[0] += 1
        conn.close()
        with lock:
            lat.extend(mine)

    time.sleep(max(0.0, t_start - 1.0 - time.time()))   # the warm-up starts a second before the window
    cpu0 = time.process_time()
    ths = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    q.put({"lat": lat, "errors": errs[0], "first_error": first[0], "cpu_s": time.process_time() - cpu0})


def run(host: str, port: int, model: str, inputs: list[tuple[str, str, list[int]]], concurrency: int,
        processes: int = 8, duration_s: float = 10.0) -> dict:
    """`concurrency` requests in flight (threads, split over `processes`) for duration_s after a
    one-second warm-up; latency from send to the whole answer read."""
    processes = max(1, min(processes, concurrency))
    body, head_len = body_for(inputs)
    return fan_out("plain", _process, (host, port, model, body, head_len), model, inputs, concurrency, processes,
                   duration_s, start_s=1.0)


def fan_out(client: str, target, args: tuple, model: str, inputs, concurrency: int, processes: int,
            duration_s: float, start_s: float) -> dict:
    """Run target(*args, threads, t_start, t_end, queue) in `processes` forked processes sharing
    `concurrency` threads, all starting at one moment after start-up; gather their latencies into
    the summary both plain clients print (HTTP here, gRPC in plain_grpc)."""
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    t_start = time.time() + start_s + 0.05 * processes + 1.0
    t_end = t_start + duration_s
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    procs = [ctx.Process(target=target, args=(*args, n, t_start, t_end, q), daemon=True) for n in shares]
    for p in procs:
        p.start()
    parts = [q.get(timeout=duration_s + 120) for _ in procs]
    for p in procs:
        p.join(5)
    lat = sorted(x for r in parts for x in r["lat"])

    def pct(p):
        return round(lat[max(1, math.ceil(len(lat) * p / 100)) - 1], 3) if lat else 0.0
    return {"client": client, "model": model, "concurrency": concurrency, "processes": processes,
            "duration_s": duration_s, "requests": len(lat), "errors": sum(r["errors"] for r in parts),
            "first_error": next((r["first_error"] for r in parts if r["first_error"]), ""),
            "img_s": round(len(lat) * inputs[0][2][0] / duration_s, 1), "p50_ms": pct(50), "p99_ms": pct(99),
            "max_ms": round(lat[-1], 3) if lat else 0.0,
            "client_cpu_cores": round(sum(r["cpu_s"] for r in parts) / (duration_s + 1.0), 2), "cpus": os.cpu_count()}


def compare(loadgen_r: dict, plain_r: dict) -> dict:
    """The load generator's figures over the plain client's at the same config and in-flight count."""
    def ratio(a, b):
        return round(a / b, 3) if b else None
    return {"concurrency": plain_r["concurrency"], "img_s_ratio": ratio(loadgen_r["img_s"], plain_r["img_s"]),
            "p99_ratio": ratio(loadgen_r["p99_ms"], plain_r["p99_ms"]),
            "loadgen": {k: loadgen_r.get(k) for k in ("img_s", "p50_ms", "p99_ms", "errors", "processes",
                                                      "client_cpu_cores", "client_bound")},
            "plain": {k: plain_r.get(k) for k in ("client", "img_s", "p50_ms", "p99_ms", "errors", "processes",
                                                  "client_cpu_cores")}}
