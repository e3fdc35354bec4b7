"""TensorRT engines: ONNX -> plan with trtexec, rebuilt only when the ONNX, the flags, the GPU or the
TensorRT version change (a cache key beside the plan); and a torchvision -> ONNX exporter that
downloads no weights.

>>> build_plan(Build(onnx="resnet50.onnx"), "repo/resnet50/1/model.plan", model)   # doctest: +SKIP
BuildResult(built=True, ...)
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass

from hkgpu_tune.core.errors import ApplyError, HkError, UnsupportedError
from hkgpu_tune.core.fsutil import atomic_write
from hkgpu_tune.backends.command import Command

TRTEXEC_MISSING = "trtexec not found (TensorRT is not installed on this host); the plan cannot be built here"


@dataclass
class BuildResult:
    model: str
    path: str
    built: bool
    reason: str
    key: str = ""
    seconds: float = 0.0
    skipped: str = ""

    def line(self) -> str:
        if self.skipped:
            return f"{self.model}: skipped: {self.skipped}"
        return f"{self.model}: {'built' if self.built else 'up to date'} {self.path} ({self.reason}, {self.seconds:.1f} s)"


def _sha_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def trtexec_path() -> str | None:
    return shutil.which("trtexec") or next(
        (p for p in ("/usr/src/tensorrt/bin/trtexec", "/opt/tensorrt/bin/trtexec") if os.access(p, os.X_OK)), None)


def tensorrt_version(cmd: Command, exe: str) -> str:
    """'100300' from trtexec's banner '[TensorRT v100300]'."""
    r = cmd.run([exe, "--help"], timeout=60)
    m = re.search(r"TensorRT v(\d+)", r.out + r.err)
    return m.group(1) if m else "unknown"


def gpu_name(backends, index: int | None) -> str:
    if backends is None or index is None:
        return "unknown"
    try:
        return backends.nvml.gpu(index, ("name",)).get("name") or "unknown"
    except HkError:
        return "unknown"


def _shape(inp: dict, batch: int) -> str:
    dims = [str(batch)] + [str(d) for d in inp.get("dims", [])]
    return f"{inp['name']}:{'x'.join(dims)}"


def trtexec_args(build, plan: str, model) -> list[str]:
    """The flags (ONNX, output, precision, shapes for a dynamic batch)."""
    args = [f"--onnx={build.onnx}", f"--saveEngine={plan}"]
    if build.fp16:
        args.append("--fp16")
    if build.int8:
        args += ["--int8", f"--calib={build.calibration_cache}"]
    if model.max_batch_size > 0:
        mx = build.max_batch or model.max_batch_size
        opt = build.opt_batch or mx
        for flag, b in (("minShapes", build.min_batch), ("optShapes", opt), ("maxShapes", mx)):
            args.append(f"--{flag}=" + ",".join(_shape(i, b) for i in model.inputs))
    if build.workspace_mib:
        args.append(f"--memPoolSize=workspace:{build.workspace_mib}M")
    return args


def cache_key(build, model, args: list[str], gpu: str, trt: str) -> dict:
    flags = [a for a in args if not a.startswith(("--onnx=", "--saveEngine=", "--calib="))]
    return {"onnx_sha256": _sha_file(build.onnx), "flags": flags, "gpu": gpu, "tensorrt": trt,
            "calibration_sha256": _sha_file(build.calibration_cache) if build.calibration_cache else None}


def key_path(plan: str) -> str:
    return plan + ".key.json"


def build_plan(build, plan: str, model, backends=None, cmd: Command | None = None, gpu: int | None = 0,
               force: bool = False) -> BuildResult:
    """Build `plan` from build.onnx unless the key beside it matches. Raises UnsupportedError without trtexec."""
    exe = trtexec_path()
    if exe is None:
        raise UnsupportedError(f"{model.name}: {TRTEXEC_MISSING}")
    cmd = cmd or Command()
    args = trtexec_args(build, plan, model)
    key = cache_key(build, model, args, gpu_name(backends, gpu), tensorrt_version(cmd, exe))
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    try:
        with open(key_path(plan)) as f:
            old = json.load(f)
    except (FileNotFoundError, ValueError):
        old = None
    if not force and old and old.get("key") == key and os.path.isfile(plan):
        return BuildResult(model.name, plan, False, "cache key matches", digest)
    if old is None or not os.path.isfile(plan):
        reason = "no plan yet"
    else:
        reason = "changed: " + ", ".join(k for k in key if old.get("key", {}).get(k) != key[k]) if not force else "forced"
    os.makedirs(os.path.dirname(plan) or ".", exist_ok=True)
    tmp = plan + ".building"
    t0 = time.monotonic()
    r = cmd.run([exe] + trtexec_args(build, tmp, model), timeout=3600)
    if r.rc != 0 or not os.path.isfile(tmp):
        tail = "\n".join((r.out + r.err).strip().splitlines()[-8:])
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise ApplyError(f"{model.name}: trtexec failed (exit {r.rc}):\n{tail}")
    os.replace(tmp, plan)
    atomic_write(key_path(plan), json.dumps({"key": key, "digest": digest, "built": time.time()}, indent=1))
    return BuildResult(model.name, plan, True, reason, digest, round(time.monotonic() - t0, 2))


def build_model(t, model, backends=None, force: bool = False) -> BuildResult:
    """build_plan into the model repository; without trtexec a result that says it was skipped."""
    from hkgpu_tune.serve.config import model_filename
    plan = os.path.join(t.model_repository, model.name, str(model.version), model_filename(model))
    try:
        return build_plan(model.build, plan, model, backends, gpu=t.gpu, force=force)
    except UnsupportedError as e:
        return BuildResult(model.name, plan, False, "", skipped=str(e).split(": ", 1)[-1])


# ---------------------------------------------------------------- torchvision -> ONNX
def export_torchvision(name: str, output: str, image_size: int = 224, opset: int = 17, batch: int = 1) -> dict:
    """Export torchvision model `name` with random weights (weights=None: nothing is downloaded)
    to ONNX with a dynamic batch dimension. Input 'input' [N,3,S,S] FP32, output 'output'."""
    try:
        import torch
        import torchvision
    except ImportError:
        raise UnsupportedError("export needs torch and torchvision (not installed here)") from None
    try:
        builder = torchvision.models.get_model_builder(name)
    except ValueError:
        raise HkError(f"torchvision has no model {name!r}") from None
    import torch.hub

    def no_download(*a, **k):
        raise HkError("refusing to download weights: the exporter uses random weights")
    saved = torch.hub.load_state_dict_from_url
    torch.hub.load_state_dict_from_url = no_download
    try:
        model = builder(weights=None).eval()
    finally:
        torch.hub.load_state_dict_from_url = saved
    x = torch.randn(batch, 3, image_size, image_size)
    kw = dict(input_names=["input"], output_names=["output"], opset_version=opset,
              dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with torch.no_grad():
        try:
            torch.onnx.export(model, x, output, dynamo=False, **kw)
        except TypeError:  # torch before 2.5 has no dynamo argument
            torch.onnx.export(model, x, output, **kw)
    with torch.no_grad():
        out_shape = list(model(x).shape)
    return {"model": name, "path": output, "input": ["-1", 3, image_size, image_size],
            "output": ["-1"] + out_shape[1:], "opset": opset}
