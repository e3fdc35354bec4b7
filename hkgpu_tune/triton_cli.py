"""hkgpu-tune triton render | start | stop | gate | unit | command | build | export.

    hkgpu-tune triton render -p node.yaml          # write the model repository
    hkgpu-tune triton start -p node.yaml           # render, launch, wait for /v2/health/ready
    hkgpu-tune triton gate -p node.yaml            # warm-up + load; exit 1 with the figures if p99 > SLO
    hkgpu-tune triton stop -p node.yaml
    hkgpu-tune triton unit -p node.yaml            # the systemd unit it would install
    hkgpu-tune triton command -p node.yaml         # the exact argv (binary or container form)
"""
from __future__ import annotations

import json
import shlex
import time

from .errors import HkError

EXIT_OK, EXIT_ERROR = 0, 1


def add_parser(sub) -> None:
    p = sub.add_parser("triton", help="the Triton inference service: render, start, gate, stop")
    tsub = p.add_subparsers(dest="triton_cmd", required=True)
    for name, helptext in (("render", "write the model repository (config.pbtxt checked by Triton's schema)"),
                           ("start", "render, launch and wait until ready"),
                           ("stop", "stop the service; no process left"),
                           ("gate", "warm-up and a short load; fails when p99 is over the SLO"),
                           ("unit", "print the systemd unit"),
                           ("command", "print the argv of the service (binary or container form)"),
                           ("build", "build TensorRT plans from ONNX with trtexec (cached)")):
        q = tsub.add_parser(name, help=helptext)
        q.add_argument("--profile", "-p", help="profile file with a triton: section")
        q.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "start":
            q.add_argument("--no-gate", action="store_true", help="do not run the gate after ready")
            q.add_argument("--restart", action="store_true", help="stop a running server first")
        if name in ("gate", "start"):
            q.add_argument("--p99-ms", type=float, help="override the profile's SLO")
            q.add_argument("--requests", type=int, help="override the number of load requests")
            q.add_argument("--concurrency", type=int, help="override the load concurrency")
        q.set_defaults(extra_run=run)
    q = tsub.add_parser("export", help="export a torchvision model to ONNX (random weights, no download)")
    q.add_argument("model", help="torchvision model name, e.g. resnet50")
    q.add_argument("output", help="ONNX file to write")
    q.add_argument("--image-size", type=int, default=224)
    q.add_argument("--opset", type=int, default=17)
    q.add_argument("--json", action="store_true")
    q.set_defaults(extra_run=run)


def _section(args):
    from .profile import load_profile
    prof = load_profile(args.profile)
    t = prof.section("triton")
    if t is None:
        raise HkError(f"{prof.path}: the profile has no triton: section")
    return t


def _out(args, doc: dict, text: str) -> None:
    print(json.dumps(doc, indent=2, default=str) if args.json else text)


def run(args) -> int:
    cmd = args.triton_cmd
    if cmd == "export":
        from .triton import engine
        info = engine.export_torchvision(args.model, args.output, image_size=args.image_size, opset=args.opset)
        _out(args, info, f"wrote {info['path']} ({info['model']}, input {info['input']}, random weights)")
        return EXIT_OK
    from .backends import Backends
    from .triton import gate, launch, render
    t = _section(args)
    b = Backends()  # NVML for the GPU's name (plan cache key) and the placement
    try:
        return _run(args, cmd, t, b, gate, launch, render)
    finally:
        b.close()


def _run(args, cmd, t, b, gate, launch, render) -> int:
    if cmd == "render":
        files = render.write_repository(t, b)
        _out(args, {"repository": t.model_repository, "written": files},
             "\n".join(f"wrote {f}" for f in files) or f"{t.model_repository}: up to date")
        return EXIT_OK
    if cmd == "unit":
        print(launch.render_unit(t, launch.placement(t, b)), end="")
        return EXIT_OK
    if cmd == "command":
        argv = launch.command(t, launch.placement(t, b))
        _out(args, {"argv": argv, "env": launch.server_env(t) if t.launch == "binary" else {}}, shlex.join(argv))
        return EXIT_OK
    if cmd == "build":
        from .triton import engine
        out = [engine.build_model(t, m, b) for m in t.models if m.build]
        _out(args, {"plans": [o.__dict__ for o in out]},
             "\n".join(o.line() for o in out) or "no model has a build: section")
        return EXIT_OK
    if cmd == "stop":
        rep = launch.stop(t, b)
        _out(args, rep, f"stopped ({rep['how']}, {rep.get('seconds', 0)} s)" if rep["stopped"]
             else rep["how"] if not rep["left"] else f"processes left: {rep['left']}")
        return EXIT_OK if not rep["left"] else EXIT_ERROR
    if cmd == "start":
        t0 = time.monotonic()
        written = render.write_repository(t, b)
        if args.restart:
            launch.stop(t, b)
        was = launch.status(t, b)
        st = launch.start(t, b)
        waited = launch.wait_ready(t)
        doc = {"service": st, "written": written, "already_running": was["active"],
               "ready_s": round(time.monotonic() - t0, 3), "waited_s": round(waited, 3)}
        lines = [f"{st['target']}: ready in {doc['ready_s']} s" + (" (already running)" if was["active"] else "")]
        code = EXIT_OK
        if not args.no_gate:
            rep = gate.run_gate(t, p99_ms=args.p99_ms, requests=args.requests, concurrency=args.concurrency)
            doc["gate"] = rep.to_dict()
            lines.append(("gate passed: " if rep.passed else "gate FAILED: ") + rep.message)
            code = EXIT_OK if rep.passed else EXIT_ERROR
        _out(args, doc, "\n".join(lines))
        return code
    if cmd == "gate":
        rep = gate.run_gate(t, p99_ms=args.p99_ms, requests=args.requests, concurrency=args.concurrency)
        _out(args, rep.to_dict(), ("gate passed: " if rep.passed else "gate FAILED: ") + rep.message)
        return EXIT_OK if rep.passed else EXIT_ERROR
    return EXIT_ERROR
