"""Triton as an MPS client: the mps section's directories in the unit, the container command and the
process's environment; verify asks NVML (a swapped backend here) whether Triton's processes are
MPS clients; compute mode exclusive_process works through MPS."""
from __future__ import annotations

import psutil
import pytest

from hkgpu_tune.backends import Backends
from hkgpu_tune.backends.nvml import ReplayNvml
from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.core.report import DRIFT, OK, UNSUPPORTED
from hkgpu_tune.subsystems import triton
from hkgpu_tune.serve.repository import render
from hkgpu_tune.serve.running import forms, launch

from .conftest import dump, free_ports, needs_server, profile_dict

PLACE = {"cpus": [0, 1], "mems": [0], "numa_node": 0, "source": "test placement"}


def profile(tmp_path, ports=(18000, 18001, 18002), mps=True, **top):
    doc = profile_dict(tmp_path, ports)
    doc["triton"].update(top)
    if mps:
        doc["mps"] = {"pipe_dir": f"{tmp_path}/mps-pipe", "log_dir": f"{tmp_path}/mps-log"}
    return parse_profile_text(dump(doc), str(tmp_path / "p.yaml"))


@pytest.fixture
def tmp_dir(tmp_path_factory):
    """MPS directories must be under /run, /tmp, ...: pytest's base directory is under /tmp."""
    return tmp_path_factory.mktemp("mps")


def test_unit_carries_the_mps_directories(tmp_dir):
    t = triton.section(profile(tmp_dir, gpu=0))
    lines = forms.render_unit(t, PLACE).splitlines()
    for d, var in ((f"{tmp_dir}/mps-pipe", "CUDA_MPS_PIPE_DIRECTORY"), (f"{tmp_dir}/mps-log", "CUDA_MPS_LOG_DIRECTORY")):
        assert f"Environment={var}={d}" in lines
        assert f"BindPaths={d}" in lines and f"ReadWritePaths={d}" in lines
    # without the mps section (or with it disabled) none of it
    for prof in (profile(tmp_dir, gpu=0, mps=False),):
        assert "CUDA_MPS" not in forms.render_unit(triton.section(prof), PLACE)
    doc = profile_dict(tmp_dir, (18000, 18001, 18002))
    doc["mps"] = {"enabled": False, "pipe_dir": f"{tmp_dir}/mps-pipe"}
    off = parse_profile_text(dump(doc), str(tmp_dir / "off.yaml"))
    assert triton.section(off).mps is None


def test_container_command_carries_the_mps_directories(tmp_dir):
    t = triton.section(profile(tmp_dir, launch="container", image="tritonserver:24.08-py3", gpu=0))
    argv = forms.container_argv(t, PLACE)
    pipe, log = f"{tmp_dir}/mps-pipe", f"{tmp_dir}/mps-log"
    i = argv.index("--ipc=host")
    assert argv[i + 1:i + 9] == ["-e", f"CUDA_MPS_PIPE_DIRECTORY={pipe}", "-e", f"CUDA_MPS_LOG_DIRECTORY={log}",
                                 "-v", f"{pipe}:{pipe}", "-v", f"{log}:{log}"]
    assert argv.index("--ipc=host") < argv.index("tritonserver:24.08-py3")
    plain = forms.container_argv(triton.section(profile(tmp_dir, mps=False, launch="container",
                                                         image="tritonserver:24.08-py3")), PLACE)
    assert "--ipc=host" not in plain and not any("CUDA_MPS" in a for a in plain)


def test_exclusive_process_with_mps_is_a_valid_pairing(tmp_dir):
    """Under MPS only the MPS server holds a context on the GPU, so EXCLUSIVE_PROCESS (NVIDIA's
    recommended mode with MPS) lets Triton and its Python stubs share the GPU through it."""
    doc = profile_dict(tmp_dir, (18000, 18001, 18002))
    doc["triton"]["gpu"] = 0
    doc["gpu"] = {"compute_mode": "exclusive_process"}
    doc["mps"] = {"pipe_dir": f"{tmp_dir}/mps-pipe", "log_dir": f"{tmp_dir}/mps-log"}
    prof = parse_profile_text(dump(doc), str(tmp_dir / "p.yaml"))
    assert prof.section("gpu") is not None
    t = triton.section(prof)
    assert forms.server_env(t)["CUDA_MPS_PIPE_DIRECTORY"] == f"{tmp_dir}/mps-pipe"


class FakeNvml(ReplayNvml):
    def __init__(self, compute=(), mps=()):
        super().__init__({"driver": {}, "gpus": [{"name": "fake", "processes": {"compute": list(compute),
                                                                               "mps": list(mps)}}]})


@needs_server
@pytest.mark.slow
def test_process_env_and_verify_of_mps_clients(tmp_dir):
    (tmp_dir / "mps-pipe").mkdir()
    (tmp_dir / "mps-log").mkdir()
    prof = profile(tmp_dir, ports=free_ports(3), gpu=0)
    t = triton.section(prof)
    render.write_repository(t)
    st = launch.start(t)
    try:
        launch.wait_ready(t)
        env = psutil.Process(st["pid"]).environ()
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"{tmp_dir}/mps-pipe"
        assert env["CUDA_MPS_LOG_DIRECTORY"] == f"{tmp_dir}/mps-log"
        pids = launch.server_pids(t)
        assert pids[0] == st["pid"] and len(pids) >= 2  # the server and its Python stub

        def check(nvml):
            res = [r for r in Engine(prof, only=["triton"], backends=Backends(nvml=nvml)).verify()
                   if r.key == "mps_client"]
            assert len(res) == 1 and res[0].target == "gpu0"
            return res[0]

        stub = pids[-1]
        r = check(FakeNvml(compute=[999999], mps=[stub]))
        assert r.status == OK and r.reason == f"pid {stub} in NVML's MPS client list"
        r = check(FakeNvml(compute=[st["pid"]]))
        assert r.status == DRIFT and r.reason.startswith(f"pid {st['pid']} holds a CUDA context of its own")
        r = check(FakeNvml())
        assert r.status == DRIFT and r.reason.startswith("no Triton process (pids ")
        r = check(ReplayNvml.missing())
        assert r.status == UNSUPPORTED and "NVML library not found" in r.reason
        # a running server without the MPS environment is drift in its command (apply restarts it)
        plain = profile(tmp_dir, ports=(t.http.port, t.grpc.port, t.metrics.port), gpu=0, mps=False)
        res = {r.key: r for r in Engine(plain, only=["triton"]).verify()}
        assert res["command"].status == DRIFT and res["command"].reason.startswith("the running server's env differs")
    finally:
        launch.stop(t)
