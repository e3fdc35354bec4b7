"""Is the sweep's choice the grid's best? Every config a `triton sweep --json` measured is measured
again with one longer load at its own best level (stepping down a fifth while over the SLO, as the
sweep confirms its choice), on a server of this script's own. Prints the chosen config's confirmed
img/s over the best longer-load img/s of any config (target >= 0.9) and writes the figures as JSON.

    hkgpu-tune triton sweep -p P ... --json > sweep.json
    python3 bench/sweep_grid.py -p P --sweep sweep.json --seconds 7.5 --out grid.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hkgpu_tune.core.profile import load_profile  # noqa: E402
from hkgpu_tune.serve.measuring import sweep  # noqa: E402
from hkgpu_tune.subsystems import triton  # noqa: E402

TARGET = 0.9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-p", "--profile", required=True)
    ap.add_argument("--sweep", required=True, help="the sweep's --json output")
    ap.add_argument("--seconds", type=float, default=7.5, help="the longer load, per config")
    ap.add_argument("--processes", type=int)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    doc = json.load(open(a.sweep))
    t = triton.check_models(triton.section(load_profile(a.profile)))
    model = t.model(doc["model"])
    slo = doc["slo_ms"]
    chosen = doc["best"]
    rows, t0 = [], time.monotonic()
    work = tempfile.mkdtemp(prefix="hkgpu-grid-")
    server = sweep.Server(t, work, mps=False)
    try:
        for p in doc["points"]:
            row = {"label": p["label"], "sweep_best": p["best"] and {k: p["best"][k] for k in ("img_s", "p99_ms", "concurrency")}}
            rows.append(row)
            if p["mps"]:
                row["error"] = "MPS config: not re-measured here"
                continue
            if not p["best"]:
                row["error"] = "nothing within the SLO in the sweep's loads"
                continue
            point = sweep.Point(p["config"], p["label"], False, best=dict(p["best"]))
            try:
                server.load(doc["model"], p["config"])
                sweep.confirm(server, model, point, a.seconds, a.processes, False, slo)
            except Exception as e:   # a config that fails to load again is reported, not fatal
                row["error"] = str(e)[:300]
                continue
            last = point.loads[-1]
            row["longer"] = {k: last[k] for k in ("img_s", "p99_ms", "concurrency", "errors")}
            row["held"] = bool(point.confirmed)
            print(f"{p['label']}: longer load {last['img_s']:.0f} img/s at p99 {last['p99_ms']:.2f} ms, "
                  f"{last['concurrency']} in flight, {'held' if point.confirmed else 'over the SLO'}", flush=True)
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    held = [r for r in rows if r.get("held")]
    best = max(held, key=lambda r: r["longer"]["img_s"]) if held else None
    got = (chosen or {}).get("best") if chosen and chosen.get("confirmed") else None
    ratio = round(got["img_s"] / best["longer"]["img_s"], 3) if got and best else None
    # the chosen config's own longer load in this run, against the same best (both measured here)
    mine = next((r for r in held if chosen and r["label"] == chosen["label"]), None)
    same_run = round(mine["longer"]["img_s"] / best["longer"]["img_s"], 3) if mine and best else None
    out = {"date": doc.get("date"), "slo_ms": slo, "seconds": a.seconds, "sweep_seconds": doc.get("seconds"),
           "configs": len(doc["points"]), "skipped": doc.get("skipped"), "chosen": chosen and chosen["label"],
           "chosen_confirmed": got and {k: got[k] for k in ("img_s", "p99_ms", "concurrency")},
           "grid_best": best and {"label": best["label"], **best["longer"]}, "ratio": ratio, "ratio_same_run": same_run, "target": TARGET,
           "pass": ratio is not None and ratio >= TARGET, "rows": rows, "check_s": round(time.monotonic() - t0, 1)}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"chosen {out['chosen']}: confirmed {got and round(got['img_s'])} img/s; grid best in a longer load: "
          f"{best and best['label']} {best and round(best['longer']['img_s'])} img/s; ratio {ratio} "
          f"(its own longer load here: {same_run}) "
          f"(target >= {TARGET}): {'pass' if out['pass'] else 'MISS'}", flush=True)
    return 0 if out["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
