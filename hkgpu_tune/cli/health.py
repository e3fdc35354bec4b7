"""`hkgpu-tune health`: the node's health against the profile's health: thresholds, and the drain
hooks once per transition. Exit 0 healthy, 2 degraded, 1 error."""
from __future__ import annotations

import json

from hkgpu_tune.cli.context import EXIT_DRIFT, EXIT_ERROR, EXIT_OK, Context, nonempty


def add_parser(sub) -> None:
    p = sub.add_parser("health", help="check GPU, kernel-log, NIC and drift health; run the drain hooks on a change")
    p.add_argument("--profile", "-p", type=nonempty, help="profile file or shipped profile name (its health: section)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--state-dir", type=nonempty,
                   help="where the last health state is kept (default /var/lib/hkgpu-tune)")
    p.add_argument("--no-hooks", action="store_true", help="check only: run no hook and record nothing")
    p.set_defaults(run=run_health)


def run_health(ctx: Context) -> int:
    from hkgpu_tune.observe import health
    from hkgpu_tune.core.report import envelope
    prof = ctx.profile
    cfg = health.config_of(prof)
    from hkgpu_tune.backends.nvml import Nvml, replay_from_env
    nvml = replay_from_env() or Nvml()     # $HKGPU_TUNE_NVML_REPLAY: a recorded host
    try:
        rep = health.run(prof, cfg, ctx.args.state_dir, hooks=not ctx.args.no_hooks, nvml=nvml)
    finally:
        nvml.close()
    if ctx.json:
        print(json.dumps(envelope("health", rep.to_dict(), prof), indent=2, default=str))
    else:
        _print(ctx, rep)
    return {health.HEALTHY: EXIT_OK, health.DEGRADED: EXIT_DRIFT}.get(rep.status, EXIT_ERROR)


def _fmt(v) -> str:
    if isinstance(v, dict):
        return ",".join(f"{k}={_fmt(x)}" for k, x in v.items()) or "-"
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v)) or "-"
    return "-" if v is None else str(v)


def _print(ctx: Context, rep) -> None:
    colours = {"ok": "green", "failing": "red", "skipped": "magenta", "error": "red"}
    for c in rep.checks:
        where = f" {c.target}" if c.target else ""
        ctx.line((f"{c.status:8}", colours.get(c.status, "")), f" {c.name}{where}: value {_fmt(c.value)}, "
                 f"threshold {_fmt(c.threshold)}" + (f" ({c.reason})" if c.reason else ""))
    a = rep.action
    n = len(rep.failing)
    ctx.line(("health: ", ""), (rep.status, {"healthy": "green", "degraded": "red"}.get(rep.status, "red")),
             f" ({n} failing)" if n else "")
    h = a.get("hook")
    if h:
        ctx.line(f"hook {h['hook']}: " + ("ok" if h["ok"] else f"FAILED: {h['error']} (tried again on the next run)"))
    if a.get("transition"):
        ctx.line(f"transition: now {a['transition']}")
    if a.get("held_down"):
        ctx.line(f"held down: {a['held_down']}")
    if a.get("skipped"):
        ctx.line(a["skipped"])
