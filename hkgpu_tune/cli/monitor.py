"""hkgpu-tune export: verify plus the collectors, one Prometheus textfile written atomically."""
from __future__ import annotations

import json

from hkgpu_tune.cli.context import EXIT_DRIFT, EXIT_OK, Context, nonempty

COLLECTORS = ("nic", "tcp", "gpu", "kmsg")


def collector_list(value: str) -> list[str]:
    import argparse
    names = [s.strip() for s in value.split(",") if s.strip()]
    bad = [n for n in names if n not in COLLECTORS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected comma-separated collectors ({','.join(COLLECTORS)}), "
                                         f"got {value!r}")
    return list(dict.fromkeys(names))


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="verify and collect node metrics into node_exporter's textfile directory")
    p.add_argument("--profile", "-p", type=nonempty, help="profile file or shipped profile name (default: hk-inference)")
    p.add_argument("--textfile-dir", type=nonempty, metavar="DIR",
                   help="node_exporter's textfile directory (default: $HKGPU_TUNE_TEXTFILE_DIR or "
                        "/var/lib/prometheus/node-exporter); the file is DIR/hkgpu-tune.prom")
    p.add_argument("--probes", action="store_true", help="also ping the profile's peers (RTT, jitter, loss, MTU)")
    p.add_argument("--collectors", type=collector_list, metavar="LIST",
                   help="comma-separated collectors to run (nic,tcp,gpu,kmsg; default: the profile's "
                        "export.collectors, else all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--state-dir", type=nonempty, help="apply's state directory (default /var/lib/hkgpu-tune)")
    p.set_defaults(run=run_export)


def run_export(ctx: Context) -> int:
    from hkgpu_tune.core import report
    from hkgpu_tune.observe.export import check_dir, export, textfile_dir
    a = ctx.args
    check_dir(textfile_dir(a.textfile_dir))   # before the profile and the engine: fail fast
    from hkgpu_tune.backends.nvml import replay_from_env
    from hkgpu_tune.observe.collect import Sources
    from hkgpu_tune.core.profile import resolve_profile
    src = Sources()
    nvml = replay_from_env()        # $HKGPU_TUNE_NVML_REPLAY, as health ($HKGPU_TUNE_KMSG_REPLAY: collect.kmsg)
    if nvml is not None:            # verify's gpu subsystem and the collectors read the same recording
        ctx.engine.b.nvml = src.nvml = nvml
    rep = export(ctx.profile, a.textfile_dir, probes=a.probes, engine=ctx.engine, sources=src,
                 profile_file=resolve_profile(a.profile), collectors=a.collectors)
    code = EXIT_DRIFT if rep.failures or rep.down else EXIT_OK
    if ctx.json:
        data = {"path": rep.path, "seconds": round(rep.seconds, 4), "series": rep.series,
                "failures": rep.failures,
                "collectors": [{"collector": c.collector, "up": c.up, "error": c.error,
                                "seconds": round(c.seconds, 4), "data": c.data} for c in rep.collectors]}
        print(json.dumps(report.envelope("export", data, ctx.profile), indent=2, default=str))
    else:   # plain lines: a timer's journal, not a terminal (rich would cost ~50 ms of imports)
        print(report.wrap(f"wrote {rep.path}: {rep.series} series in {rep.seconds * 1000:.0f} ms, "
                          f"{rep.failures} failed setting(s)"))
        for c in rep.collectors:
            if not c.up:
                print(report.wrap(f"collector down: {c.collector}: {c.error}"))
    return code
