"""Replayed GPU hosts: the recorded H200 and an 8-GPU two-socket DGX H100 (see tests/fixtures/gpu)."""
import copy
import json
import os
import tarfile
import threading

import pytest

from hkgpu_tune.backends import Backends
from hkgpu_tune.backends.nvml import ReplayNvml
from hkgpu_tune.backends.procfs import SysFs
from hkgpu_tune.core.profile import parse_profile_text

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "gpu")


def load(name):
    with open(os.path.join(FIX, name)) as f:
        return json.load(f)


class FakeCmd:
    def __init__(self, programs=()):
        self.programs = set(programs)
        self.runs = []

    def which(self, prog):
        return f"/usr/bin/{prog}" if prog in self.programs else None

    def run(self, argv, timeout=30, env=None):
        self.runs.append(argv)

        class R:
            rc, out, err = 0, "", ""
        return R()


class FakeSystemd:
    def __init__(self, available=True, active=(), root="/"):
        self._available, self.active, self.calls, self.units = available, set(active), [], {}

    def available(self):
        return self._available

    def why_not(self):
        return "systemd is not the service manager here (PID 1 is not systemd)"

    def is_active(self, unit):
        return unit in self.active

    def is_enabled(self, unit):
        return unit in self.active

    def enable(self, unit, now=True):
        self.calls.append(("enable", unit))
        self.active.add(unit)

    def disable(self, unit, now=True):
        self.calls.append(("disable", unit))
        self.active.discard(unit)

    def daemon_reload(self):
        self.calls.append(("daemon-reload",))

    def read_unit(self, unit):
        return self.units.get(unit)

    def write_unit(self, unit, text):
        if text is None:
            self.units.pop(unit, None)
        else:
            self.units[unit] = text


class Persistenced(FakeSystemd):
    """systemd with NVIDIA's nvidia-persistenced unit behind it, as documented in nvidia-persistenced(1)
    and NVIDIA's "Driver Persistence" guide (the Persistence Daemon section): the daemon starts with
    persistence mode enabled for every GPU unless started with --no-persistence-mode; it holds the
    devices open while it runs, and on stop it lets them go (persistence off). The change shows in
    NVML a moment after the start (`delay_s`), as on a real host. `nvml` is the host's ReplayNvml;
    the state is changed in its facts, not through its set_persistence (whose writes it logs)."""

    UNIT = "nvidia-persistenced.service"

    def __init__(self, args=(), delay_s=0.2, **kw):
        super().__init__(available=True, **kw)
        self.args, self.delay_s, self.nvml, self.timers = list(args), delay_s, None, []

    def _hold(self, on: bool):
        def flip():
            for g in self.nvml.facts["gpus"]:
                g["persistence"] = on
        t = threading.Timer(self.delay_s, flip)
        self.timers.append(t)
        t.start()

    def enable(self, unit, now=True):
        was = unit in self.active
        super().enable(unit, now)
        if unit == self.UNIT and now and not was:
            self._hold("--no-persistence-mode" not in self.args)

    def disable(self, unit, now=True):
        was = unit in self.active
        super().disable(unit, now)
        if unit == self.UNIT and now and was:
            self._hold(False)

    def join(self):
        for t in self.timers:
            t.join()


class FakeMps:
    """The MPS control daemon as a dict: what `nvidia-cuda-mps-control` would answer."""

    def __init__(self, running=False, pct=100.0, binary="/usr/bin/nvidia-cuda-mps-control"):
        self.running, self.pct, self.limits, self.sent, self.starts = running, pct, {}, [], []
        self._binary = binary

    def binary(self):
        return self._binary

    def alive(self, pipe_dir):
        return self.running

    def processes(self, pipe_dir):
        return [100] if self.running else []

    def health(self, pipe_dir):
        return {"alive": self.running, "servers": [101] if self.running else [],
                "default_active_thread_percentage": self.pct if self.running else None, "pids": self.processes(pipe_dir)}

    def send(self, pipe_dir, line):
        from hkgpu_tune.core.errors import HkError
        if not self.running:
            raise HkError("MPS control: Cannot find MPS control daemon process")
        self.sent.append(line)
        w = line.split()
        if w[0] == "set_default_active_thread_percentage":
            self.pct = float(w[1])
        elif w[0] == "set_default_device_pinned_mem_limit":
            self.limits[int(w[1])] = w[2]
        elif w[0] == "get_default_device_pinned_mem_limit":
            return self.limits.get(int(w[1]), "0")
        elif w[0] == "quit":
            self.running = False
        return ""

    def start(self, pipe_dir, log_dir, gpus=None, user=None):
        self.starts.append((pipe_dir, log_dir, gpus, user))
        self.running = True

    def stop(self, pipe_dir):
        self.running = False


def materialize(tree: dict, root) -> str:
    for path, text in tree["files"].items():
        p = os.path.join(root, path.lstrip("/"))
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
    for path, target in tree["links"].items():
        p = os.path.join(root, path.lstrip("/"))
        os.makedirs(os.path.dirname(p), exist_ok=True)
        os.symlink(target, p)
    return str(root)


@pytest.fixture()
def h200_facts():
    return load("h200.json")["gpu"]


@pytest.fixture()
def dgx():
    return load("dgx-h100-8gpu.json")


@pytest.fixture()
def h200_root(tmp_path):
    with tarfile.open(os.path.join(FIX, "h200-tree.tar.gz")) as t:
        t.extractall(tmp_path / "h200", filter="tar")
    return str(tmp_path / "h200")


@pytest.fixture()
def dgx_root(tmp_path, dgx):
    return materialize(dgx["tree"], tmp_path / "dgx")


def backends(facts=None, root="/", systemd=None, mps=None, programs=()):
    """Backends for a replayed host: recorded NVML facts, a sysfs root, fake systemd/MPS/commands."""
    nv = ReplayNvml(copy.deepcopy(facts)) if facts is not None else ReplayNvml.missing()
    return Backends(nvml=nv, sysfs=SysFs(root), systemd=systemd or FakeSystemd(available=False),
                    mps=mps or FakeMps(), cmd=FakeCmd(programs))


def profile(text):
    return parse_profile_text(text, "test.yaml")


def by_key(results):
    return {(r.target, r.key): r for r in results}
