"""`hkgpu-tune mps start|stop|status` (hosts without systemd too) and `hkgpu-tune placement --gpu N`."""
from __future__ import annotations

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.cli.context import EXIT_DRIFT, EXIT_ERROR, EXIT_OK, PROFILE_HELP, Context, nonempty


def add_parser(sub) -> None:
    p = sub.add_parser("mps", help="start, stop or probe the CUDA MPS control daemon of the profile")
    p.add_argument("action", choices=("start", "stop", "status"))
    p.add_argument("--profile", "-p", type=nonempty, help=PROFILE_HELP + "; its mps: section")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--direct", action="store_true", help="start/stop the daemon directly even where systemd runs")
    p.set_defaults(run=run_mps)
    p = sub.add_parser("placement", help="CPUs and NUMA node for a service on one GPU")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run_placement)


def run_mps(ctx: Context) -> int:
    from hkgpu_tune.backends import Backends
    from hkgpu_tune.core.report import fmt
    from hkgpu_tune.subsystems.mps import Plugin

    args, prof = ctx.args, ctx.profile
    if prof.section("mps") is None:
        raise HkError(f"{prof.label}: the profile has no mps: section")
    plug = Plugin(prof, Backends())
    try:
        direct = False if args.direct else None
        if args.action == "start":
            h = plug.start(use_systemd=direct)
        elif args.action == "stop":
            plug.stop(use_systemd=direct)
            h = plug.health()
        else:
            h = plug.health()
    finally:
        plug.b.close()
    h["pipe_dir"] = plug.cfg.pipe_dir
    if args.json:
        ctx.dump(h)
    else:
        state = "running" if h["alive"] else "stopped"
        extra = (f", servers {fmt(h['servers'])}, default active thread percentage "
                 f"{fmt(h['default_active_thread_percentage'])}") if h["alive"] else ""
        ctx.header()
        ctx.line(f"mps {state} ({plug.cfg.pipe_dir}){extra}")
    if args.action == "status":
        return EXIT_OK if h["alive"] else EXIT_DRIFT
    return EXIT_OK if h["alive"] == (args.action == "start") else EXIT_ERROR


def run_placement(ctx: Context) -> int:
    from hkgpu_tune.backends import Backends
    from hkgpu_tune.backends.topology import format_cpulist, service_placement, unit_lines

    args = ctx.args
    b = Backends()
    try:
        pl = service_placement(b, args.gpu)
    finally:
        b.close()
    if args.json:
        ctx.dump(pl, profile=None)   # placement reads the host, not a profile
    else:
        node = "none" if pl["numa_node"] is None else pl["numa_node"]
        ctx.line(f"GPU {args.gpu}: CPUs {format_cpulist(pl['cpus'])}, NUMA node {node} ({pl['source']})")
        for line in unit_lines(pl):
            ctx.line(f"  {line}")
    return EXIT_OK
