"""The Triton inference service: the `triton:` profile section and its verify/apply.

Profile (every key but models optional; addresses default to loopback)::

    triton:
      server: pytriton            # or the path of a tritonserver binary
      launch: binary              # binary | container
      model_repository: /var/lib/hkgpu-tune/triton/models
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
import re
from dataclasses import dataclass, field

from ..errors import HkError
from ..report import DRIFT, ERROR, OK, UNSUPPORTED
from .base import Subsystem

NAME_RE = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}"
USER_RE = r"[a-z_][a-z0-9_-]{0,31}"
SIZE_RE = r"[0-9]+[kKmMgG]?"


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
    torchvision model run by torch in fp16 with CUDA graphs, served by the Python backend."""
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
class Gate:
    ready_timeout_s: float = 120.0
    warmup_requests: int = 5
    requests: int = 200
    concurrency: int = 8
    p99_ms: float | None = None    # None: measure, do not gate
    stop_timeout_s: float = 30.0


@dataclass(frozen=True)
class Triton:
    models: tuple[Model, ...]
    server: str = "pytriton"
    launch: str = "binary"                 # binary | container
    supervisor: str = "auto"               # auto | systemd | process
    runtime: str = "docker"                # container runtime: docker | podman
    image: str | None = None
    model_repository: str = "/var/lib/hkgpu-tune/triton/models"
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
                   "workspace_mib", "torchvision", "engine", "cuda_graphs", "channels_last", "image_size"))
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


def _trtexec() -> str | None:
    return shutil.which("trtexec") or next(
        (p for p in ("/usr/src/tensorrt/bin/trtexec", "/opt/tensorrt/bin/trtexec") if os.access(p, os.X_OK)), None)


def _torch_config(config: dict, b: Build) -> dict:
    """The config of a torch-engine model: the Python backend, the engine's settings as parameters."""
    out = {k: v for k, v in config.items() if k not in ("platform", "backend")}
    out["backend"] = "python"
    params = dict(out.get("parameters", {}))
    for k, v in (("torchvision", b.torchvision), ("fp16", str(b.fp16).lower()),
                 ("channels_last", str(b.channels_last).lower()), ("cuda_graphs", str(b.cuda_graphs).lower()),
                 ("image_size", str(b.image_size))):
        params.setdefault(k, {"string_value": v})
    out["parameters"] = params
    return out


def _model(item, base: str) -> Model:
    from ..triton import render
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
        config = _torch_config(config, build)
    config = render.check_config(config, nodes, item)
    model_file = TORCH_MODEL if engine == "torch" else None
    if "model_file" in m:
        model_file = _path(m["model_file"], base)
        if not os.path.isfile(model_file):
            raise m["model_file"].error(f"no such file: {model_file}")
    backend = config.get("backend") or config.get("platform")
    if backend == "python" and not model_file:
        raise item.error("a python-backend model needs 'model_file' (its model.py)")
    if backend not in ("python",) and not model_file and not build:
        raise item.error(f"platform {backend}: give 'model_file' (the model to serve) or 'build' (an ONNX to build)")
    return Model(name, config, model_file, build, m["version"].integer(1, 1 << 30) if "version" in m else 1,
                 item.line, engine, why)


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
        lm = m["load"].mapping(("requests", "concurrency"))
        if "requests" in lm:
            kw["requests"] = lm["requests"].integer(1, 10_000_000)
        if "concurrency" in lm:
            kw["concurrency"] = lm["concurrency"].integer(1, 1024)
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
        kw["extra_args"] = tuple(i.string(r"--[a-z][a-z0-9-]*(=.*)?", "a tritonserver option like --log-verbose=1")
                                 for i in m["extra_args"].items())
    models, seen = [], {}
    for item in m["models"].items():
        mod = _model(item, base)
        if mod.name in seen:
            raise item.error(f"model {mod.name!r} is defined twice (first at line {seen[mod.name]})")
        seen[mod.name] = item.line
        models.append(mod)
    if not models:
        raise m["models"].error("expected at least one model")
    if "gate" in m:
        kw["gate"] = _gate(m["gate"])
    return Triton(models=tuple(models), **kw)


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
    """Results: the rendered repository (fixable: re-render), the service (fixable: start),
    server and model readiness, the served config of each model against the profile, metrics."""

    name = "triton"

    @property
    def t(self) -> Triton:
        return self.profile.section("triton")

    def read(self) -> dict:
        from ..triton import client, launch, render
        t = self.t
        state = {"repository": render.repository_state(t), "service": launch.status(t, self.b),
                 "engines": {m.name: engine_facts(m) for m in t.models if m.engine}}
        if launch.supervisor(t, self.b) == "systemd":
            state["unit"] = {k: v for k, v in launch.unit_state(t, self.b).items() if k != "text"}
        if state["service"]["active"]:
            c = client.Client(t.http.host, t.http.port, timeout=5)
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
        return state

    def compare(self, state: dict):
        from ..triton import render
        t, res = self.t, []
        for name, e in state.get("engines", {}).items():
            res.append(self.result(name, "engine", e["engine"], e["engine"], UNSUPPORTED if e.get("missing") else OK,
                                   e.get("missing") or ", ".join(x for x in (e.get("detail"), e["why"]) if x)))
        for name, st in state["repository"].items():
            if st.get("unsupported"):
                res.append(self.result(name, "repository", st["current"], st["desired"], UNSUPPORTED,
                                       st["unsupported"]))
                continue
            res.append(self.result(name, "repository", st["current"], st["desired"],
                                   OK if st["current"] == st["desired"] else DRIFT,
                                   "" if st["current"] == st["desired"] else st["reason"],
                                   write=None if st["current"] == st["desired"] else "rendered",
                                   data={"model": name}))
        if "unit" in state:
            u = state["unit"]
            ok = u["current"] == u["desired"]
            res.append(self.result(u["path"], "unit", u["current"], u["desired"], OK if ok else DRIFT,
                                   "" if ok else "the unit file is not the one the profile renders",
                                   write=None if ok else "rendered"))
        svc = state["service"]
        target = svc["target"]
        if not svc["active"]:
            res.append(self.result(target, "service", svc["state"], "running", DRIFT, svc.get("reason", ""),
                                   write="running"))
            return res
        res.append(self.result(target, "service", svc["state"], "running", OK, svc.get("reason", "")))
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
                                       + " (apply restarts the service to serve the rendered repository)",
                                       write="restarted"))
            else:
                res.append(self.result(m.name, "served_config", "as rendered", "as rendered", OK,
                                       f"{len(render.flat(m.config))} field(s) compared"))
        met = state.get("metrics") or {}
        res.append(self.result(target, "metrics", met.get("status"), "answering", OK if met.get("ok") else DRIFT,
                               met.get("reason", "")))
        return res

    def write(self, target, key, value, data):
        from ..triton import launch, render
        if key == "repository":
            render.write_model(self.t, self.t.model(data["model"]), self.b)
        elif key == "unit":
            launch.install_unit(self.t, self.b)
        elif key == "served_config":
            pass  # after_apply restarts the service once for the whole batch
        elif key == "service":
            if value == "running":
                launch.start(self.t, self.b)
                launch.wait_ready(self.t)
            else:
                launch.stop(self.t, self.b)
        else:
            raise HkError(f"triton: cannot set {key}")

    def restore(self, change):
        from ..triton import launch, render
        if change.key == "served_config":
            return
        if change.key == "service" and change.current != "running":
            launch.stop(self.t, self.b)
        elif change.key == "repository" and change.current in (None, "absent"):
            render.remove_model(self.t, change.data["model"])
        elif change.key == "unit" and change.current == "absent":
            self.b.systemd.write_unit(launch.unit_name(self.t), None)
            self.b.systemd.daemon_reload()
        # a repository that existed before is left as rendered: its old text is not ours to keep

    def after_apply(self, changes):
        """A running server serves what it loaded: restart it once when its repository changed;
        then the gate (warm-up, load, p99 under the SLO) decides whether the deployment stays."""
        from ..triton import gate, launch
        started = any(c.key == "service" for c in changes)
        if not started and any(c.key in ("repository", "served_config", "unit") for c in changes):
            if launch.status(self.t, self.b)["active"]:
                launch.stop(self.t, self.b)
                launch.start(self.t, self.b)
                launch.wait_ready(self.t)
                started = True
        if started:
            gate.require(self.t)

    def facts(self) -> dict:
        from ..triton import launch
        st = self.read()
        st["placement"] = launch.placement(self.t, self.b)
        return st


__all__ = ["Triton", "Model", "Endpoint", "Gate", "Build", "parse_profile", "Plugin"]
