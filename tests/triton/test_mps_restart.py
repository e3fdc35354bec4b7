"""A changed MPS setting reaches the running daemon: verify reads the daemon that runs (its
environment and user, from the kernel), not only its unit; apply restarts it, and the Triton service
that is its client around it (stopped before, started after). The daemon is tests/standins/
nvidia-cuda-mps-control (NVIDIA's MPS guide: `-d`, the control commands, quit), a real process."""
from __future__ import annotations

import os
import pwd

import psutil
import pytest

from hkgpu_tune.backends import Backends
from hkgpu_tune.backends.nvml import ReplayNvml
from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.core.report import DRIFT, OK
from hkgpu_tune.subsystems import triton
from hkgpu_tune.serve.repository import render
from hkgpu_tune.serve.running import launch
from tests.helpers import gone

from .conftest import dump, free_ports, needs_server, profile_dict

STANDINS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "standins")
DGX = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "gpu", "dgx-h100-8gpu.json")
USER = pwd.getpwuid(os.getuid()).pw_name


def daemons(pipe: str) -> list[tuple[int, str, float]]:
    """(pid, CUDA_VISIBLE_DEVICES, start time) of control daemons on `pipe`, read from /proc."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/comm") as f:
                if f.read().strip() != "nvidia-cuda-mps":
                    continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
        except OSError:
            continue
        if env.get(b"CUDA_MPS_PIPE_DIRECTORY", b"").decode() == pipe:
            try:
                out.append((int(d), env.get(b"CUDA_VISIBLE_DEVICES", b"").decode(), psutil.Process(int(d)).create_time()))
            except psutil.Error:   # it exited since: not a daemon now
                continue
    return out


@pytest.fixture
def mps_dirs(tmp_path_factory, monkeypatch):
    d = tmp_path_factory.mktemp("mpsr")     # under /tmp: an allowed place for MPS directories
    monkeypatch.setenv("PATH", f"{STANDINS}:{os.environ['PATH']}")
    yield d
    for pid, _, _ in daemons(f"{d}/pipe"):      # never leave a daemon behind
        os.kill(pid, 15)


def doc(d, gpus, ports, with_triton=True):
    doc = profile_dict(d, ports) if with_triton else {"name": "mps-only"}
    if with_triton:
        doc["triton"]["gpu"] = 0
    doc["mps"] = {"pipe_dir": f"{d}/pipe", "log_dir": f"{d}/log", "gpus": gpus, "user": USER}
    return parse_profile_text(dump(doc), str(d / "p.yaml"))


def engine(prof, d, only=("mps",)):
    return Engine(prof, only=list(only), state_dir=str(d / "state"), backends=Backends(nvml=ReplayNvml(DGX)))


def test_verify_reads_the_running_daemon_and_apply_restarts_it(mps_dirs):
    d = mps_dirs
    rep = engine(doc(d, [0], None, with_triton=False), d).apply()
    assert not rep.error, rep.error
    [(pid, visible, _)] = daemons(f"{d}/pipe")
    assert visible == "0"
    res = {r.key: r for r in engine(doc(d, [0], None, with_triton=False), d).verify()}
    assert res["running_daemon"].status == OK
    changed = doc(d, [0, 1], None, with_triton=False)
    res = {r.key: r for r in engine(changed, d).verify()}
    r = res["running_daemon"]
    assert r.status == DRIFT and f"pid {pid}" in r.reason and "gpus '0', profile '0,1'" in r.reason, r.reason
    rep = engine(changed, d).apply()
    assert not rep.error, rep.error
    [(pid2, visible, _)] = daemons(f"{d}/pipe")
    assert pid2 != pid and visible == "0,1" and gone(pid)
    assert {r.key: r for r in engine(changed, d).verify()}["running_daemon"].status == OK


@needs_server
def test_the_triton_client_is_stopped_before_and_started_after(mps_dirs):
    d = mps_dirs
    ports = free_ports(3)
    prof = doc(d, [0], ports)
    assert not engine(prof, d).apply().error
    t = triton.section(prof)
    render.write_repository(t)
    st = launch.start(t)
    try:
        launch.wait_ready(t)
        old_server = st["pid"]
        changed = doc(d, [0, 1], ports)
        rep = engine(changed, d).apply()
        assert not rep.error, rep.error
        [(_, visible, daemon_started)] = daemons(f"{d}/pipe")
        assert visible == "0,1"
        new = launch.status(t)
        assert new["active"] and new["pid"] != old_server and gone(old_server)
        assert psutil.Process(new["pid"]).create_time() >= daemon_started   # started after the new daemon
        assert psutil.Process(new["pid"]).environ()["CUDA_MPS_PIPE_DIRECTORY"] == f"{d}/pipe"
    finally:
        launch.stop(t)
