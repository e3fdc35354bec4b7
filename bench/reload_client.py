#!/usr/bin/env python3
"""An independent load for reload tests: plain `http.client` keep-alive connections, binary tensors
(Triton's binary tensor extension), P processes x T threads, each thread one request in flight.
It shares no code with hkgpu_tune (the thing under test), so its failures and latencies are the
server's.

Runs until --duration seconds pass or --stop-file appears. Each process writes one line per request
to OUT.N.jsonl: [end_time, latency_ms, http_status (0: no answer), error text or ""]. `summary()`
turns them into totals and a per-second series; `window()` cuts out a time window.

    python3 bench/reload_client.py --port 8000 --model resnet50 --input INPUT__0 --output OUTPUT__0 \
        --dtype FP16 --shape 3,224,224 --procs 8 --threads 8 --stop-file /tmp/stop --out /tmp/load
"""
from __future__ import annotations

import argparse
import glob
import http.client
import json
import multiprocessing
import os
import sys
import threading
import time

SIZES = {"FP16": 2, "FP32": 4, "UINT8": 1, "INT32": 4}


def _body(args) -> tuple[bytes, dict]:
    shape = [1] + [int(x) for x in args.shape.split(",")]
    n = SIZES[args.dtype]
    for d in shape:
        n *= d
    head = json.dumps({"inputs": [{"name": args.input, "shape": shape, "datatype": args.dtype,
                                   "parameters": {"binary_data_size": n}}],
                       "outputs": [{"name": args.output, "parameters": {"binary_data": True}}]}).encode()
    data = bytes((i * 7) % 251 for i in range(min(n, 4096))) * (n // 4096 + 1)
    return head + data[:n], {"Inference-Header-Content-Length": str(len(head)),
                             "Content-Type": "application/octet-stream"}


def _thread(args, body, headers, stop, recs):
    path = f"/v2/models/{args.model}/infer"
    conn = None
    while not stop.is_set():
        t0 = time.time()
        status, err = 0, ""
        try:
            if conn is None:
                conn = http.client.HTTPConnection(args.host, args.port, timeout=args.timeout)
            conn.request("POST", path, body, headers)
            r = conn.getresponse()
            data = r.read()
            status = r.status
            if status != 200:
                err = data[:300].decode(errors="replace")
            elif "Inference-Header-Content-Length" not in r.headers:
                status, err = 0, "answer without binary output"
        except (OSError, http.client.HTTPException) as e:
            err = f"{type(e).__name__}: {e}"[:300]
            if conn is not None:
                conn.close()
            conn = None
        t1 = time.time()
        recs.append((round(t1, 4), round((t1 - t0) * 1000, 3), status, err))
        if err and not stop.is_set():
            time.sleep(0.01)


def _process(args, idx):
    body, headers = _body(args)
    stop = threading.Event()
    recs: list = []
    threads = [threading.Thread(target=_thread, args=(args, body, headers, stop, recs), daemon=True)
               for _ in range(args.threads)]
    for t in threads:
        t.start()
    end = time.time() + args.duration
    while time.time() < end and not (args.stop_file and os.path.exists(args.stop_file)):
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(args.timeout + 5)
    with open(f"{args.out}.{idx}.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


def load(out_prefix: str) -> list:
    recs = []
    for p in glob.glob(f"{out_prefix}.*.jsonl"):
        with open(p) as f:
            recs += [json.loads(line) for line in f if line.strip()]
    recs.sort(key=lambda r: r[0])
    return recs


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2)


def window(recs: list, t0: float, t1: float) -> dict:
    """Requests that ended in [t0, t1]: count, failed, p50/p99/max latency, the failures' texts."""
    sel = [r for r in recs if t0 <= r[0] <= t1]
    ok = [r[1] for r in sel if r[2] == 200]
    bad = [r for r in sel if r[2] != 200]
    span = max(t1 - t0, 1e-9)
    return {"requests": len(sel), "failed_requests": len(bad), "req_per_s": round(len(sel) / span, 1),
            "p50_ms": _pct(ok, 0.50), "p99_ms": _pct(ok, 0.99), "max_ms": round(max(ok), 1) if ok else None,
            "errors": sorted({f"{r[2]} {r[3]}" for r in bad})[:5]}


def series(recs: list, t0: float) -> list[dict]:
    """Per second from t0: requests, failed, p99."""
    out: dict[int, list] = {}
    for r in recs:
        out.setdefault(int(r[0] - t0), []).append(r)
    rows = []
    for s in sorted(out):
        rs = out[s]
        ok = [r[1] for r in rs if r[2] == 200]
        rows.append({"s": s, "requests": len(rs), "failed": sum(r[2] != 200 for r in rs), "p99_ms": _pct(ok, 0.99)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--dtype", default="FP32", choices=sorted(SIZES))
    ap.add_argument("--shape", required=True, help="one request's dims without the batch, e.g. 3,224,224")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=4, help="threads (requests in flight) per process")
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--timeout", type=float, default=30)
    ap.add_argument("--stop-file")
    ap.add_argument("--out", required=True, help="prefix of the per-process record files")
    args = ap.parse_args(argv)
    for p in glob.glob(f"{args.out}.*.jsonl"):
        os.unlink(p)
    procs = [multiprocessing.Process(target=_process, args=(args, i)) for i in range(args.procs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    recs = load(args.out)
    if recs:
        print(json.dumps(window(recs, recs[0][0], recs[-1][0])), flush=True)
    return 0 if all(p.exitcode == 0 for p in procs) else 1


if __name__ == "__main__":
    sys.exit(main())
