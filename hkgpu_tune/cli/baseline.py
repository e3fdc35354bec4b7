"""hkgpu-tune baseline capture | serve | compare.

Exit codes: capture 0 (all measured), 2 (something could not be measured, or a WAN RTT is over its
expected value: the snapshot is still written), 1 (no snapshot written); compare 0, 2 (a metric
regressed past its threshold), 1 (bad snapshot, another format or host); serve 0, 1.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.cli.context import PROFILE_HELP, EXIT_DRIFT, EXIT_OK, Context, nonempty

DEFAULT_DIR = "/var/lib/hkgpu-tune/baseline"


def _positive(v: str) -> float:
    try:
        f = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {v!r}") from None
    if not 0 < f <= 86400:
        raise argparse.ArgumentTypeError(f"expected 0 < seconds <= 86400, got {v}")
    return f


def add_parser(sub) -> None:
    p = sub.add_parser("baseline", help="capture a node's performance snapshot, serve iperf3, compare two snapshots")
    bs = p.add_subparsers(dest="baseline_cmd", required=True, metavar="ACTION")
    c = bs.add_parser("capture", help="measure and write one dated JSON snapshot")
    c.add_argument("--profile", "-p", type=nonempty, help=PROFILE_HELP)
    c.add_argument("--out", "-o", type=nonempty, help=f"snapshot file (default {DEFAULT_DIR}/HOST-TIME.json)")
    c.add_argument("--quick", action="store_true", help="the profile's quick counts (fewer pings and iperf3 runs; no engine benchmark)")
    c.add_argument("--no-engine", action="store_true", help="leave the engine benchmark out")
    c.add_argument("--json", action="store_true", help="also print the snapshot on stdout")
    c.set_defaults(run=run_capture)
    s = bs.add_parser("serve", help="run the iperf3 server peers measure against, for a bounded time")
    s.add_argument("--port", type=int, default=None, help="TCP port (default: the profile's baseline.iperf3_port, 5201)")
    s.add_argument("--seconds", type=_positive, default=900, help="stop after this long (default 900)")
    s.add_argument("--one-off", action="store_true", help="stop after one test (iperf3 -1)")
    s.add_argument("--bind", type=nonempty, action="append", metavar="ADDR",
                   help="listen on this address (repeat for more; default: the addresses of the "
                        "profile's fabric and WAN peers this host holds, never every address)")
    s.add_argument("--profile", "-p", type=nonempty, help=PROFILE_HELP)
    s.set_defaults(run=run_serve)
    m = bs.add_parser("compare", help="compare two snapshots metric by metric (exit 2 on a regression)")
    m.add_argument("before", help="the earlier snapshot")
    m.add_argument("after", help="the later snapshot")
    m.add_argument("--png", type=nonempty, metavar="FILE", help="also write a chart (before/after bars, RTT distributions)")
    m.add_argument("--profile", "-p", type=nonempty, help="take thresholds from this profile's baseline section "
                                                          "(default: the built-in thresholds, docs/baseline.md)")
    m.add_argument("--allow-other-host", action="store_true",
                   help="compare snapshots of two different hosts (a warning instead of an error)")
    m.add_argument("--json", action="store_true", help="machine-readable output")
    m.set_defaults(run=run_compare)


def _default_out() -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return os.path.join(DEFAULT_DIR, f"{socket.gethostname()}-{stamp}.json")


def _warn(msg: str) -> None:
    print(f"hkgpu-tune: warning: {msg}", file=sys.stderr)


def run_capture(ctx: Context) -> int:
    from hkgpu_tune.baseline import capture
    from hkgpu_tune.core.fsutil import atomic_write
    args = ctx.args
    out = args.out or _default_out()
    d = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(d):
        if args.out:
            raise HkError(f"{out}: no such directory {d}")
        try:
            os.makedirs(d, mode=0o755, exist_ok=True)
        except OSError as e:
            raise HkError(f"{d}: cannot make the snapshot directory: {e.strerror}") from None
    prof = ctx.profile
    snap, problems = capture.capture(prof, quick=args.quick, engine=not args.no_engine)
    text = json.dumps(snap, indent=1, default=str) + "\n"
    atomic_write(out, text, mode=0o644)
    for p in problems:
        _warn(p)
    if args.json:
        print(text, end="")
    else:
        _summary(ctx, snap, out)
    return EXIT_DRIFT if problems else EXIT_OK


def _summary(ctx: Context, snap: dict, out: str) -> None:
    ctx.line(f"baseline capture: {snap['host']} {snap['time']} profile {snap.get('profile')}"
             f"{' (quick)' if snap['quick'] else ''}: {snap['timings_s'].get('total', 0):.1f} s")
    for t in snap["throughput"]:
        rates = [r["gbit"] for r in t["runs"]]
        ctx.line(f"  iperf3 {t['peer']} {t['direction']}: " + (
            " ".join(f"{x:.2f}" for x in rates) + " Gbit/s" if rates else f"- ({t['error']})"))
    for lrow in snap["latency"]:
        if lrow.get("p50_ms") is None:
            ctx.line(f"  ping {lrow['kind']} {lrow['peer']}: - ({lrow.get('error')})")
            continue
        exp = f", expected {lrow['expected_rtt_ms']:g}" if lrow.get("expected_rtt_ms") is not None else ""
        ctx.line(f"  ping {lrow['kind']} {lrow['peer']}: p50 {lrow['p50_ms']:.3g} p99 {lrow['p99_ms']:.3g} "
                 f"jitter {lrow['jitter_ms']:.3g} ms{exp}, loss {lrow['loss_ratio']:.1%} ({lrow['received']}/{lrow['sent']})")
    e = snap["engine"]
    if e.get("status") == "ok":
        ctx.line(f"  engine {e['tool']} {e['model']} batch {e['batch']}: "
                 f"{sum(e['img_s']) / len(e['img_s']):.0f} img/s, p50 {e['latency_p50_ms']:.2f} ms")
    else:
        ctx.line(f"  engine: {e.get('status')}: {e.get('reason')}")
    ctx.line(f"wrote {out}")


def run_serve(ctx: Context) -> int:
    from hkgpu_tune.baseline import iperf, settings
    args = ctx.args
    port = args.port
    if port is None:
        port = settings.of(ctx.profile).iperf3_port if args.profile else 5201
    if not 1 <= port <= 65535:
        raise HkError(f"--port: expected 1-65535, got {port}")
    net = ctx.profile.network if not args.bind else None
    peers = [*net.fabric_peers, *(w.address for w in net.wan_peers)] if net else []
    addrs = iperf.listen_on(args.bind or [], peers)
    print(f"baseline serve: iperf3 on port {port} ({', '.join(addrs)})"
          + (" for one test" if args.one_off else "") + f", at most {args.seconds:g} s", flush=True)
    iperf.serve(port, args.seconds, one_off=args.one_off, bind=addrs)
    return EXIT_OK


def run_compare(ctx: Context) -> int:
    from hkgpu_tune.baseline import compare, settings
    from hkgpu_tune.core.report import envelope
    args = ctx.args
    cfg = settings.of(ctx.profile) if args.profile else None   # None: the after snapshot's thresholds
    before, after = compare.load(args.before), compare.load(args.after)
    cmp = compare.compare(before, after, cfg, allow_other_host=args.allow_other_host)
    chart = None
    if args.png:
        from hkgpu_tune.baseline.chart import chart as draw
        chart = draw(cmp, args.png)
    for w in cmp.warnings:
        _warn(w)
    if ctx.json:
        data = cmp.to_dict()
        data["chart"] = chart
        print(json.dumps(envelope("baseline compare", data, ctx.profile if args.profile else None), indent=2, default=str))
    else:
        compare.print_table(cmp, ctx.console)
        if chart:
            ctx.line(f"wrote {chart['path']} ({len(chart['panels'])} panels: {', '.join(chart['panels'])})")
    return cmp.exit_code
