"""`hkgpu-tune mps start|stop|status` (hosts without systemd too), `hkgpu-tune placement --gpu N` and
`hkgpu-tune mig-env POSITION FILE` (the UUID of a MIG device named by position, for a unit's start)."""
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
    p = sub.add_parser("mig-env", help="write CUDA_VISIBLE_DEVICES=<UUID> of the MIG device at a position "
                                       "(mig:GPU/SLOT) to a file: a service unit's ExecStartPre")
    p.add_argument("position", help="mig:GPU/SLOT, or a MIG device UUID")
    p.add_argument("file", help="the unit's EnvironmentFile (under /run/hkgpu-tune)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run_mig_env)


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


def run_mig_env(ctx: Context) -> int:
    """The unit of a service naming a MIG device by position runs this before the server (or the
    MPS daemon): the layout the boot unit re-created has new UUIDs, the position finds the device."""
    import os
    import re
    from hkgpu_tune.core.fsutil import atomic_write, ensure_trusted_dir
    from hkgpu_tune.serve.schema.devices import MIG_RE, POS_WHAT, ENV_DIR, host_nvml, is_mig, resolve

    args = ctx.args
    if not is_mig(args.position):
        raise HkError(f"mig-env: {args.position!r}: expected {POS_WHAT}, or a MIG device UUID")
    path = os.path.abspath(args.file)
    if os.path.dirname(path) != ENV_DIR or not re.fullmatch(r"mig-[A-Za-z0-9_.@-]{1,200}\.env", os.path.basename(path)):
        raise HkError(f"mig-env: {args.file}: expected {ENV_DIR}/mig-<unit>.env")
    # the unit's EnvironmentFile: a directory another user could write would let them set the
    # service's environment (LD_PRELOAD=...); checked before anything else is done
    ensure_trusted_dir(ENV_DIR, "MIG environment directory")
    nvml = host_nvml()
    try:
        uuid = resolve(nvml, args.position)
    finally:
        nvml.close()
    if not re.fullmatch(MIG_RE, uuid):
        raise HkError(f"mig-env: {args.position}: NVML gave {uuid!r}, not a MIG device UUID")
    atomic_write(path, f"CUDA_VISIBLE_DEVICES={uuid}\n", mode=0o644)
    if args.json:
        ctx.dump({"position": args.position, "uuid": uuid, "file": path}, profile=None)
    else:
        for k, v in (("position", args.position), ("uuid", uuid), ("file", path)):   # 80 columns
            ctx.line(f"{k}: {v}")
    return EXIT_OK
