"""The Triton inference service: the `triton:` profile section and its verify/apply.

Profile (every key but models optional; addresses default to loopback)::

    triton:
      server: pytriton            # or the path of a tritonserver binary
      launch: binary              # binary | container
      model_repository: /var/lib/hkgpu-triton/models
      user: triton-server         # the default; root only when named here
      gpu: 0                      # or a set: [4, 5, 6, 7] (one service per GPU or per set)
      http: {port: 8000, address: 127.0.0.1}
      models:
        - name: doubler
          backend: python
          model_file: models/doubler.py
          max_batch_size: 16
          inputs:  [{name: INPUT0, data_type: FP32, dims: [4]}]
          outputs: [{name: OUTPUT0, data_type: FP32, dims: [4]}]
          dynamic_batching: {max_queue_delay_microseconds: 2000}
          instance_group: [{count: 1, kind: KIND_CPU}]
      gate: {ready_timeout_s: 120, warmup_requests: 5, load: {requests: 200, concurrency: 8}, p99_ms: 50}
      services:                   # optional: several servers, each a unit and the keys it changes
        - {unit: hkgpu-triton-gpu0, gpu: 0}
        - {unit: hkgpu-triton-gpu1, gpu: 1, http: {port: 8010}, grpc: {port: 8011}, metrics: {port: 8012}}
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.serve.schema.devices import gpu_set, is_mig, remap_gpus
from hkgpu_tune.serve.schema.connections import OPTIONS as CONNECTION_OPTIONS, Connections, parse as parse_connections
from hkgpu_tune.serve.schema.gate_spec import Gate, parse as _gate

NAME_RE = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}"
USER_RE = r"[a-z_][a-z0-9_-]{0,31}"
UNIT_RE = r"[A-Za-z0-9][A-Za-z0-9:_.@-]{0,200}"   # systemd unit characters; never . or ..
SIZE_RE = r"[0-9]+[kKmMgG]?"
LAUNCH_FORMS = ("binary", "container")   # each a running.form_base.Form (a test holds the two together)
# tritonserver options the launcher sets from the profile (an extra_args copy would override them)
PROFILE_OPTIONS = {"--model-repository": "model_repository", "--http-port": "http.port", "--grpc-port": "grpc.port",
                   "--metrics-port": "metrics.port", "--http-address": "http.address",
                   "--grpc-address": "grpc.address", "--metrics-address": "metrics.address",
                   "--exit-timeout-secs": "gate.stop_timeout_s", "--model-control-mode": "models",
                   "--load-model": "models", **{o: f"connections.{k}" for k, o in CONNECTION_OPTIONS.items()}}


@dataclass(frozen=True)
class Endpoint:
    port: int
    address: str = "127.0.0.1"

    @property
    def host(self) -> str:
        """Where a client on this host connects (a wildcard bind is reached on loopback)."""
        return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.address, self.address)


WEIGHT_FORMATS = ("state_dict", "torchscript", "export")   # torch_model.WEIGHT_FORMATS (a copy: that file stands alone)


@dataclass(frozen=True)
class Weights:
    """Trained weights for the torch engine: a file checked by its sha256 (pinned by the profile)."""
    file: str
    sha256: str
    format: str = "state_dict"     # state_dict (for the torchvision architecture) | torchscript | export

    @property
    def served_name(self) -> str:
        """Its name in the model's version directory."""
        return "weights.pt2" if self.format == "export" else "weights.pt"


@dataclass(frozen=True)
class Build:
    """How the served engine is made: ONNX -> TensorRT plan with trtexec, or (no TensorRT) a
    torchvision model run by torch in fp16 with CUDA graphs, served by the hkbatch backend (a batch
    gathered in C++, one Python call per batch) where it can be built, else the Python backend."""
    onnx: str | None = None
    fp16: bool = True
    int8: bool = False
    calibration_cache: str | None = None
    min_batch: int = 1
    opt_batch: int | None = None
    max_batch: int | None = None
    workspace_mib: int | None = None
    torchvision: str | None = None     # the torch engine's model (random weights unless `weights`)
    weights: Weights | None = None
    engine: str = "auto"               # auto | tensorrt | torch
    backend: str = "auto"              # the torch engine's Triton backend: auto | hkbatch | python
    cuda_graphs: bool = True
    channels_last: bool = True
    image_size: int = 224


@dataclass(frozen=True)
class Model:
    name: str
    config: dict                  # ModelConfig fields in Triton's names (what the profile set)
    model_file: str | None = None  # model.py / model.onnx / model.plan to put in version 1
    build: Build | None = None
    version: int = 1
    line: int = 0
    engine: str = ""               # tensorrt | torch | "" (the model is served as given)
    engine_reason: str = ""
    # where each config field came from in the profile, for the schema check at plan time
    nodes: dict = field(default_factory=dict, compare=False, repr=False)
    item: object = field(default=None, compare=False, repr=False)

    @property
    def backend(self) -> str:
        return self.config.get("backend") or self.config.get("platform", "")

    @property
    def max_batch_size(self) -> int:
        return int(self.config.get("max_batch_size", 0))

    @property
    def inputs(self) -> list[dict]:
        return self.config.get("input", [])

    @property
    def outputs(self) -> list[dict]:
        return self.config.get("output", [])


@dataclass(frozen=True)
class MpsDirs:
    """The MPS daemon's pipe and log directories, its unit and the GPUs it serves (the profile's
    mps section; gpus None: all): an MPS client's CUDA_VISIBLE_DEVICES counts among the daemon's."""
    pipe_dir: str
    log_dir: str
    unit: str = "nvidia-mps.service"
    gpus: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Triton:
    models: tuple[Model, ...]
    server: str = "pytriton"
    launch: str = "binary"                 # binary | container
    supervisor: str = "auto"               # auto | systemd | process
    runtime: str = "docker"                # container runtime: docker | podman
    image: str | None = None
    model_repository: str = "/var/lib/hkgpu-triton/models"
    run_dir: str = "/run/hkgpu-tune/triton"
    unit: str = "hkgpu-triton"
    user: str | None = None
    gpu: int | None = 0                    # the first GPU of gpus (placement, MPS, the plan's key)
    gpus: tuple[int | str, ...] | None = (0,)   # the GPUs the server sees (None: all), by NVML index,
                                               # or one MIG device UUID (serve/schema/devices.py)
    http: Endpoint = Endpoint(8000)
    grpc: Endpoint = Endpoint(8001)
    metrics: Endpoint = Endpoint(8002)
    shm_size: str = "1g"
    python_stub: str | None = None         # 3.11: which Python backend stub of the wheel (default: this Python)
    extra_args: tuple[str, ...] = ()
    gate: Gate = field(default_factory=Gate)
    connections: Connections = field(default_factory=Connections)   # serve/schema/connections.py
    profile_dir: str = "."
    line: int = 0
    mps: MpsDirs | None = None             # set by section() when the profile runs MPS

    @property
    def mig(self) -> str | None:
        """The MIG device UUID the server sees alone (gpu: MIG-...), else None; gpu is then None."""
        return self.gpus[0] if self.gpus and is_mig(self.gpus[0]) else None

    def model(self, name: str) -> Model:
        for m in self.models:
            if m.name == name:
                return m
        raise HkError(f"triton: no model {name!r} in the profile (have: {', '.join(m.name for m in self.models)})")


# ---------------------------------------------------------------- profile section
TOP_KEYS = ("server", "launch", "supervisor", "runtime", "image", "model_repository", "run_dir", "unit", "user",
            "gpu", "http", "grpc", "metrics", "shm_size", "python_stub", "extra_args", "models", "gate",
            "connections")
MODEL_KEYS = ("name", "platform", "backend", "max_batch_size", "inputs", "outputs", "dynamic_batching",
              "instance_group", "model_warmup", "model_file", "build", "version", "config")
# profile key -> ModelConfig field
RENAMED = {"inputs": "input", "outputs": "output"}


def _path(n, base: str) -> str:   # normalised: '/x', '/x/', '//x' are one directory, never two services'
    v = os.path.normpath(os.path.join(base, n.string(what="a path")))   # join keeps an absolute path
    return "/" + v.lstrip("/")


def _endpoint(n, default_port: int) -> Endpoint:
    m = n.mapping(("port", "address"))
    port = m["port"].integer(1, 65535) if "port" in m else default_port
    addr = m["address"].address() if "address" in m else "127.0.0.1"
    return Endpoint(port, addr)


def _plain(n, key: str = ""):
    """A YAML node as plain data, Triton's enum spellings filled in ('FP32' -> 'TYPE_FP32')."""
    import yaml
    if isinstance(n.node, yaml.MappingNode):
        return {k: _plain(v, k) for k, v in n.mapping().items()}
    if isinstance(n.node, yaml.SequenceNode):
        return [_plain(v, key) for v in n.items()]
    v = n.value()
    if key == "data_type" and isinstance(v, str) and not v.startswith("TYPE_"):
        v = "TYPE_" + v.upper()
    if key == "kind" and isinstance(v, str) and not v.startswith("KIND_"):
        v = "KIND_" + v.upper()
    return v


def _build(n, base: str) -> Build:
    m = n.mapping(("onnx", "fp16", "int8", "calibration_cache", "min_batch", "opt_batch", "max_batch",
                   "workspace_mib", "torchvision", "engine", "backend", "cuda_graphs", "channels_last", "image_size",
                   "weights"))
    weights = _weights(m["weights"], base) if "weights" in m else None
    if "onnx" not in m and "torchvision" not in m and weights is None:
        raise n.error("give 'onnx' (built into a TensorRT plan) or 'torchvision' (the torch engine), or both")
    if weights and weights.format == "state_dict" and "torchvision" not in m:
        raise m["weights"].error("state_dict weights need 'torchvision' (the architecture they are for)")
    b = Build(
        onnx=_path(m["onnx"], base) if "onnx" in m else None,
        fp16=m["fp16"].boolean() if "fp16" in m else True,
        int8=m["int8"].boolean() if "int8" in m else False,
        calibration_cache=_path(m["calibration_cache"], base) if "calibration_cache" in m else None,
        min_batch=m["min_batch"].integer(1, 1 << 16) if "min_batch" in m else 1,
        opt_batch=m["opt_batch"].integer(1, 1 << 16) if "opt_batch" in m else None,
        max_batch=m["max_batch"].integer(1, 1 << 16) if "max_batch" in m else None,
        workspace_mib=m["workspace_mib"].integer(1, 1 << 20) if "workspace_mib" in m else None,
        torchvision=m["torchvision"].string(r"[a-z][a-z0-9_]{0,63}", "a torchvision model name, e.g. resnet50")
        if "torchvision" in m else None,
        engine=m["engine"].choice(("auto", "tensorrt", "torch")) if "engine" in m else "auto",
        backend=m["backend"].choice(("auto", "hkbatch", "python")) if "backend" in m else "auto",
        cuda_graphs=m["cuda_graphs"].boolean() if "cuda_graphs" in m else True,
        channels_last=m["channels_last"].boolean() if "channels_last" in m else True,
        image_size=m["image_size"].integer(16, 4096) if "image_size" in m else 224,
        weights=weights,
    )
    if weights and b.engine == "tensorrt":
        raise m["weights"].error("weights are for the torch engine (engine: tensorrt builds from the ONNX)")
    if b.int8 and not b.calibration_cache:
        raise m["int8"].error("int8 needs a calibration_cache (the file trtexec --calib reads)")
    if b.engine == "tensorrt" and not b.onnx:
        raise m["engine"].error("engine tensorrt needs 'onnx' (the network trtexec builds from)")
    if b.engine == "torch" and not b.torchvision and not weights:
        raise m["engine"].error("engine torch needs 'torchvision' (the model torch runs)")
    if b.onnx and not os.path.isfile(b.onnx):
        raise m["onnx"].error(f"no such file: {b.onnx}")
    return b


def _sha256(path: str) -> str:
    import hashlib
    from hkgpu_tune.core import fsutil
    h = hashlib.sha256()
    with fsutil.open_regular(path, "build.weights.file") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _weights(n, base: str) -> Weights:
    """build.weights: {file, sha256, format}; the file must be a regular file with that sha256 (a
    file changed since the profile pinned it is refused here, before anything is written)."""
    m = n.mapping(("file", "sha256", "format"), required=("file", "sha256"))
    w = Weights(_path(m["file"], base), m["sha256"].string(r"[0-9a-fA-F]{64}", "a sha256 (64 hex digits)").lower(),
                m["format"].choice(WEIGHT_FORMATS) if "format" in m else "state_dict")
    try:
        sha = _sha256(w.file)
    except HkError as e:
        raise m["file"].error(str(e).removeprefix("build.weights.file: ")) from None
    except OSError as e:
        raise m["file"].error(f"{w.file}: cannot read: {e.strerror}") from None
    if sha != w.sha256:
        raise m["sha256"].error(f"{w.file} has sha256 {sha}, not the {w.sha256} given here "
                                f"(the file changed, or the profile names the wrong one)")
    return w


# the model file the torch engine copies (serve/repository/torch_model.py: read by path, never imported here)
TORCH_MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "repository", "torch_model.py")


def choose_engine(build: Build, trtexec: str | None, container: bool = False) -> tuple[str, str]:
    """(tensorrt | torch, why): TensorRT where it exists and an ONNX is given, else torch (a stand-in
    for where TensorRT is absent). The container form runs NVIDIA's image, whose TensorRT builds and
    serves the plan: native first."""
    if build.engine == "tensorrt":
        return "tensorrt", "asked for (engine: tensorrt)"
    if build.engine == "torch":
        return "torch", "asked for (engine: torch)"
    if build.onnx and container:
        return "tensorrt", "the container form: the image's trtexec builds the plan its TensorRT backend serves"
    if build.onnx and trtexec:
        return "tensorrt", f"trtexec found at {trtexec}"
    if build.torchvision or build.weights:
        return "torch", "trtexec not found" if build.onnx else "no onnx to build a TensorRT plan from"
    return "tensorrt", "no torchvision model for the torch engine"


CONTAINER_NO_HKBATCH = "the container form runs the image's Python; hkbatch embeds this host's"


def choose_backend(build: Build, container: bool = False) -> tuple[str, str]:
    """(hkbatch | python, why) for the torch engine: hkbatch where it can be built and embed Python."""
    from hkgpu_tune.serve.repository import batch_backend
    if build.backend != "auto":
        return build.backend, f"asked for (backend: {build.backend})"
    if container:
        return "python", CONTAINER_NO_HKBATCH
    ok, why = batch_backend.available()
    return ("hkbatch", why) if ok else ("python", f"hkbatch unavailable: {why}")


def _trtexec() -> str | None:   # as tensorrt.trtexec_path (no import: a cycle), with the trust rule
    from hkgpu_tune.core.fsutil import program_refusal as no
    return next((p for p in (shutil.which("trtexec"), "/usr/src/tensorrt/bin/trtexec", "/opt/tensorrt/bin/trtexec")
                 if p and os.access(p, os.X_OK) and not no(p)), None)


def _torch_config(config: dict, b: Build, backend: str) -> dict:
    """The config of a torch-engine model: its backend, the engine's settings as parameters."""
    out = {k: v for k, v in config.items() if k not in ("platform", "backend")}
    out["backend"] = backend
    params = dict(out.get("parameters", {}))
    if b.weights:   # the profile's say over any copy in config: parameters
        params.update({k: {"string_value": v} for k, v in (
            ("weights_file", b.weights.served_name), ("weights_format", b.weights.format),
            ("weights_sha256", b.weights.sha256))})
    for k, v in (("torchvision", b.torchvision or ""), ("fp16", str(b.fp16).lower()),
                 ("channels_last", str(b.channels_last).lower()), ("cuda_graphs", str(b.cuda_graphs).lower()),
                 ("image_size", str(b.image_size))):
        params.setdefault(k, {"string_value": v})
    out["parameters"] = params
    return out


# Triton data type -> trtexec I/O type (trtexec's help: type ::= "fp32"|"fp16"|"bf16"|"int32"|
# "int64"|"int8"|"uint8"|"bool"|"fp8"); the format "chw" is linear, for a tensor of any rank
IO_TYPES = {"TYPE_FP32": "fp32", "TYPE_FP16": "fp16", "TYPE_BF16": "bf16", "TYPE_INT32": "int32",
            "TYPE_INT64": "int64", "TYPE_INT8": "int8", "TYPE_UINT8": "uint8", "TYPE_BOOL": "bool"}
TRITON_TYPES = {v: k for k, v in IO_TYPES.items()}


def io_problem(tensor: dict, build) -> str | None:
    """Why a config input/output cannot be a TensorRT plan binding of this build, or None."""
    dt = tensor.get("data_type", "")
    if dt not in IO_TYPES:
        return (f"{dt or 'no data_type'} cannot be a TensorRT plan's I/O type "
                f"(one of {', '.join(t[5:] for t in IO_TYPES)})")
    if dt == "TYPE_INT8" and not build.int8:
        return "INT8 I/O needs an INT8 build (build.int8: true with a calibration_cache)"
    return None


def _check_plan_io(config: dict, nodes: dict, build: Build, item) -> None:
    """Each input/output type must be one a TensorRT plan binding can have (the build asks trtexec
    for it): refused at its data_type's line otherwise."""
    for key in ("input", "output"):
        for i, tensor in enumerate(config.get(key, [])):
            why = io_problem(tensor, build)
            if why:
                node = item
                try:
                    node = nodes[(key,)].items()[i]
                    node = node.mapping().get("data_type", node)
                except (KeyError, IndexError, AttributeError):
                    pass
                raise node.error(f"{key} {tensor.get('name')!r}: {why}")


def _model(item, base: str, container: bool = False, visible=(0,)) -> Model:
    m = item.mapping(MODEL_KEYS, required=("name",))
    name = m["name"].string(NAME_RE, "a model name (letters, digits, '_', '.', '-')")
    if ("platform" in m) == ("backend" in m):
        raise item.error("give exactly one of 'platform' (tensorrt_plan, onnxruntime_onnx, ...) or 'backend' (python, ...)")
    config, nodes = {"name": name}, {("name",): m["name"]}
    for key, node in m.items():
        if key in ("name", "model_file", "build", "version", "config"):
            continue
        field_name = RENAMED.get(key, key)
        config[field_name] = _plain(node, field_name)
        nodes[(field_name,)] = node
    if "config" in m:  # any other ModelConfig field, passed through and checked against the schema
        for key, node in m["config"].mapping().items():
            if key in config:
                raise node.error(f"'{key}' is set twice (also outside config:)")
            config[key] = _plain(node, key)
            nodes[(key,)] = node
    remap_gpus(config, nodes, visible, item)
    build = _build(m["build"], base) if "build" in m else None
    engine, why = choose_engine(build, _trtexec(), container) if build else ("", "")
    if engine == "torch":
        if "model_file" in m:
            raise m["model_file"].error("the torch engine brings its own model.py: drop model_file or build")
        if container and build.backend == "hkbatch":
            raise m["build"].mapping()["backend"].error(f"backend hkbatch: {CONTAINER_NO_HKBATCH} (use python)")
        backend, backend_why = choose_backend(build, container)
        why = f"{why}; served by {backend}: {backend_why}"
        config = _torch_config(config, build, backend)
    if engine == "tensorrt":
        _check_plan_io(config, nodes, build, item)
    model_file = TORCH_MODEL if engine == "torch" else None
    if "model_file" in m:
        model_file = _path(m["model_file"], base)
        if not os.path.isfile(model_file):
            raise m["model_file"].error(f"no such file: {model_file}")
    backend = config.get("backend") or config.get("platform")
    if container and backend == "hkbatch" and "backend" in m:
        raise m["backend"].error(f"backend hkbatch: {CONTAINER_NO_HKBATCH} (use python)")
    if backend in ("python", "hkbatch") and not model_file:
        raise item.error(f"a {backend}-backend model needs 'model_file' (its model.py)")
    if backend not in ("python", "hkbatch") and not model_file and not build:
        raise item.error(f"platform {backend}: give 'model_file' (the model to serve) or 'build' (an ONNX to build)")
    return Model(name, config, model_file, build, m["version"].integer(1, 1 << 30) if "version" in m else 1,
                 item.line, engine, why, nodes, item)


class Services(tuple):
    """Several Triton services of one profile (triton.services, parsed in serve/schema/services.py), in profile order."""


def parse_one(node, m: dict, base: str, defaults: dict | None = None) -> Triton:
    """One service from its keys (a mapping's nodes, or a service's merged over the section's)."""
    kw = {"profile_dir": base, "line": node.line, **(defaults or {})}
    if "connections" in m:
        kw["connections"] = parse_connections(m["connections"])
    if "server" in m:
        s = m["server"].string(what="'pytriton' or the path of a tritonserver binary")
        kw["server"] = s if s == "pytriton" else _path(m["server"], base)
    for key, opts in (("launch", LAUNCH_FORMS), ("supervisor", ("auto", "systemd", "process")),
                      ("runtime", ("docker", "podman"))):
        if key in m:
            kw[key] = m[key].choice(opts)
    if "image" in m:
        kw["image"] = m["image"].string(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*", "a container image reference")
    if kw.get("launch") == "container" and "image" not in kw:
        raise m["launch"].error("the container form needs 'image' (a Triton server image)")
    for key in ("model_repository", "run_dir"):
        if key in m:
            kw[key] = _path(m[key], base)
    if "unit" in m:
        kw["unit"] = m["unit"].string(UNIT_RE, "a systemd unit name")
    if "user" in m:
        kw["user"] = m["user"].string(USER_RE, "a user name")
    if "gpu" in m:
        kw["gpus"] = gpu_set(m["gpu"])
        kw["gpu"] = kw["gpus"][0] if kw["gpus"] and not is_mig(kw["gpus"][0]) else None
    ports = {"http": 8000, "grpc": 8001, "metrics": 8002}
    for key, port in ports.items():
        if key in m:
            kw[key] = _endpoint(m[key], port)
    used = {}
    for key in ports:
        ep = kw.get(key) or Endpoint(ports[key])
        if ep.port in used:
            raise (m[key] if key in m else node).error(f"port {ep.port} is also the {used[ep.port]} port")
        used[ep.port] = key
    if "shm_size" in m:
        kw["shm_size"] = m["shm_size"].string(SIZE_RE, "a size such as 1g or 512m")
    if "python_stub" in m:
        kw["python_stub"] = m["python_stub"].string(r"3\.\d+", "a Python version such as 3.11")
    if "extra_args" in m:
        args = []
        for i in m["extra_args"].items():
            arg = i.string(r"--[a-z][a-z0-9-]*(=.*)?", "a tritonserver option like --log-verbose=1")
            option = arg.partition("=")[0]
            if option in PROFILE_OPTIONS:
                raise i.error(f"{option} is set from the profile: use triton.{PROFILE_OPTIONS[option]}")
            args.append(arg)
        kw["extra_args"] = tuple(args)
    models, seen = [], {}
    for item in m["models"].items():
        mod = _model(item, base, container=kw.get("launch") == "container", visible=kw.get("gpus", (0,)))
        if mod.name in seen:
            raise item.error(f"model {mod.name!r} is defined twice (first at line {seen[mod.name]})")
        seen[mod.name] = item.line
        models.append(mod)
    if not models:
        raise m["models"].error("expected at least one model")
    if "gate" in m:
        kw["gate"] = _gate(m["gate"])
    return Triton(models=tuple(models), **kw)


def each(section) -> tuple:
    """The parsed triton section as its services: none, one, or triton.services' (no mps join)."""
    if section is None:
        return ()
    return tuple(section) if isinstance(section, Services) else (section,)


def services(profile) -> tuple[Triton, ...]:
    """Every Triton service of the profile (one, or triton.services), each joined with the mps section."""
    return tuple(_with_mps(x, profile) for x in each(profile.section("triton")))


def section(profile, unit: str | None = None) -> Triton | None:
    """The profile's Triton service (None: no triton section); with several, the one whose unit
    is named (none named: an error listing them)."""
    every = services(profile)
    if not every:
        return None
    if unit is None and len(every) == 1:
        return every[0]
    have = ", ".join(t.unit for t in every)
    if unit is None:
        raise HkError(f"the profile has {len(every)} triton services ({have}): name one with --unit")
    for t in every:
        if t.unit == unit:
            return t
    raise HkError(f"the profile has no triton service with unit {unit!r} (have: {have})")


def _with_mps(t: Triton, profile) -> Triton:
    """With MPS enabled, the server is an MPS client (its pipe and log directories in its
    environment, unit and container)."""
    mps = profile.section("mps")
    if mps is not None and mps.enabled:
        gpus = tuple(mps.gpus) if mps.gpus is not None else None
        if t.mig and gpus is None:
            raise HkError(f"triton.gpu {t.mig}: an MPS daemon serves a MIG device named in mps.gpus "
                          f"([{t.mig}]), not all GPUs; Triton, its client, sees only those")
        if gpus is not None and t.gpus is not None and not set(t.gpus) <= set(gpus):
            raise HkError(f"triton.gpu {list(t.gpus)}: GPU {min(set(t.gpus) - set(gpus))} is not one the MPS "
                          f"daemon serves (mps.gpus: {list(gpus)}); Triton, its client, sees only those")
        t = replace(t, mps=MpsDirs(mps.pipe_dir, mps.log_dir, mps.unit, gpus))
    return t


# ---------------------------------------------------------------- verify / apply
def engine_facts(m: Model) -> dict:
    """Which engine a built model runs and why; what it needs that this host lacks."""
    import importlib.util
    out = {"engine": m.engine, "why": m.engine_reason}
    if m.engine == "torch":
        w = m.build.weights
        out["detail"] = (f"{m.build.torchvision or w.format}"
                         f"{f' (weights sha256 {w.sha256[:12]})' if w else ' (random weights)'}, "
                         f"{'fp16' if m.build.fp16 else 'fp32'}"
                         f"{', channels_last' if m.build.channels_last else ''}"
                         f"{', CUDA graphs' if m.build.cuda_graphs else ''}")
        missing = [p for p in ("torch", "torchvision") if importlib.util.find_spec(p) is None]
        if missing:
            out["missing"] = f"the torch engine needs {' and '.join(missing)}, not installed"
    return out


# the file name Triton looks for in a version directory, per backend or platform
DEFAULT_FILE = {
    "python": "model.py", "hkbatch": "model.py",
    "onnxruntime_onnx": "model.onnx", "onnxruntime": "model.onnx",
    "tensorrt_plan": "model.plan", "tensorrt": "model.plan",
    "pytorch_libtorch": "model.pt", "pytorch": "model.pt",
    "tensorflow_savedmodel": "model.savedmodel", "openvino": "model.xml",
}


def model_filename(model) -> str:
    name = DEFAULT_FILE.get(model.backend)
    if name:
        return name
    return os.path.basename(model.model_file) if model.model_file else "model"
