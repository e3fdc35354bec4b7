"""The two launch forms as rendered: the systemd unit and the exact container command."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.serve.running import forms, records

from tests.helpers import processes

from .conftest import dump, profile_dict

PLACE = {"cpus": [0, 1, 2, 3, 8, 9], "mems": [0], "numa_node": 0, "source": "test placement"}


def section(tmp_path, **top):
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    del doc["triton"]["user"]   # the forms as rendered without a user
    doc["triton"].update(top)
    return parse_profile_text(dump(doc), str(tmp_path / "p.yaml")).section("triton")


def test_container_command_is_exactly_this(tmp_path):
    t = section(tmp_path, launch="container", image="tritonserver:24.08-py3", gpu=3, runtime="podman",
                shm_size="2g", http={"port": 9000, "address": "10.0.0.5"})
    argv = forms.container_argv(t, PLACE)
    assert argv == [
        "podman", "run", "--rm", "--name", "hkgpu-triton",
        "--gpus", "device=3", "--network", "host",
        "--ulimit", "memlock=-1", "--ulimit", "stack=67108864", "--shm-size", "2g",
        "--cpuset-cpus", "0-3,8-9", "--cpuset-mems", "0",
        "--volume", f"{tmp_path}/models:/models:ro",
        "tritonserver:24.08-py3", "tritonserver",
        "--model-repository=/models", "--model-control-mode=explicit", "--load-model=doubler",
        "--http-address=10.0.0.5", "--http-port=9000",
        "--grpc-address=127.0.0.1", "--grpc-port=18001",
        "--metrics-address=127.0.0.1", "--metrics-port=18002",
        "--allow-metrics=true", "--metrics-config=summary_latencies=true",
        "--metrics-config=summary_quantiles=0.5:0.05,0.95:0.01,0.99:0.001",
        "--strict-readiness=true", "--exit-on-error=true", "--exit-timeout-secs=30",
        # triton.connections' defaults: long-lived client connections
        "--grpc-keepalive-time=60000", "--grpc-keepalive-timeout=20000", "--grpc-keepalive-permit-without-calls=1",
        "--grpc-http2-max-pings-without-data=0", "--grpc-http2-min-recv-ping-interval-without-data=10000",
        "--grpc-http2-max-ping-strikes=2",
    ]
    # the CLI prints the same argv
    f = tmp_path / "c.yaml"
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    doc["triton"].update(launch="container", image="tritonserver:24.08-py3", gpu=0)
    f.write_text(dump(doc))
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "triton", "command", "-p", str(f), "--json"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)["argv"]
    assert got[:7] == ["docker", "run", "--rm", "--name", "hkgpu-triton", "--gpus", "device=0"]
    assert "--cpuset-cpus" in got and f"{tmp_path}/models:/models:ro" in got
    assert "--backend-directory" not in " ".join(got)  # the image has its own backends


def test_binary_unit_pins_hardens_and_binds_loopback(tmp_path):
    t = section(tmp_path, user="triton-server", gpu=1)
    text = forms.render_unit(t, PLACE)
    lines = text.splitlines()
    for want in ("User=triton-server", "LimitMEMLOCK=infinity", "CPUAffinity=0-3,8-9", "NUMAPolicy=bind",
                 "NUMAMask=0", "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes",
                 "ProtectHome=yes", "Environment=CUDA_VISIBLE_DEVICES=1", "WantedBy=multi-user.target"):
        assert want in lines, want
    exec_line = next(x for x in lines if x.startswith("ExecStart="))
    for flag in ("--strict-readiness=true", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                 "--metrics-address=127.0.0.1", f"--model-repository={tmp_path}/models", "--http-port=18000"):
        assert flag in exec_line.split(), flag
    assert "0.0.0.0" not in text
    assert not any(x.startswith("User=root") for x in lines)


def test_wildcard_bind_only_when_asked(tmp_path):
    t = section(tmp_path, http={"port": 18000, "address": "0.0.0.0"})
    assert "--http-address=0.0.0.0" in forms.server_args(t)
    assert t.http.host == "127.0.0.1"  # clients on the node still use loopback


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_unit_passes_systemd_analyze_verify(tmp_path):
    t = section(tmp_path, user="triton-server")
    unit = tmp_path / "hkgpu-triton.service"
    unit.write_text(forms.render_unit(t, PLACE))
    p = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    # a binary outside the analyser's view is reported as missing; every other remark is ours to fix
    remarks = [x for x in (p.stderr + p.stdout).splitlines() if x.strip() and "is not executable" not in x
               and "No such file" not in x]
    assert remarks == []


def test_container_unit_runs_the_container_in_the_foreground(tmp_path):
    t = section(tmp_path, launch="container", image="tritonserver:24.08-py3", gpu=0)
    text = forms.render_unit(t, PLACE)
    exec_line = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    assert exec_line.startswith(f"ExecStart={records.runtime_path('docker', required=False)} run --rm --name hkgpu-triton --gpus device=0 --network host")
    assert "--detach" not in exec_line
    assert f"ExecStop={records.runtime_path('docker', required=False)} stop --time 40 hkgpu-triton" in text


def test_cpu_list_and_placement_fallback(tmp_path, monkeypatch):
    assert forms.cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert forms.cpu_list([3]) == "3"
    import os
    from hkgpu_tune.backends import topology
    from hkgpu_tune.core.errors import HkError
    t = section(tmp_path)
    p = forms.placement(t)
    assert p["cpus"] == sorted(os.sched_getaffinity(0)) and p["source"] == "no GPU named; all CPUs"

    def unreadable(backends, gpu):
        raise HkError("GPU 0: NVML is not available")
    monkeypatch.setattr(topology, "service_placement", unreadable)
    p = forms.placement(section(tmp_path, gpu=0))
    assert p["cpus"] == sorted(os.sched_getaffinity(0))
    assert p["source"] == "placement: GPU 0: NVML is not available; all CPUs"


def test_the_record_names_the_server_only_by_program_start_time_session_and_user():
    """A recycled pid, another program under that pid (even one named like the server), a process
    that does not lead the session we gave the server, or one of another user is not the server:
    root signals its process group only when all of them match what it started."""
    import subprocess

    from hkgpu_tune.serve.running.launch import _alive, _start_ticks
    p = subprocess.Popen(["/bin/sleep", "30"], start_new_session=True)
    q = subprocess.Popen(["/bin/sleep", "30"])   # same program, not a session leader
    try:
        st = {"pid": p.pid, "start_ticks": _start_ticks(p.pid), "argv": ["/bin/sleep", "30"], "user": None}
        assert _alive(st)
        assert not _alive({**st, "start_ticks": st["start_ticks"] + 1})        # a recycled pid
        assert not _alive({**st, "argv": ["/opt/x/sleep", "30"]})               # another program, same name
        assert not _alive({**st, "argv": ["/bin/sleep", "31"]})                 # other arguments
        assert not _alive({**st, "user": "nobody"})                             # another user
        assert not _alive({**st, "pid": q.pid, "start_ticks": _start_ticks(q.pid)})   # not its own session
    finally:
        for x in (p, q):
            x.kill()
            x.wait()


@pytest.mark.skipif(importlib.util.find_spec("pytriton") is None, reason="needs the nvidia-pytriton wheel")
def test_a_link_planted_at_the_process_record_is_refused_and_no_server_is_left(tmp_path):
    """The record of the supervised server (run_dir/tritonserver.json) is written without following
    links; a link planted there is refused in one line, its target untouched, and the server just
    started is stopped (without its record nothing could stop it later)."""
    from hkgpu_tune.core.errors import HkError
    from hkgpu_tune.core.profile import load_profile
    from hkgpu_tune.serve.repository import render
    from hkgpu_tune.serve.running import forms, launch
    from .conftest import free_ports
    p = tmp_path / "p.yaml"
    p.write_text(dump(profile_dict(tmp_path, free_ports(3))))
    t = load_profile(str(p)).section("triton")
    render.write_repository(t)
    os.makedirs(t.run_dir, exist_ok=True)
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    os.symlink(victim, os.path.join(t.run_dir, forms.PID_FILE))
    with pytest.raises(HkError, match="refusing to replace it: it is a link|Too many levels of symbolic links"):
        launch.start(t)
    assert victim.read_text() == "keep me\n"
    # this test's server only (its command line names tmp_path): other runs on the machine start
    # and stop their own servers meanwhile
    left = processes(lambda q: str(tmp_path) in " ".join(q.info["cmdline"] or []))
    assert left == [], [q.info["cmdline"] for q in left]


def test_every_launch_form_has_its_class():
    from hkgpu_tune.serve.running.form_base import FORMS, form
    from hkgpu_tune.serve.schema.config import LAUNCH_FORMS
    assert sorted(FORMS) == sorted(LAUNCH_FORMS)
    assert all(form(name).name == name for name in LAUNCH_FORMS)
