"""Check the gate's load generator against the independent plain client (hkgpu_tune.serve.measuring.plain),
side by side on the same running server, config and in-flight count.

For each in-flight count: the load generator as the gate sizes it (processes, binary outputs) over
--seconds, the plain client over --seconds, and the gate's own load (the profile's request count);
prints the ratios (img/s and p99, load generator over plain) and writes them as JSON.

    python3 bench/loadgen_check.py -p bench/h200-resnet50.yaml --concurrency 64,96 --seconds 8 --out check.json

Targets (issue 21): img/s ratio >= 0.9, gate p99 within 20 % of the plain client's.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from hkgpu_tune.core.profile import load_profile           # noqa: E402
from hkgpu_tune.serve.running import client  # noqa: E402
from hkgpu_tune.serve.measuring import gate, loadgen, plain  # noqa: E402


def check(t, model, conc: int, seconds: float, processes: int | None, plain_processes: int | None) -> dict:
    req = client.request_for(model)
    n = loadgen.processes_for(conc, processes)
    name, dt, shape, _ = req[0]
    lg = loadgen.run(loadgen.LoadSpec(t.http.host, t.http.port, model.name, name, dt, shape, concurrency=conc,
                                      processes=n, duration_s=seconds, warmup_s=1.0, request=req,
                                      metrics_port=t.metrics.port))
    pl = plain.run(t.http.host, t.http.port, model.name, [(i[0], i[1], i[2]) for i in req], conc,
                   processes=plain_processes or n, duration_s=seconds)
    g = gate.load(t, model, t.gate.requests, conc, processes=processes)
    out = plain.compare(lg, pl)
    out["gate"] = {"requests": g.requests, "p50_ms": g.p50_ms, "p99_ms": g.p99_ms, "req_s": g.throughput,
                   "errors": g.errors, "processes": g.processes, "client_cpu_cores": g.client_cpu_cores,
                   "client_bound": g.client_bound}
    out["gate_p99_ratio"] = round(g.p99_ms / pl["p99_ms"], 3) if pl["p99_ms"] else None
    out["server"] = lg.get("server")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", "-p", required=True, help="the profile whose triton service is running")
    ap.add_argument("--unit", help="the service, where the profile has several (triton.services)")
    ap.add_argument("--model", help="default: the profile's first model")
    ap.add_argument("--concurrency", default="64,96", help="in-flight counts, e.g. 64,96")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--processes", type=int, help="load generator processes (default: as the gate sizes them)")
    ap.add_argument("--plain-processes", type=int, help="plain client processes (default: the same)")
    ap.add_argument("--out", help="write the JSON here")
    a = ap.parse_args()
    from hkgpu_tune.serve.schema.config import section
    t = section(load_profile(a.profile), a.unit)
    model = t.model(a.model) if a.model else t.models[0]
    rows = []
    for conc in (int(x) for x in a.concurrency.split(",")):
        r = check(t, model, conc, a.seconds, a.processes, a.plain_processes)
        rows.append(r)
        lg, pl, g = r["loadgen"], r["plain"], r["gate"]
        print(f"{conc} in flight: loadgen {lg['img_s']:.0f} img/s p99 {lg['p99_ms']:.2f} ms "
              f"({lg['processes']} proc, {lg['client_cpu_cores']} cores); plain {pl['img_s']:.0f} img/s "
              f"p99 {pl['p99_ms']:.2f} ms ({pl['processes']} proc, {pl['client_cpu_cores']} cores); "
              f"img/s ratio {r['img_s_ratio']}, p99 ratio {r['p99_ratio']}; gate ({g['requests']} requests) "
              f"p99 {g['p99_ms']:.2f} ms, ratio {r['gate_p99_ratio']}"
              + (f", client-bound: {g['client_bound']}" if g["client_bound"] else ""), flush=True)
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "profile": a.profile, "model": model.name, "seconds": a.seconds, "cpus": os.cpu_count(), "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
