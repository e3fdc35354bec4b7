"""hkgpu-tune triton render | start | stop | gate | sweep | unit | command | build | export.

    hkgpu-tune triton render -p node.yaml          # write the model repository
    hkgpu-tune triton start -p node.yaml           # render, launch, wait for /v2/health/ready
    hkgpu-tune triton gate -p node.yaml            # warm-up + load; exit 1 with the figures if p99 > SLO
    hkgpu-tune triton stop -p node.yaml
    hkgpu-tune triton unit -p node.yaml            # the systemd unit it would install
    hkgpu-tune triton command -p node.yaml         # the exact argv (binary or container form)
    hkgpu-tune triton sweep -p node.yaml --slo-ms 15 --png s.png --write   # best config under the SLO

Each subcommand: a parser added in add_parser and one run_* function of the Context.
"""
from __future__ import annotations

import os
import shlex
import sys
import time

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.report import fmt
from hkgpu_tune.cli.context import EXIT_ERROR, EXIT_OK, PROFILE_HELP, Context, nonempty


UNIT_HELP = "the service, by its unit, where the profile has several (triton.services)"


def add_parser(sub) -> None:
    p = sub.add_parser("triton", help="the Triton inference service: render, start, gate, stop")
    tsub = p.add_subparsers(dest="triton_cmd", required=True, metavar="COMMAND")
    for name, helptext, fn in (
            ("render", "write the model repository (config.pbtxt checked by Triton's schema)", run_render),
            ("start", "render, launch and wait until ready", run_start),
            ("stop", "stop the service; no process left", run_stop),
            ("gate", "warm-up and a short load; fails when p99 is over the SLO", run_gate),
            ("unit", "print the systemd unit", run_unit),
            ("command", "print the argv of the service (binary or container form)", run_command),
            ("build", "build TensorRT plans from ONNX with trtexec (cached)", run_build)):
        q = tsub.add_parser(name, help=helptext)
        q.add_argument("--profile", "-p", type=nonempty, help=PROFILE_HELP + "; its triton: section")
        q.add_argument("--json", action="store_true", help="machine-readable output")
        q.add_argument("--unit", help=UNIT_HELP)
        if name == "start":
            q.add_argument("--no-gate", action="store_true", help="do not run the gate after ready")
            q.add_argument("--restart", action="store_true", help="stop a running server first")
        if name in ("gate", "start"):
            q.add_argument("--p99-ms", type=float, help="override the profile's SLO")
            q.add_argument("--requests", type=int, help="override the number of load requests")
            q.add_argument("--concurrency", type=int, help="override the load concurrency")
            q.add_argument("--processes", type=int, help="override the load generator's processes (gate.load.processes)")
            q.add_argument("--protocol", choices=("http", "grpc"), help="override the load's protocol (gate.load.protocol)")
            q.add_argument("--no-live", dest="live", action="store_false",
                           help="always run the gate's own load, even beside live traffic (gate.live)")
        q.set_defaults(run=fn)
    q = tsub.add_parser("sweep", help="find the config with the most throughput under the p99 SLO "
                                      "(a server of its own; the running service is untouched)")
    q.add_argument("--profile", "-p", type=nonempty, help=PROFILE_HELP + "; its triton: section")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.add_argument("--unit", help=UNIT_HELP)
    q.add_argument("--model", help="the model to sweep (default: the profile's first)")
    q.add_argument("--max-batch", type=_ints, default=[], help="max_batch_size values, e.g. 32,64,128")
    q.add_argument("--delay-us", type=_ints, default=[], help="max_queue_delay_microseconds values, e.g. 0,500,2000")
    q.add_argument("--instances", type=_ints, default=[], help="instance counts, e.g. 1,2,4")
    q.add_argument("--preferred", type=_preferred, default=[],
                   help="preferred batch sizes to try, ';'-separated: none;max;8,16")
    q.add_argument("--mps", choices=("profile", "on", "off", "both"), default="profile",
                   help="MPS on/off (needs the profile's mps section and its daemon running)")
    q.add_argument("--concurrency", type=_ints, default=[8, 32, 128], help="load levels (requests in flight)")
    q.add_argument("--slo-ms", type=float, help="p99 SLO (default: the profile's gate.p99_ms)")
    q.add_argument("--budget-s", type=float, default=300, help="stop starting new configs after this many seconds")
    q.add_argument("--duration-s", type=float, default=5, help="seconds of load per level")
    q.add_argument("--confirm-s", type=float, help="one longer load that confirms the best level "
                   "(default: 3 x --duration-s; 0: none)")
    q.add_argument("--processes", type=int, help="load generator processes (default: one per 4 in flight, "
                   "at most one per CPU)")
    q.add_argument("--shm", action="store_true", help="inputs in system shared memory (default: over the socket)")
    q.add_argument("--protocol", choices=("http", "grpc"), default="http",
                   help="the load's protocol: HTTP with binary tensors (default) or gRPC (triton.grpc.port)")
    q.add_argument("--check-s", type=float, help="a load of the plain client at the best config, to check the "
                   "load generator against (default: --duration-s; 0: none)")
    q.add_argument("--png", help="write the chart (throughput against p99) here")
    q.add_argument("--write", action="store_true", help="put the best config into the profile file")
    q.set_defaults(run=run_sweep)
    q = tsub.add_parser("export", help="export a torchvision model to ONNX (random weights, no download)")
    q.add_argument("model", help="torchvision model name, e.g. resnet50")
    q.add_argument("output", help="ONNX file to write")
    q.add_argument("--image-size", type=int, default=224)
    q.add_argument("--opset", type=int, default=17)
    q.add_argument("--json", action="store_true")
    q.set_defaults(run=run_export)


def _preferred(v: str) -> list[str]:
    from hkgpu_tune.serve.measuring.sweep import preferred_choices
    return preferred_choices(v)


def _ints(v: str) -> list[int]:
    import argparse
    try:
        out = [int(x) for x in v.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a list of integers like 1,2,4, got {v!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return out


def _section(ctx: Context):
    from hkgpu_tune.subsystems import triton
    # with the mps section's directories where MPS runs; --unit picks one of several services
    t = triton.section(ctx.profile, getattr(ctx.args, "unit", None))
    if t is None:
        raise HkError(f"{ctx.profile.label}: the profile has no triton: section")
    return triton.check_models(t)


def _backends():
    from hkgpu_tune.backends import Backends
    return Backends()  # NVML for the GPU's name (plan cache key) and the placement


def _out(ctx: Context, doc: dict, text: str, profile=True, header=True) -> None:
    """JSON in the envelope, or the text after the line naming the profile."""
    if ctx.json:
        ctx.dump(doc, profile)
    else:
        if profile is True and header:
            ctx.header()
        print(text)


def run_export(ctx: Context) -> int:
    from hkgpu_tune.serve.repository import tensorrt
    a = ctx.args
    info = tensorrt.export_torchvision(a.model, a.output, image_size=a.image_size, opset=a.opset)
    _out(ctx, info, f"wrote {info['path']} ({info['model']}, input {fmt(info['input'])}, random weights)",
         profile=None)
    return EXIT_OK


def run_render(ctx: Context) -> int:
    from hkgpu_tune.serve.repository import render
    t = _section(ctx)
    b = _backends()
    try:
        files = render.write_repository(t, b)
    finally:
        b.close()
    _out(ctx, {"repository": t.model_repository, "written": files},
         "\n".join(f"wrote {f}" for f in files) or f"{t.model_repository}: up to date")
    return EXIT_OK


def run_unit(ctx: Context) -> int:
    from hkgpu_tune.serve.running import forms
    t = _section(ctx)
    b = _backends()
    try:
        unit = forms.render_unit(t, forms.placement(t, b))
    finally:
        b.close()
    if ctx.json:
        ctx.dump({"unit": unit})
    else:   # a unit file: the profile as a comment
        from hkgpu_tune.core.profile import SOURCES
        print(f"# hkgpu-tune triton unit: profile {ctx.profile.label} ({SOURCES.get(ctx.profile.source)})")
        print(unit, end="")
    return EXIT_OK


def run_command(ctx: Context) -> int:
    from hkgpu_tune.serve.running import forms
    t = _section(ctx)
    b = _backends()
    try:
        argv = forms.command(t, forms.placement(t, b))
    finally:
        b.close()
    if not ctx.json:   # stdout is the command line itself (for $(...)): the profile goes to stderr
        from hkgpu_tune.core.profile import SOURCES
        print(f"triton command: profile {ctx.profile.label} ({SOURCES.get(ctx.profile.source)})",
              file=sys.stderr)
    from hkgpu_tune.serve.running.form_base import form
    _out(ctx, {"argv": argv, "env": form(t.launch).env(t)}, shlex.join(argv),
         header=False)
    return EXIT_OK


def run_build(ctx: Context) -> int:
    from hkgpu_tune.serve.repository import tensorrt
    t = _section(ctx)
    b = _backends()
    try:
        out = [tensorrt.build_model(t, m, b) for m in t.models if m.build and m.engine == "tensorrt"]
    finally:
        b.close()
    _out(ctx, {"plans": [o.__dict__ for o in out]}, "\n".join(o.line() for o in out) or "no model has a build: section")
    return EXIT_OK


def run_stop(ctx: Context) -> int:
    from hkgpu_tune.serve.running import launch
    t = _section(ctx)
    b = _backends()
    try:
        rep = launch.stop(t, b)
    finally:
        b.close()
    line = (f"stopped ({rep['how']}, {rep.get('seconds', 0)} s)" if rep["stopped"]
            else rep["how"] if not rep["left"] else f"processes left: {fmt(rep['left'])}")
    _out(ctx, rep, line + (f"\n{rep['note']}" if rep.get("note") else ""))
    return EXIT_OK if not rep["left"] else EXIT_ERROR


def run_start(ctx: Context) -> int:
    from hkgpu_tune.serve.repository import render
    from hkgpu_tune.serve.running import launch
    from hkgpu_tune.serve.measuring import gate
    a = ctx.args
    t = _section(ctx)
    t0 = time.monotonic()
    b = _backends()
    try:
        written = render.write_repository(t, b)
        if a.restart:
            launch.stop(t, b)
        was = launch.status(t, b)
        st = launch.start(t, b)
        waited = launch.wait_ready(t)
        doc = {"service": st, "written": written, "already_running": was["active"],
               "ready_s": round(time.monotonic() - t0, 3), "waited_s": round(waited, 3)}
        lines = [f"{st['target']}: ready in {doc['ready_s']} s" + (" (already running)" if was["active"] else "")]
        code = EXIT_OK
        if not a.no_gate:
            rep = gate.run_gate(t, p99_ms=a.p99_ms, requests=a.requests, concurrency=a.concurrency,
                                processes=a.processes, protocol=a.protocol, live=a.live)
            doc["gate"] = rep.to_dict()
            lines.append(_verdict(rep))
            code = EXIT_ERROR if rep.verdict == "failed" else EXIT_OK
    finally:
        b.close()
    _out(ctx, doc, "\n".join(lines))
    return code


def run_gate(ctx: Context) -> int:
    from hkgpu_tune.serve.measuring import gate
    a = ctx.args
    t = _section(ctx)
    rep = gate.run_gate(t, p99_ms=a.p99_ms, requests=a.requests, concurrency=a.concurrency,
                        processes=a.processes, protocol=a.protocol, live=a.live)
    _out(ctx, rep.to_dict(), _verdict(rep))
    return EXIT_ERROR if rep.verdict == "failed" else EXIT_OK


def _verdict(rep) -> str:
    """The gate's line: passed, FAILED, or client-bound (the load generator, not the server, missed)."""
    return {"passed": "gate passed: ", "failed": "gate FAILED: ", "client-bound": "gate client-bound: "}[
        rep.verdict] + rep.message


def run_sweep(ctx: Context) -> int:
    from hkgpu_tune.serve.measuring import sweep, sweep_out
    a = ctx.args
    t = _section(ctx)
    name = a.model or t.models[0].name
    slo = a.slo_ms if a.slo_ms is not None else t.gate.p99_ms
    mps = {"profile": [], "on": [True], "off": [False], "both": [False, True]}[a.mps]
    grid = sweep.Grid(max_batch=a.max_batch, delay_us=a.delay_us, instances=a.instances, preferred=a.preferred,
                      mps=mps, concurrency=a.concurrency)
    if a.png:   # found now, not after the minutes of load
        d = os.path.dirname(os.path.abspath(a.png))
        if not os.path.isdir(d) or not os.access(d, os.W_OK):
            raise HkError(f"--png {a.png}: {d} is not a directory this user can write")
    from hkgpu_tune.serve.schema.config import each
    if a.write and len(each(ctx.profile.section("triton"))) > 1:
        raise HkError(f"--write: {ctx.profile.label} has several triton services; --write edits a profile of "
                      f"one (sweep it, then put the values into the service's models yourself)")
    if a.write and t.mps is not None and (mps == [False] or (not mps and not sweep.mps_running(t))):
        # found now, not after the minutes of load: every config would be measured without MPS
        why = ("--mps off measures without it" if mps == [False] else
               f"the MPS daemon is not running (no {os.path.join(t.mps.pipe_dir, 'control')}): start it "
               f"(hkgpu-tune mps start)")
        raise HkError(f"--write: this profile runs Triton as an MPS client, but {why}; the sweep must measure "
                      f"what the node serves")
    if a.confirm_s is not None and a.confirm_s < 0:
        raise HkError(f"--confirm-s {a.confirm_s:g}: must be 0 (no confirming load) or more")
    if not ctx.json:
        ctx.header()
    say = (lambda m: None) if ctx.json else (lambda m: print(m, flush=True))
    if a.protocol == "grpc" and a.shm:
        raise HkError("--protocol grpc: the gRPC load runs over the socket; leave out --shm")
    rep = sweep.run(t, name, grid, slo, a.budget_s, duration_s=a.duration_s, processes=a.processes, shm=a.shm,
                    log=say, confirm_s=a.confirm_s, check_s=a.check_s, protocol=a.protocol)
    doc = rep.to_dict()
    if a.png and rep.points:
        doc["png"] = sweep_out.chart(rep, a.png)
    bad = sweep.failure(rep)
    if not bad and a.write:
        try:
            doc["written"] = sweep.write_back(ctx.profile.path, name, rep)
        except HkError as e:   # the measurements are still reported; the refusal is the one error line
            bad = str(e)
    lines = [sweep_out.table(rep)]
    if doc.get("png"):
        lines.append(f"chart: {doc['png']}")
    if rep.best:
        b = rep.best.best
        lines.append(f"best: {rep.best.label}: {b['img_s']:.0f} img/s, p99 {b['p99_ms']:.2f} ms <= {slo:g} ms "
                     f"({rep.transport})")
    if rep.check:
        c = rep.check
        lines.append(f"check against the plain client at {c['concurrency']} in flight: img/s ratio "
                     f"{c['img_s_ratio']}, p99 ratio {c['p99_ratio']}")
    if doc.get("written"):
        lines.append(f"wrote the best config into {doc['written']}")
    _out(ctx, doc, "\n".join(lines), header=False)
    if bad:
        raise HkError(bad)
    return EXIT_OK
