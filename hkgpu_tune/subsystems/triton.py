"""The Triton inference service: the `triton:` profile section and its verify/apply.

Profile (every key but models optional; addresses default to loopback)::

    triton:
      server: pytriton            # or the path of a tritonserver binary
      launch: binary              # binary | container
      model_repository: /var/lib/hkgpu-triton/models
      user: triton-server         # never root
      gpu: 0
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
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace

from hkgpu_tune.core.errors import ApplyError, HkError
from hkgpu_tune.core.report import DRIFT, ERROR, OK, UNSUPPORTED
from hkgpu_tune.subsystems.base import Subsystem

NAME_RE = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}"
USER_RE = r"[a-z_][a-z0-9_-]{0,31}"
SIZE_RE = r"[0-9]+[kKmMgG]?"
# tritonserver options the launcher sets from the profile (an extra_args copy would override them)
PROFILE_OPTIONS = {"--model-repository": "model_repository", "--http-port": "http.port", "--grpc-port": "grpc.port",
                   "--metrics-port": "metrics.port", "--http-address": "http.address",
                   "--grpc-address": "grpc.address", "--metrics-address": "metrics.address",
                   "--exit-timeout-secs": "gate.stop_timeout_s", "--model-control-mode": "models",
                   "--load-model": "models"}


@dataclass(frozen=True)
class Endpoint:
    port: int
    address: str = "127.0.0.1"

    @property
    def host(self) -> str:
        """Where a client on this host connects (a wildcard bind is reached on loopback)."""
        return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.address, self.address)


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
    torchvision: str | None = None     # the torch engine's model (random weights)
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
    """The MPS daemon's pipe and log directories (from the profile's mps section)."""
    pipe_dir: str
    log_dir: str


@dataclass(frozen=True)
class Gate:
    ready_timeout_s: float = 120.0
    warmup_requests: int = 5
    requests: int = 200
    concurrency: int = 8
    p99_ms: float | None = None    # None: measure, do not gate
    stop_timeout_s: float = 30.0
    processes: int | None = None   # the load generator's processes (None: one per 8 in flight)


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
    gpu: int | None = 0
    http: Endpoint = Endpoint(8000)
    grpc: Endpoint = Endpoint(8001)
    metrics: Endpoint = Endpoint(8002)
    shm_size: str = "1g"
    python_stub: str | None = None         # 3.11: which Python backend stub of the wheel (default: this Python)
    extra_args: tuple[str, ...] = ()
    gate: Gate = field(default_factory=Gate)
    profile_dir: str = "."
    line: int = 0
    mps: MpsDirs | None = None             # set by section() when the profile runs MPS

    def model(self, name: str) -> Model:
        for m in self.models:
            if m.name == name:
                return m
        raise HkError(f"triton: no model {name!r} in the profile (have: {', '.join(m.name for m in self.models)})")


# ---------------------------------------------------------------- profile section
TOP_KEYS = ("server", "launch", "supervisor", "runtime", "image", "model_repository", "run_dir", "unit", "user",
            "gpu", "http", "grpc", "metrics", "shm_size", "python_stub", "extra_args", "models", "gate")
MODEL_KEYS = ("name", "platform", "backend", "max_batch_size", "inputs", "outputs", "dynamic_batching",
              "instance_group", "model_warmup", "model_file", "build", "version", "config")
# profile key -> ModelConfig field
RENAMED = {"inputs": "input", "outputs": "output"}


def _path(n, base: str) -> str:
    v = n.string(what="a path")
    return v if os.path.isabs(v) else os.path.normpath(os.path.join(base, v))


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
                   "workspace_mib", "torchvision", "engine", "backend", "cuda_graphs", "channels_last", "image_size"))
    if "onnx" not in m and "torchvision" not in m:
        raise n.error("give 'onnx' (built into a TensorRT plan) or 'torchvision' (the torch engine), or both")
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
    )
    if b.int8 and not b.calibration_cache:
        raise m["int8"].error("int8 needs a calibration_cache (the file trtexec --calib reads)")
    if b.engine == "tensorrt" and not b.onnx:
        raise m["engine"].error("engine tensorrt needs 'onnx' (the network trtexec builds from)")
    if b.engine == "torch" and not b.torchvision:
        raise m["engine"].error("engine torch needs 'torchvision' (the model torch runs)")
    if b.onnx and not os.path.isfile(b.onnx):
        raise m["onnx"].error(f"no such file: {b.onnx}")
    return b


TORCH_MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "triton", "torch_model.py")


def choose_engine(build: Build, trtexec: str | None) -> tuple[str, str]:
    """(tensorrt | torch, why): TensorRT where it exists and an ONNX is given, else torch."""
    if build.engine == "tensorrt":
        return "tensorrt", "asked for (engine: tensorrt)"
    if build.engine == "torch":
        return "torch", "asked for (engine: torch)"
    if build.onnx and trtexec:
        return "tensorrt", f"trtexec found at {trtexec}"
    if build.torchvision:
        return "torch", "trtexec not found" if build.onnx else "no onnx to build a TensorRT plan from"
    return "tensorrt", "no torchvision model for the torch engine"


CONTAINER_NO_HKBATCH = "the container form runs the image's Python; hkbatch embeds this host's"


def choose_backend(build: Build, container: bool = False) -> tuple[str, str]:
    """(hkbatch | python, why) for the torch engine: hkbatch where it can be built and embed Python."""
    from hkgpu_tune.serve import batch_backend
    if build.backend != "auto":
        return build.backend, f"asked for (backend: {build.backend})"
    if container:
        return "python", CONTAINER_NO_HKBATCH
    ok, why = batch_backend.available()
    return ("hkbatch", why) if ok else ("python", f"hkbatch unavailable: {why}")


def _trtexec() -> str | None:
    return shutil.which("trtexec") or next(
        (p for p in ("/usr/src/tensorrt/bin/trtexec", "/opt/tensorrt/bin/trtexec") if os.access(p, os.X_OK)), None)


def _torch_config(config: dict, b: Build, backend: str) -> dict:
    """The config of a torch-engine model: its backend, the engine's settings as parameters."""
    out = {k: v for k, v in config.items() if k not in ("platform", "backend")}
    out["backend"] = backend
    params = dict(out.get("parameters", {}))
    for k, v in (("torchvision", b.torchvision), ("fp16", str(b.fp16).lower()),
                 ("channels_last", str(b.channels_last).lower()), ("cuda_graphs", str(b.cuda_graphs).lower()),
                 ("image_size", str(b.image_size))):
        params.setdefault(k, {"string_value": v})
    out["parameters"] = params
    return out


def _model(item, base: str, container: bool = False) -> Model:
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
    build = _build(m["build"], base) if "build" in m else None
    engine, why = choose_engine(build, _trtexec()) if build else ("", "")
    if engine == "torch":
        if "model_file" in m:
            raise m["model_file"].error("the torch engine brings its own model.py: drop model_file or build")
        if container and build.backend == "hkbatch":
            raise m["build"].mapping()["backend"].error(f"backend hkbatch: {CONTAINER_NO_HKBATCH} (use python)")
        backend, backend_why = choose_backend(build, container)
        why = f"{why}; served by {backend}: {backend_why}"
        config = _torch_config(config, build, backend)
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


def _gate(n) -> Gate:
    m = n.mapping(("ready_timeout_s", "warmup_requests", "load", "p99_ms", "stop_timeout_s"))
    kw = {}
    if "ready_timeout_s" in m:
        kw["ready_timeout_s"] = float(m["ready_timeout_s"].integer(1, 3600))
    if "stop_timeout_s" in m:
        kw["stop_timeout_s"] = float(m["stop_timeout_s"].integer(1, 600))
    if "warmup_requests" in m:
        kw["warmup_requests"] = m["warmup_requests"].integer(0, 100000)
    if "load" in m:
        lm = m["load"].mapping(("requests", "concurrency", "processes"))
        if "requests" in lm:
            kw["requests"] = lm["requests"].integer(1, 10_000_000)
        if "concurrency" in lm:
            kw["concurrency"] = lm["concurrency"].integer(1, 1024)
        if "processes" in lm:
            kw["processes"] = lm["processes"].integer(1, 256)
    if "p99_ms" in m:
        v = m["p99_ms"].value()
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise m["p99_ms"].error(f"expected a positive number of milliseconds, got {m['p99_ms']._desc()}")
        kw["p99_ms"] = float(v)
    return Gate(**kw)


def parse_profile(node) -> Triton:
    m = node.mapping(TOP_KEYS, required=("models",))
    base = os.path.dirname(os.path.abspath(node.file)) if node.file and not node.file.startswith("<") else os.getcwd()
    kw = {"profile_dir": base, "line": node.line}
    if "server" in m:
        s = m["server"].string(what="'pytriton' or the path of a tritonserver binary")
        kw["server"] = s if s == "pytriton" else _path(m["server"], base)
    for key, opts in (("launch", ("binary", "container")), ("supervisor", ("auto", "systemd", "process")),
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
        kw["unit"] = m["unit"].string(r"[A-Za-z0-9:_.\\-]+", "a systemd unit name")
    if "user" in m:
        kw["user"] = m["user"].string(USER_RE, "a user name")
        if kw["user"] == "root":
            raise m["user"].error("the service must not run as root; name an unprivileged user")
    if "gpu" in m:
        kw["gpu"] = None if m["gpu"].is_null() else m["gpu"].integer(0, 63)
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
        mod = _model(item, base, container=kw.get("launch") == "container")
        if mod.name in seen:
            raise item.error(f"model {mod.name!r} is defined twice (first at line {seen[mod.name]})")
        seen[mod.name] = item.line
        models.append(mod)
    if not models:
        raise m["models"].error("expected at least one model")
    if "gate" in m:
        kw["gate"] = _gate(m["gate"])
    return Triton(models=tuple(models), **kw)


def section(profile) -> Triton | None:
    """The triton section joined with the profile's mps section: with MPS enabled, the server is
    an MPS client (its pipe and log directories in its environment, unit and container)."""
    t = profile.section("triton")
    mps = profile.section("mps")
    if t is not None and mps is not None and mps.enabled:
        t = replace(t, mps=MpsDirs(mps.pipe_dir, mps.log_dir))
    return t


def check_models(t: Triton) -> Triton:
    """Each model's config against Triton's schema (tritonclient's model_config_pb2): a bad field is
    a profile error at its key path. Done at plan time, once per section object: parsing a profile
    imports no service code."""
    if getattr(t, "_checked", False):
        return t
    from hkgpu_tune.serve import render
    for m in t.models:
        if m.item is not None:
            render.check_config(m.config, m.nodes, m.item)
    object.__setattr__(t, "_checked", True)
    return t


# ---------------------------------------------------------------- verify / apply
def engine_facts(m: Model) -> dict:
    """Which engine a built model runs and why; what it needs that this host lacks."""
    import importlib.util
    out = {"engine": m.engine, "why": m.engine_reason}
    if m.engine == "torch":
        out["detail"] = (f"{m.build.torchvision}, {'fp16' if m.build.fp16 else 'fp32'}"
                         f"{', channels_last' if m.build.channels_last else ''}"
                         f"{', CUDA graphs' if m.build.cuda_graphs else ''}")
        missing = [p for p in ("torch", "torchvision") if importlib.util.find_spec(p) is None]
        if missing:
            out["missing"] = f"the torch engine needs {' and '.join(missing)}, not installed"
    return out


class Plugin(Subsystem):
    """Results: the rendered repository (fixable: re-render, then load through the repository API),
    the service (fixable: start), server and model readiness, the served config of each model
    against the profile (fixable: load), under MPS whether the server is an MPS client, metrics.

    A changed model is loaded into the running server (explicit model control, no restart) and
    gated; when the load or the gate fails, the copy kept of the previous model directory is put
    back and loaded again, and the apply fails saying so. restore() needs only the saved record."""

    name = "triton"

    @property
    def t(self) -> Triton:
        t = self.__dict__.get("_t")
        if t is None:
            t = section(self.profile)
            if t is None:
                raise HkError("triton: the profile has no triton section")
            self.__dict__["_t"] = t = check_models(t)
        return t

    def read(self) -> dict:
        from hkgpu_tune.serve import client, launch, render
        t = self.t
        state = {"repository": render.repository_state(t), "service": launch.status(t, self.b),
                 "engines": {m.name: engine_facts(m) for m in t.models if m.engine},
                 "ref": self._ref()}
        if state["ref"]["supervisor"] == "systemd":
            unit = launch.unit_state(t, self.b)
            state["unit"] = {k: v for k, v in unit.items() if k != "text"}
            state["unit"]["before"] = self.b.systemd.read_unit(launch.unit_name(t))
            state["unit"]["restart"] = launch.unit_needs_restart(state["unit"]["before"], unit["text"])
        if state["service"]["active"]:
            if state["ref"]["supervisor"] == "process":
                rec = launch.process_record(t) or {}
                state["process"] = {"argv": rec.get("argv"), "env": rec.get("env", {}), "want": launch.launched_as(t),
                                    "record": launch.respawn_record(rec)}
            with client.Client(t.http.host, t.http.port, timeout=5) as c:
                state["server_ready"] = c.ready()
                state["models"] = {}
                for m in t.models:
                    entry = {"ready": c.model_ready(m.name)}
                    try:
                        entry["config"] = c.model_config(m.name)
                    except HkError as e:
                        entry["config_error"] = str(e)
                    state["models"][m.name] = entry
            state["metrics"] = client.metrics_answer(t.metrics.host, t.metrics.port)
            if t.mps is not None and t.gpu is not None:
                state["mps"] = self._mps_clients(t)
        return state

    def _ref(self) -> dict:
        from hkgpu_tune.serve import launch
        return launch.ServiceRef.of(self.t, self.b).to_dict()

    def _mps_clients(self, t) -> dict:
        """Triton's processes against NVML's MPS client list of its GPU."""
        from hkgpu_tune.serve import launch
        pids = launch.server_pids(t, self.b)
        try:
            procs = self.b.nvml.processes(t.gpu)
        except HkError as e:
            return {"unsupported": f"cannot list GPU {t.gpu}'s processes: {e}"}
        return {"pids": pids, "mps": sorted(set(pids) & set(procs["mps"])),
                "own": sorted(set(pids) & set(procs["compute"]) - set(procs["mps"]))}

    def compare(self, state: dict):
        from hkgpu_tune.serve import redeploy, render
        t, res = self.t, []
        ref = state.get("ref") or self._ref()
        for name, e in state.get("engines", {}).items():
            res.append(self.result(name, "engine", e["engine"], e["engine"], UNSUPPORTED if e.get("missing") else OK,
                                   e.get("missing") or ", ".join(x for x in (e.get("detail"), e["why"]) if x)))
        for name, st in state["repository"].items():
            if st.get("unsupported"):
                res.append(self.result(name, "repository", st["current"], st["desired"], UNSUPPORTED,
                                       st["unsupported"]))
                continue
            same = st["current"] == st["desired"]
            old = redeploy.copies(t.model_repository, name)
            # what restore needs, saved with the original: no profile, no tritonclient
            data = {"model": name, "repository": t.model_repository,
                    "model_dir": os.path.join(t.model_repository, name), "existed": st["current"] != "absent",
                    "backup": redeploy.backup_path(t.model_repository, name, redeploy.new_token()),
                    "original": old[0] if old else None, "service": ref}
            res.append(self.result(name, "repository", st["current"], st["desired"], OK if same else DRIFT,
                                   "" if same else st["reason"], write=None if same else "rendered", data=data))
        if "unit" in state:
            u = state["unit"]
            ok = u["current"] == u["desired"]
            why = ("" if ok else "the unit file is not the one the profile renders" if u.get("restart", True)
                   else "the unit's stop settings are not the ones the profile renders (a reload, no restart)")
            res.append(self.result(u["path"], "unit", u["current"], u["desired"], OK if ok else DRIFT, why,
                                   write=None if ok else "rendered", data={"before": u.get("before"), "service": ref}))
        svc = state["service"]
        target = svc["target"]
        if not svc["active"]:
            res.append(self.result(target, "service", svc["state"], "running", DRIFT, svc.get("reason", ""),
                                   write="running", data={"service": ref}))
            return res
        res.append(self.result(target, "service", svc["state"], "running", OK, svc.get("reason", "")))
        if "process" in state:
            pr = state["process"]
            have = {"argv": pr["argv"], "env": pr["env"]}
            if have != pr["want"]:
                why = [f"{k} differs" for k in ("argv", "env") if have[k] != pr["want"][k]]
                res.append(self.result(target, "command", "differs", "as rendered", DRIFT,
                                       f"the running server's {' and '.join(why)} (apply restarts it)",
                                       write="restarted", data={"before": pr["record"], "service": ref}))
            else:
                res.append(self.result(target, "command", "as rendered", "as rendered", OK, ""))
        ready = state.get("server_ready")
        res.append(self.result(target, "server_ready", ready, True, OK if ready else DRIFT,
                               "" if ready else "/v2/health/ready does not answer 200"))
        for m in t.models:
            ms = state["models"][m.name]
            res.append(self.result(m.name, "model_ready", ms["ready"], True, OK if ms["ready"] else DRIFT,
                                   "" if ms["ready"] else f"/v2/models/{m.name}/ready does not answer 200"))
            if "config_error" in ms:
                res.append(self.result(m.name, "served_config", None, "as rendered", ERROR, ms["config_error"]))
                continue
            diffs = render.config_diff(m.config, ms["config"])
            if diffs:
                first = diffs[0]
                res.append(self.result(m.name, "served_config", first[1], first[2], DRIFT,
                                       "; ".join(f"{p}: served {c!r}, profile {d!r}" for p, c, d in diffs)
                                       + " (apply loads it through the repository API)",
                                       write="loaded", data={"model": m.name, "served": ms["config"], "service": ref}))
            else:
                res.append(self.result(m.name, "served_config", "as rendered", "as rendered", OK,
                                       f"{len(render.flat(m.config))} field(s) compared"))
        if "mps" in state:
            res.append(self._mps_result(t, state["mps"]))
        met = state.get("metrics") or {}
        res.append(self.result(target, "metrics", met.get("status"), "answering", OK if met.get("ok") else DRIFT,
                               met.get("reason", "")))
        return res

    def _mps_result(self, t, st: dict):
        target, want = f"gpu{t.gpu}", "MPS client"
        if "unsupported" in st:
            return self.result(target, "mps_client", None, want, UNSUPPORTED, st["unsupported"])
        if st["mps"]:
            return self.result(target, "mps_client", want, want, OK,
                               f"pid {', '.join(map(str, st['mps']))} in NVML's MPS client list")
        if st["own"]:
            return self.result(target, "mps_client", "own context", want, DRIFT,
                               f"pid {', '.join(map(str, st['own']))} holds a CUDA context of its own, not through "
                               f"MPS (is the MPS daemon running with pipe directory {t.mps.pipe_dir}?)")
        return self.result(target, "mps_client", "no context", want, DRIFT,
                           f"no Triton process (pids {', '.join(map(str, st['pids'])) or 'none'}) is an MPS client "
                           f"of GPU {t.gpu}")

    # ------------------------------------------------------------ apply
    def write(self, target, key, value, data):
        from hkgpu_tune.serve import launch, redeploy, render
        if key == "repository":
            if data.get("existed"):
                redeploy.save(data["model_dir"], data["backup"])
            render.write_model(self.t, self.t.model(data["model"]), self.b)
        elif key == "unit":
            launch.install_unit(self.t, self.b)
        elif key in ("served_config", "command"):
            pass  # after_apply loads the models, or restarts once, for the whole batch
        elif key == "service":
            if value == "running":
                launch.start(self.t, self.b)
                launch.wait_ready(self.t)
            else:
                launch.stop(self.t, self.b)
        else:
            raise HkError(f"triton: cannot set {key}")

    def after_apply(self, changes):
        """Bring the running server to what was written (a load per changed model through the
        repository API; a restart only when its unit or command changed), then the gate (warm-up,
        load, p99 under the SLO). A failed load or gate puts the previous models back before it fails."""
        from hkgpu_tune.serve import gate, launch, redeploy
        t = self.t
        started = any(c.key == "service" for c in changes)
        reload = [c for c in changes if c.key in ("repository", "served_config")]
        restart = [c for c in changes if c.key == "command" or c.key == "unit" and launch.unit_needs_restart(
            c.data.get("before"), self.b.systemd.read_unit(launch.unit_name(t)))]
        active = not started and launch.status(t, self.b)["active"]
        if active and reload and not launch.explicit(t, self.b):
            restart.append(None)  # a server from before explicit model control: restart once
        hot = []
        if active and restart:
            launch.restart(t, self.b)
        elif active and reload:
            ref = launch.ServiceRef.of(t, self.b)
            c = ref.client()
            try:
                for name in dict.fromkeys(ch.data["model"] for ch in reload):
                    try:
                        c.load_model(name)
                    except HkError as e:
                        raise ApplyError(f"{e}; {self._put_back(reload)}") from None
                    hot.append(name)
            finally:
                c.close()
        if started or hot or (active and restart):
            rep = gate.run_gate(t)
            if rep.client_bound:   # the client, not the server, missed: the deployment stays
                self.notes.append(f"triton gate client-bound, deployment kept: {rep.message}")
            elif rep.passed:
                self.notes.append(f"triton gate passed: {rep.message}")
            else:
                if hot:
                    raise gate.GateFailed(f"triton gate failed: {rep.message}; {self._put_back(reload)}")
                if active and restart:
                    raise gate.GateFailed(f"triton gate failed: {rep.message}; {self._undo_restart(restart, reload)}")
                raise gate.GateFailed(f"triton gate failed: {rep.message}")
        for ch in reload:  # the deployment stays: only the oldest copy (rollback's original) is kept
            if ch.key == "repository":
                redeploy.drop_newer(ch.data["repository"], ch.data["model"])

    def _put_back(self, reload) -> str:
        """The previous model directories back on disk and loaded again; says how that went."""
        errs = []
        for ch in reversed(reload):
            try:
                self._restore_model(ch)
                ch.data["restored"] = True
            except HkError as e:
                errs.append(str(e))
        if errs:
            return "putting the previous config back failed: " + "; ".join(errs)
        return "the previous config is serving again"

    def _undo_restart(self, restart, reload) -> str:
        """After a restart that failed its gate: the previous files, unit or command, and a restart."""
        from hkgpu_tune.serve import launch
        t = self.t
        try:
            for ch in reload:
                if ch.key == "repository":
                    self._put_files_back(ch)
            for ch in restart:
                if ch is not None:
                    self._restore_launch(ch)
            if restart == [None]:  # only the files changed (a server from before explicit control)
                launch.restart(t, self.b)
            launch.wait_ready(t, self.b)
        except HkError as e:
            return f"putting the previous config back failed: {e}"
        for ch in reload + restart:
            if ch is not None:
                ch.data["restored"] = True
        return "the previous config is serving again"

    # ------------------------------------------------------------ restore (from the saved record only)
    def _put_files_back(self, ch) -> str:
        from hkgpu_tune.serve import redeploy
        d = ch.data
        redeploy.check_record(d)
        return redeploy.put_back(d["model_dir"], d["backup"], d["existed"], d.get("original"))

    def _restore_model(self, ch) -> None:
        """A model as it was before: its directory back, and loaded (or unloaded) where the server runs."""
        from hkgpu_tune.serve import launch
        d = ch.data
        ref = launch.ServiceRef.from_dict(d["service"])
        if ch.key == "repository":
            self._put_files_back(ch)
        c = ref.client()
        try:
            if not c.live():
                return
            if ch.key == "served_config":
                c.load_model(d["model"], d["served"])
            elif d.get("existed"):
                c.load_model(d["model"])
            else:
                c.unload_model(d["model"])
        finally:
            c.close()

    def _restore_launch(self, ch) -> None:
        from hkgpu_tune.serve import launch
        ref = launch.ServiceRef.from_dict(ch.data["service"])
        if ch.key == "unit":
            before = ch.data.get("before")
            self.b.systemd.write_unit(launch.unit_name(ref), before)  # None: the unit did not exist
            self.b.systemd.daemon_reload()
            if before is not None and self.b.systemd.is_active(launch.unit_name(ref)):
                launch.stop(ref, self.b)
                self.b.systemd.enable(launch.unit_name(ref), now=True)
        elif ch.key == "command":
            launch.respawn(ref, ch.data["before"], self.b)

    def restore(self, change):
        from hkgpu_tune.serve import launch, redeploy
        d = change.data
        if d.get("restored"):  # put back already, by the failed gate
            return
        if change.key in ("repository", "served_config"):
            self._restore_model(change)
            if change.key == "repository":
                redeploy.drop_all(d["repository"], d["model"])
        elif change.key == "service" and change.current != "running":
            launch.stop(launch.ServiceRef.from_dict(d["service"]), self.b)
        elif change.key in ("unit", "command"):
            self._restore_launch(change)

    def facts(self) -> dict:
        from hkgpu_tune.serve import launch
        st = self.read()
        st["placement"] = launch.placement(self.t, self.b)
        return st


__all__ = ["Triton", "Model", "Endpoint", "Gate", "Build", "parse_profile", "Plugin"]
