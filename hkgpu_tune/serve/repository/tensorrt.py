"""TensorRT engines: ONNX -> plan with trtexec, rebuilt only when the ONNX, the flags, the GPU, the
driver or the TensorRT version change (a cache key beside the plan); and a torchvision -> ONNX
exporter that downloads no weights.

The plan's I/O types follow the model's config: trtexec builds every input and output in fp32
unless told otherwise (--inputIOFormats/--outputIOFormats, trtexec's help in TensorRT's
samples/trtexec), and Triton's TensorRT backend refuses a plan whose binding types differ from
config.pbtxt. Builds skip trtexec's benchmark (--skipInference). In the container form trtexec
runs inside the image that serves the plan (see container.py).

>>> build_plan(Build(onnx="resnet50.onnx"), "repo/resnet50/1/model.plan", model)   # doctest: +SKIP
BuildResult(built=True, ...)
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass

from hkgpu_tune.core.errors import ApplyError, HkError, UnsupportedError
from hkgpu_tune.core.fsutil import atomic_write
from hkgpu_tune.backends.command import Command
from hkgpu_tune.serve.schema.config import IO_TYPES, TRITON_TYPES
from hkgpu_tune.serve.running.container import version_from_banner

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
    """trtexec on PATH or where TensorRT puts it, passing fsutil's trust rule (root never runs one
    another user owns or can write: a refused one is skipped)."""
    from hkgpu_tune.core.fsutil import program_refusal
    found = [shutil.which("trtexec"), "/usr/src/tensorrt/bin/trtexec", "/opt/tensorrt/bin/trtexec"]
    return next((p for p in found if p and os.access(p, os.X_OK) and not program_refusal(p)), None)


def tensorrt_version(cmd: Command, exe: str) -> str:
    r = cmd.run([exe, "--help"], timeout=60)
    return version_from_banner(r.out + r.err)


@dataclass
class Trtexec:
    """Where trtexec runs: its argv up to its own flags, and the TensorRT version there."""
    argv: list
    version: str
    where: str = "host"


def host_trtexec(cmd: Command | None = None) -> Trtexec:
    exe = trtexec_path()
    if exe is None:
        raise UnsupportedError(TRTEXEC_MISSING)
    return Trtexec([exe], tensorrt_version(cmd or Command(), exe))


def form(t):
    """The service's launch form (running/form_base), which says where trtexec runs."""
    from hkgpu_tune.serve.running.form_base import form as by_name
    return by_name(getattr(t, "launch", "binary") if t is not None else "binary")


def runner(t, build, plan: str, cmd: Command | None = None) -> Trtexec:
    """The host's trtexec, or the one its launch form names (the container form: the serving image's)."""
    image = form(t).trtexec(t, build, plan, cmd)
    return Trtexec(*image) if image else host_trtexec(cmd)


def cannot_build(t) -> str | None:
    """Why no plan can be built for this service here (no trtexec on the host, or in the image)."""
    why = form(t).trtexec_missing(t)
    if why is not None:
        return why or None
    return None if trtexec_path() else TRTEXEC_MISSING


def gpu_name(backends, index: int | str | None) -> str:
    """The GPU a plan is built for, by name; a MIG device (index 'MIG-...') adds its profile, since a
    plan built on a 1g slice is not valid on a 3g one."""
    from hkgpu_tune.backends.mig import find as find_mig
    from hkgpu_tune.serve.schema.devices import is_mig
    if is_mig(index):
        try:
            d = find_mig(backends.nvml, index) if backends is not None else None
        except HkError:
            d = None
        return f"{d['gpu_name']} MIG {d['profile']}" if d else "unknown MIG device"
    if backends is None or index is None:
        return "unknown"
    try:
        return backends.nvml.gpu(index, ("name",)).get("name") or "unknown"
    except HkError:
        return "unknown"


def driver_version(backends) -> str:
    if backends is None:
        return "unknown"
    try:
        return str(backends.nvml.info().get("driver_version") or "unknown")
    except HkError:
        return "unknown"


def io_formats(tensors: list[dict]) -> str:
    """trtexec's spec for these tensors, in config order: one type broadcast when all agree, else
    one per tensor (then the config lists them in the network's order, as trtexec asks)."""
    types = [IO_TYPES[t["data_type"]] for t in tensors]
    if len(set(types)) == 1:
        return f"{types[0]}:chw"
    return ",".join(f"{x}:chw" for x in types)


def _shape(inp: dict, batch: int) -> str:
    dims = [str(batch)] + [str(d) for d in inp.get("dims", [])]
    return f"{inp['name']}:{'x'.join(dims)}"


def trtexec_args(build, plan: str, model) -> list[str]:
    """The flags: ONNX, output, no benchmark, precision, shapes for a dynamic batch, I/O types."""
    args = [f"--onnx={build.onnx}", f"--saveEngine={plan}", "--skipInference"]
    if build.fp16:
        args.append("--fp16")
    if build.int8:
        args += ["--int8", f"--calib={build.calibration_cache}"]
    if model.max_batch_size > 0:
        mx = build.max_batch or model.max_batch_size
        opt = build.opt_batch or mx
        for flag, b in (("minShapes", build.min_batch), ("optShapes", opt), ("maxShapes", mx)):
            args.append(f"--{flag}=" + ",".join(_shape(i, b) for i in model.inputs))
    if model.inputs:
        args.append(f"--inputIOFormats={io_formats(model.inputs)}")
    if model.outputs:
        args.append(f"--outputIOFormats={io_formats(model.outputs)}")
    if build.workspace_mib:
        args.append(f"--memPoolSize=workspace:{build.workspace_mib}M")
    return args


def asked_io(model) -> dict:
    """The binding types a build asks for: {"input": {name: fp16}, "output": {...}}."""
    return {"input": {t["name"]: IO_TYPES.get(t.get("data_type"), "?") for t in model.inputs},
            "output": {t["name"]: IO_TYPES.get(t.get("data_type"), "?") for t in model.outputs}}


def plan_io(plan: str) -> dict | None:
    """The plan's binding types as TensorRT exposes them (the tensorrt module's engine
    inspection), or None where TensorRT's Python module is not installed."""
    try:
        import tensorrt as trt
    except ImportError:
        return None
    with open(plan, "rb") as f, trt.Runtime(trt.Logger(trt.Logger.ERROR)) as rt:
        engine = rt.deserialize_cuda_engine(f.read())
    if engine is None:
        raise ApplyError(f"{plan}: TensorRT cannot deserialize this plan")
    names = {trt.DataType.FLOAT: "fp32", trt.DataType.HALF: "fp16", trt.DataType.INT8: "int8",
             trt.DataType.INT32: "int32", trt.DataType.BOOL: "bool"}
    for attr, name in (("BF16", "bf16"), ("INT64", "int64"), ("UINT8", "uint8")):
        if hasattr(trt.DataType, attr):
            names[getattr(trt.DataType, attr)] = name
    out = {"input": {}, "output": {}}
    for i in range(engine.num_io_tensors):
        n = engine.get_tensor_name(i)
        io = "input" if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT else "output"
        out[io][n] = names.get(engine.get_tensor_dtype(n), str(engine.get_tensor_dtype(n)))
    return out


def binding_problems(model, have: dict) -> list[str]:
    """Where the plan's bindings and the config disagree, in the words of Triton's TensorRT backend."""
    out = []
    for io, tensors in (("input", model.inputs), ("output", model.outputs)):
        for t in tensors:
            got = have.get(io, {}).get(t["name"])
            if got is None:
                out.append(f"the plan has no {io} '{t['name']}'")
            elif TRITON_TYPES.get(got) != t.get("data_type"):
                out.append(f"unexpected datatype {TRITON_TYPES.get(got, got)} for inference {io} "
                           f"'{t['name']}', expecting {t.get('data_type')}")
    return out


def check_plan(model, plan: str) -> list[str]:
    """The built plan's bindings against the config, before Triton loads it: read from the plan
    where TensorRT's Python module is installed, else from what the build asked (its key record)."""
    have = plan_io(plan)
    if have is None:
        have = (_old_key(plan) or {}).get("io")
        if not isinstance(have, dict):
            return ["the plan has no record of its I/O types (built before they were checked)"]
    return binding_problems(model, have)


def cache_key(build, model, args: list[str], gpu: str, trt: str, driver: str = "unknown") -> dict:
    flags = [a for a in args if not a.startswith(("--onnx=", "--saveEngine=", "--calib="))]
    return {"onnx_sha256": _sha_file(build.onnx), "flags": flags, "gpu": gpu, "tensorrt": trt, "driver": driver,
            "calibration_sha256": _sha_file(build.calibration_cache) if build.calibration_cache else None}


def key_path(plan: str) -> str:
    return plan + ".key.json"


def _old_key(plan: str) -> dict | None:
    try:
        with open(key_path(plan)) as f:
            old = json.load(f)
        return old if isinstance(old, dict) else None
    except (FileNotFoundError, ValueError):
        return None


def stale(plan: str, key: dict) -> list[str]:
    """Why the plan at `plan` is not the one `key` builds ([] when it is)."""
    old = _old_key(plan)
    if not os.path.isfile(plan):
        return ["no plan yet"]
    if old is None or not isinstance(old.get("key"), dict):
        return ["no cache key beside the plan"]
    return [k for k in key if old["key"].get(k) != key[k]]


def plan_status(t, model, backends=None, cmd: Command | None = None) -> list[str]:
    """What makes the model's built plan stale: the key's parts that changed (ONNX or calibration
    sha256, flags, GPU, driver, TensorRT) and bindings that disagree with the config. Raises
    UnsupportedError where no trtexec can run."""
    from hkgpu_tune.serve.schema.config import model_filename
    plan = os.path.join(t.model_repository, model.name, str(model.version), model_filename(model))
    run = runner(t, model.build, plan, cmd)
    gpu = getattr(t, "mig", None) or t.gpu
    key = cache_key(model.build, model, trtexec_args(model.build, plan, model), gpu_name(backends, gpu),
                    run.version, driver_version(backends))
    why = stale(plan, key)
    if why == ["no plan yet"]:
        return why
    out = [f"plan is stale: {', '.join(why)} changed" if why and why[0] in key else why[0]] if why else []
    if not out:
        out += check_plan(model, plan)
    return out


def build_plan(build, plan: str, model, backends=None, cmd: Command | None = None, gpu: int | str | None = 0,
               force: bool = False, t=None) -> BuildResult:
    """Build `plan` from build.onnx unless the key beside it matches. Raises UnsupportedError without
    trtexec, ApplyError when trtexec fails or the plan's bindings do not match the config."""
    cmd = cmd or Command()
    try:
        run = runner(t, build, plan, cmd)
    except UnsupportedError as e:
        raise UnsupportedError(f"{model.name}: {e}") from None
    args = trtexec_args(build, plan, model)
    key = cache_key(build, model, args, gpu_name(backends, gpu), run.version, driver_version(backends))
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    why = stale(plan, key)
    if not force and not why:
        return BuildResult(model.name, plan, False, "cache key matches", digest)
    reason = "forced" if force and not why else why[0] if why[0] not in key else "changed: " + ", ".join(why)
    os.makedirs(os.path.dirname(plan) or ".", exist_ok=True)
    tmp = plan + ".building"
    t0 = time.monotonic()
    r = cmd.run(run.argv + trtexec_args(build, tmp, model), timeout=3600)
    if r.rc != 0 or not os.path.isfile(tmp):
        tail = "\n".join((r.out + r.err).strip().splitlines()[-8:])
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise ApplyError(f"{model.name}: trtexec failed (exit {r.rc}, {run.where}):\n{tail}")
    got = plan_io(tmp)
    bad = binding_problems(model, got) if got is not None else []
    if bad:
        os.unlink(tmp)
        raise ApplyError(f"{model.name}: the built plan does not match the config: {'; '.join(bad)}")
    os.replace(tmp, plan)
    atomic_write(key_path(plan), json.dumps({"key": key, "digest": digest, "built": time.time(),
                                             "io": got or asked_io(model), "where": run.where}, indent=1))
    return BuildResult(model.name, plan, True, reason, digest, round(time.monotonic() - t0, 2))


def build_model(t, model, backends=None, force: bool = False) -> BuildResult:
    """build_plan into the model repository; without trtexec a result that says it was skipped."""
    from hkgpu_tune.serve.schema.config import model_filename
    plan = os.path.join(t.model_repository, model.name, str(model.version), model_filename(model))
    try:
        return build_plan(model.build, plan, model, backends, gpu=getattr(t, "mig", None) or t.gpu, force=force, t=t)
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
