"""Where the server is and how it runs: its binary, backends and arguments, its placement, and the
three forms (a systemd unit, a container command, a supervised process).

>>> print(render_unit(t, place={"cpus": [0, 1], "mems": [0], "numa_node": 0, "source": "test"}))  # doctest: +SKIP
[Unit]
...
"""
from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from dataclasses import asdict, dataclass

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.fsutil import atomic_write
from hkgpu_tune.core import unitfile
from hkgpu_tune.serve.running import client
from hkgpu_tune.serve.running.form_base import Form, form, register

PID_FILE = "tritonserver.json"
LOG_FILE = "tritonserver.log"
from hkgpu_tune.serve.schema.shapes import CONTAINER_REPO, HARDENING  # the renderer's shape, checked there
CONTROL_MODE = "explicit"
STOP_GRACE_S = 10  # past the server's own exit timeout before it is killed
# latency summaries for p50/p95/p99 (nv_inference_request_summary_us{quantile}) next to the default
# counters and nv_inference_pending_request_count; monitoring/ alerts on these (docs/monitoring.md)
METRICS_CONFIG = ("--metrics-config=summary_latencies=true",
                  "--metrics-config=summary_quantiles=0.5:0.05,0.95:0.01,0.99:0.001")


# ---------------------------------------------------------------- where the server is
def pytriton_root() -> str:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise HkError("triton: server 'pytriton' needs the nvidia-pytriton wheel (pip install nvidia-pytriton)")
    root = os.path.join(list(spec.submodule_search_locations)[0], "tritonserver")
    if not os.path.isfile(os.path.join(root, "bin", "tritonserver")):
        raise HkError(f"triton: no tritonserver in the nvidia-pytriton wheel at {root}")
    return root


def server_binary(t) -> str:
    if t.server == "pytriton":
        return os.path.join(pytriton_root(), "bin", "tritonserver")
    if not os.path.isfile(t.server) or not os.access(t.server, os.X_OK):
        raise HkError(f"triton: server binary {t.server} does not exist or is not executable")
    return t.server


def backend_directory(t) -> str:
    """The wheel ships the Python backend without its stub: a directory of our own holds both."""
    if t.server == "pytriton":
        return os.path.join(os.path.dirname(t.model_repository.rstrip("/")) or "/", "triton-backends")
    return os.path.join(os.path.dirname(os.path.dirname(t.server)), "backends")


def prepare_backends(t) -> str:
    """Copy the wheel's Python backend and the stub for this Python into backend_directory (idempotent)."""
    d = backend_directory(t)
    if t.server != "pytriton":
        return d
    root = pytriton_root()
    ver = t.python_stub or f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = os.path.join(root, "python_backend_stubs", ver, "triton_python_backend_stub")
    if not os.path.isfile(stub):
        have = sorted(os.listdir(os.path.join(root, "python_backend_stubs")))
        raise HkError(f"triton: the wheel has no Python backend stub for Python {ver} (has {', '.join(have)})")
    dst = os.path.join(d, "python")
    os.makedirs(dst, exist_ok=True)
    for src in (os.path.join(root, "backends", "python", "libtriton_python.so"),
                os.path.join(root, "backends", "python", "triton_python_backend_utils.py"), stub):
        out = os.path.join(dst, os.path.basename(src))
        st = os.stat(src)
        try:
            o = os.stat(out)
            if o.st_size == st.st_size and o.st_mtime >= st.st_mtime:
                continue
        except FileNotFoundError:
            pass
        with open(src, "rb") as f:
            atomic_write(out, f, mode=st.st_mode & 0o755)
    return d


def server_env(t, backends=None, resolve: bool = True) -> dict[str, str]:
    """What the binary needs beyond the caller's environment (the wheel's libraries, the GPU). A MIG
    device named by position is resolved to its UUID now (resolve=False: left out, for a unit that
    resolves it when it starts)."""
    env = {}
    if t.server == "pytriton":
        site = os.path.dirname(os.path.dirname(pytriton_root()))
        libs = [os.path.join(site, "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR") or ""]
        env["LD_LIBRARY_PATH"] = ":".join(p for p in libs if p)
        env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]
    if any(m.backend == "hkbatch" for m in t.models):   # it embeds this Python in the server
        from hkgpu_tune.serve.repository import batch_backend
        for k, v in batch_backend.server_env().items():
            env[k] = ":".join(dict.fromkeys([*env[k].split(":"), *v.split(":")])) if k == "PYTHONPATH" and k in env else v
    if visible_gpus(t, resolve=False):   # NVML's numbering (PCI bus order), which the profile uses
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if resolve or not mig_position(t):
            env["CUDA_VISIBLE_DEVICES"] = visible_gpus(t, backends=backends)
    return env | mps_env(t)


def mig_position(t):
    """The MIG device the service names by position (mig:GPU/SLOT), else None."""
    from hkgpu_tune.serve.schema.devices import is_mig_pos
    m = getattr(t, "mig", None)
    return m if m and is_mig_pos(m) else None


def visible_gpus(t, host: bool = False, backends=None, resolve: bool = True) -> str:
    """The GPUs the server sees, '4,5,6,7' ('' for all); inside, they are 0..n-1 and the rendered
    configs use those numbers (devices.remap_gpus). An MPS client counts among the GPUs its daemon
    serves (the daemon's own CUDA_VISIBLE_DEVICES), not among all of the host's; `host`: the host's
    numbers (a container runtime's --gpus). A MIG device is its UUID on both sides ('MIG-...'); one
    named by position is resolved through NVML (resolve=False: the position as written)."""
    pos = mig_position(t)
    if pos and resolve:
        from hkgpu_tune.serve.schema.devices import host_nvml, resolve as resolve_mig
        return resolve_mig(host_nvml(backends), pos)
    gpus = getattr(t, "gpus", None)
    if gpus is None:
        gpus = () if t.gpu is None else (t.gpu,)
    served = getattr(getattr(t, "mps", None), "gpus", None)
    if served is not None and gpus and not host and not getattr(t, "mig", None):
        gpus = tuple(served.index(g) for g in gpus)
    return ",".join(str(g) for g in gpus)


def mps_env(t) -> dict[str, str]:
    """Where the MPS control daemon listens (the profile's mps section): CUDA clients that see
    these variables connect through MPS instead of making a context of their own."""
    if getattr(t, "mps", None) is None:
        return {}
    return {"CUDA_MPS_PIPE_DIRECTORY": t.mps.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": t.mps.log_dir}


def server_args(t, repository: str | None = None, backends: str | None = None) -> list[str]:
    """tritonserver options: repository, explicit model control (each profile model loaded at start,
    later versions loaded through the repository API), the backend directory (`backends`; an image
    has its own), ports and bind addresses, strict readiness."""
    args = [f"--model-repository={repository or t.model_repository}", f"--model-control-mode={CONTROL_MODE}"]
    args += [f"--load-model={m.name}" for m in t.models]
    if backends:
        args.append(f"--backend-directory={backends}")
    args += [f"--http-address={t.http.address}", f"--http-port={t.http.port}",
             f"--grpc-address={t.grpc.address}", f"--grpc-port={t.grpc.port}",
             f"--metrics-address={t.metrics.address}", f"--metrics-port={t.metrics.port}",
             "--allow-metrics=true", *METRICS_CONFIG, "--strict-readiness=true", "--exit-on-error=true",
             f"--exit-timeout-secs={int(t.gate.stop_timeout_s)}"]
    from hkgpu_tune.serve.schema.connections import args as connection_args
    return args + connection_args(t.connections) + list(t.extra_args)


# ---------------------------------------------------------------- placement
def cpu_list(cpus) -> str:
    """[0,1,2,5] -> '0-2,5' (the form systemd and docker read)."""
    from hkgpu_tune.backends.topology import format_cpulist
    return format_cpulist(int(c) for c in cpus)


def placement(t, backends=None) -> dict:
    """CPUs and NUMA nodes local to the service's GPU (backends.topology); for a MIG device, its
    parent GPU's."""
    from hkgpu_tune.backends import topology
    if t.gpu is not None or getattr(t, "mig", None):
        if backends is None:
            from hkgpu_tune.backends import Backends
            backends = Backends()
        try:
            gpu = t.gpu if t.gpu is not None else parent_gpu(backends, t.mig)
            p = dict(topology.service_placement(backends, gpu))
            if p.get("cpus"):
                return p
        except HkError as e:
            return {"cpus": sorted(os.sched_getaffinity(0)), "mems": [], "numa_node": None,
                    "source": f"placement: {e}; all CPUs", "known": False}
    return {"cpus": sorted(os.sched_getaffinity(0)), "mems": [], "numa_node": None, "source": "no GPU named; all CPUs",
            "known": False}


def parent_gpu(backends, uuid: str) -> int:
    """The NVML index of the GPU holding MIG device `uuid`; HkError where none here has it."""
    from hkgpu_tune.backends.mig import find as find_mig
    d = find_mig(backends.nvml, uuid)
    if d is None:
        raise HkError(f"no MIG device {uuid} on this host")
    return d["gpu"]


# ---------------------------------------------------------------- the three forms
UNIT_MIG_DEVICE = "device=${CUDA_VISIBLE_DEVICES}"   # a unit's --gpus for a MIG position (mig-env's file)


def container_argv(t, place: dict, detach: bool = False, backends=None, resolve: bool = True) -> list[str]:
    """docker/podman run for the NGC-style image: GPU, host network, memlock, shm, cpuset, repo read-only.
    A MIG position: its UUID now, or (resolve=False, a unit) the unit's variable."""
    if not t.image:
        raise HkError("triton: the container form needs 'image'")
    argv = [t.runtime, "run", "--rm", "--name", t.unit]
    if detach:
        argv.append("--detach")
    if mig_position(t) and not resolve:
        argv += ["--gpus", UNIT_MIG_DEVICE]
    elif visible_gpus(t, host=True, resolve=False):   # docker's form for a set: --gpus '"device=2,3"'
        devs = visible_gpus(t, host=True, backends=backends)
        argv += ["--gpus", f"device={devs}" if "," not in devs else f'"device={devs}"']
    argv += ["--network", "host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
             "--shm-size", t.shm_size]
    if place.get("cpus"):
        argv += ["--cpuset-cpus", cpu_list(place["cpus"])]
    if place.get("mems"):
        argv += ["--cpuset-mems", cpu_list(place["mems"])]
    if t.user:
        argv += ["--user", t.user]
    mps = mps_env(t)
    if mps:  # the daemon's pipes and shared memory: the same paths inside, the host's IPC namespace
        argv.append("--ipc=host")
        for k, v in mps.items():
            argv += ["-e", f"{k}={v}"]
        for d in dict.fromkeys(mps.values()):
            argv += ["-v", f"{d}:{d}"]
    argv += ["--volume", f"{os.path.abspath(t.model_repository)}:{CONTAINER_REPO}:ro", t.image, "tritonserver"]
    return argv + server_args(t, CONTAINER_REPO)


def command(t, place: dict | None = None, backends=None, resolve: bool = True) -> list[str]:
    """The full argv the service runs, in its launch form."""
    place = place if place is not None else placement(t, backends)
    return form(t.launch).argv(t, place, backends, resolve)


DEFAULT_USER = "triton-server"


@register
class Binary(Form):
    """tritonserver itself, run as the profile's user (DEFAULT_USER when none is named)."""
    name = "binary"
    pinned = True
    own_user = True

    def argv(self, t, place, backends=None, resolve=True):
        return [server_binary(t)] + server_args(t, backends=backend_directory(t))

    def check(self, t, backends):
        server_binary(t)
        prepare_backends(t)

    def env(self, t, backends=None):
        return server_env(t, backends)

    def recognise(self, argv):
        return os.path.basename(argv[0]) == "tritonserver"

    def unit_service(self, t, argv, pos):
        out = []
        user = unitfile.value(t.user or DEFAULT_USER, "triton.user")
        out += [f"User={user}", f"Group={user}"]
        for k, v in sorted(server_env(t, resolve=False).items()):
            out.append(f"Environment={unitfile.environment(k, v)}")
        if pos:
            from hkgpu_tune.serve.schema.devices import start_lines
            out += start_lines(pos, t.unit)
        out += [f"ReadOnlyPaths={unitfile.path(t.model_repository, 'triton.model_repository')}",
                "ReadWritePaths=/dev/shm"]
        for d in dict.fromkeys(mps_env(t).values()):  # visible (PrivateTmp) and writable (ProtectSystem)
            q = unitfile.path(d, "triton.mps directory", colon=False)
            out += [f"BindPaths={q}", f"ReadWritePaths={q}"]
        out += HARDENING
        out.append("ExecStart=" + unitfile.exec_line(argv, "triton server"))
        return out


def render_unit(t, place: dict | None = None) -> str:
    """The systemd unit of the service (binary or container form)."""
    place = place if place is not None else placement(t)
    pos = mig_position(t)      # resolved to its UUID each time the unit starts, not now
    argv = command(t, place, resolve=False)
    after = ["network-online.target", "nvidia-persistenced.service"]
    if pos:   # the boot unit re-creates the MIG layout first
        after.append("hkgpu-tune.service")
    wants = ["network-online.target"]
    if getattr(t, "mps", None) is not None:   # its clients need the MPS daemon up first
        after.append(t.mps.unit)
        wants.append(t.mps.unit)
    lines = ["[Unit]", "Description=Triton Inference Server (hkgpu-tune)",
             "After=" + " ".join(after), "Wants=" + " ".join(wants), ""]
    lines += ["[Service]", "Type=simple"]
    lines += form(t.launch).unit_service(t, argv, pos)
    lines += ["LimitMEMLOCK=infinity", "LimitNOFILE=1048576", "LimitSTACK=67108864"]
    if place.get("cpus"):
        lines.append(f"CPUAffinity={cpu_list(place['cpus'])}")
    if place.get("mems"):
        lines += ["NUMAPolicy=bind", f"NUMAMask={cpu_list(place['mems'])}"]
    lines += [f"# placement: {place.get('source', '')}",
              "Restart=on-failure", "RestartSec=5", f"TimeoutStopSec={unit_stop_s(t.gate.stop_timeout_s)}",
              "KillMode=control-group", "", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


def unit_stop_s(exit_timeout: float) -> int:
    """The unit's TimeoutStopSec: past the server's exit timeout and past a container runtime's
    `stop --time` (itself STOP_GRACE_S past it)."""
    return int(exit_timeout) + 2 * STOP_GRACE_S


def unit_name(t) -> str:
    return f"{t.unit}.service"


@dataclass(frozen=True)
class ServiceRef:
    """What stop, status and the repository API need of a deployed service. Saved with apply's
    originals, so that rollback needs neither the profile nor tritonclient."""
    supervisor: str          # systemd | process (resolved, never auto)
    unit: str
    run_dir: str
    runtime: str
    stop_timeout_s: float
    http_host: str
    http_port: int
    load_timeout_s: float
    grpc_host: str = ""       # model control goes over gRPC (client.Client._control); "" in older records
    grpc_port: int = 0

    @classmethod
    def of(cls, t, backends=None) -> "ServiceRef":
        if isinstance(t, cls):
            return t
        return cls(supervisor(t, backends), t.unit, t.run_dir, t.runtime, t.gate.stop_timeout_s,
                   t.http.host, t.http.port, t.gate.ready_timeout_s, t.grpc.host, t.grpc.port)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ServiceRef":
        try:
            return cls(str(d["supervisor"]), str(d["unit"]), str(d["run_dir"]), str(d["runtime"]),
                       float(d["stop_timeout_s"]), str(d["http_host"]), int(d["http_port"]),
                       float(d["load_timeout_s"]), str(d.get("grpc_host", "")), int(d.get("grpc_port", 0)))
        except (KeyError, TypeError, ValueError) as e:
            raise HkError(f"triton: the saved service record is incomplete ({e})") from None

    def client(self) -> client.Client:
        grpc = (self.grpc_host, self.grpc_port) if self.grpc_host and 0 < self.grpc_port < 65536 else None
        return client.Client(self.http_host, self.http_port, timeout=self.load_timeout_s, grpc=grpc)


def _b(backends):
    if backends is None:
        from hkgpu_tune.backends import Backends
        backends = Backends()
    return backends


def supervisor(t, backends=None) -> str:
    """systemd where it is the service manager (or the profile says so), else a supervised process."""
    if t.supervisor != "auto":  # a ServiceRef's is always resolved
        return t.supervisor
    return "systemd" if _b(backends).systemd.available() else "process"


def unit_state(t, backends=None, place: dict | None = None) -> dict:
    """The installed unit file against the rendered one (systemd only)."""
    b = _b(backends)
    want = render_unit(t, place if place is not None else placement(t, b))
    have = b.systemd.read_unit(unit_name(t))
    return {"current": "absent" if have is None else ("as rendered" if have == want else "differs"),
            "desired": "as rendered", "text": want, "path": b.systemd.unit_path(unit_name(t))}


STOP_ONLY = ("TimeoutStopSec=", "ExecStop=", "ExecStopPost=")


def unit_needs_restart(before: str | None, after: str | None) -> bool:
    """Whether a unit change reaches the running server only by a restart: what systemd reads only
    at a stop (its timeout, ExecStop) takes effect with the daemon-reload."""
    if before is None or after is None:
        return True
    def keep(text):
        return [ln for ln in text.splitlines() if not ln.startswith(STOP_ONLY)]
    return keep(before) != keep(after)


def install_unit(t, backends=None, place: dict | None = None) -> bool:
    """Write the unit where it differs and reload systemd; True when it changed."""
    b = _b(backends)
    st = unit_state(t, b, place)
    if st["current"] == "as rendered":
        return False
    b.systemd.write_unit(unit_name(t), st["text"])
    b.systemd.daemon_reload()
    return True
