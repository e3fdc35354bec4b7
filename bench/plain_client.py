"""The independent plain client (hkgpu_tune.serve.measuring.plain: http.client keep-alive threads in several
processes, binary tensors, standard library only) against a running Triton server.

    python3 bench/plain_client.py --url 127.0.0.1:8000 --model resnet50 --input INPUT:UINT8:3,224,224 \
        --concurrency 96 --processes 8 --seconds 10
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hkgpu_tune.serve.measuring import plain  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="127.0.0.1:8000", help="host:port of Triton's HTTP endpoint")
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", action="append", required=True,
                    help="NAME:DATATYPE:DIMS of one image (batch 1 is added), e.g. INPUT:UINT8:3,224,224")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    host, _, port = a.url.rpartition(":")
    inputs = []
    for spec in a.input:
        name, dt, dims = spec.split(":")
        inputs.append((name, dt, [1, *(int(d) for d in dims.split(","))]))
    r = plain.run(host or "127.0.0.1", int(port), a.model, inputs, a.concurrency, a.processes, a.seconds)
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        print(f"{r['img_s']:.0f} img/s, p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, {r['errors']} errors "
              f"({r['concurrency']} in flight, {r['processes']} processes, client CPU {r['client_cpu_cores']} cores)")
    return 1 if r["errors"] or not r["requests"] else 0


if __name__ == "__main__":
    sys.exit(main())
