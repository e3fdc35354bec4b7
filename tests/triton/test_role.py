"""The hkgpu_triton role with real ansible-playbook (local connection, everything under a temp dir):
converge starts a real tritonserver and passes the gate; a second run changes nothing; an
impossible SLO fails the play with the measured figures."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from hkgpu_tune.core.profile import load_profile
from hkgpu_tune.serve.running import launch

from .conftest import MODEL_PY, free_ports, needs_server

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
pytestmark = [needs_server, pytest.mark.slow,
              pytest.mark.skipif(not shutil.which("ansible-playbook") or not shutil.which("hkgpu-tune"),
                                 reason="needs ansible-playbook and the hkgpu-tune console script")]

PLAY = """\
- name: Serve the test model
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: hkgpu_triton
"""


def play(tmp_path, extra=None):
    http, grpc, metrics = getattr(play, "ports", None) or free_ports(3)
    play.ports = (http, grpc, metrics)
    v = {
        "ansible_python_interpreter": sys.executable, "hkgpu_python": sys.executable, "hkgpu_cli": shutil.which("hkgpu-tune"),
        "hkgpu_profile_path": str(tmp_path / "etc" / "node.yaml"), "hkgpu_state_dir": str(tmp_path / "state"),
        "hkgpu_persist": False,
        # root by name: this test host has no unprivileged server user and creates none
        "hkgpu_triton_user": "root", "hkgpu_triton_create_user": False, "hkgpu_triton_gpu": None,
        "hkgpu_triton_supervisor": "process",
        "hkgpu_triton_model_repository": str(tmp_path / "models"), "hkgpu_triton_run_dir": str(tmp_path / "run"),
        "hkgpu_triton_http": {"port": http, "address": "127.0.0.1"},
        "hkgpu_triton_grpc": {"port": grpc, "address": "127.0.0.1"},
        "hkgpu_triton_metrics": {"port": metrics, "address": "127.0.0.1"},
        "hkgpu_triton_files": [{"src": MODEL_PY, "dest": str(tmp_path / "files" / "doubler.py")}],
        "hkgpu_triton_models": [{
            "name": "doubler", "backend": "python", "model_file": str(tmp_path / "files" / "doubler.py"),
            "max_batch_size": 16,
            "inputs": [{"name": "INPUT0", "data_type": "FP32", "dims": [4]}],
            "outputs": [{"name": "OUTPUT0", "data_type": "FP32", "dims": [4]}],
            "dynamic_batching": {"max_queue_delay_microseconds": 2000},
            "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}],
        "hkgpu_triton_gate": {"ready_timeout_s": 60, "warmup_requests": 4,
                              "load": {"requests": 32, "concurrency": 4}, "p99_ms": 5000},
    }
    v.update(extra or {})
    (tmp_path / "vars.json").write_text(json.dumps(v))
    (tmp_path / "play.yml").write_text(PLAY)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_ROLES_PATH=os.path.join(REPO, "roles"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-tmp"))
    return subprocess.run(["ansible-playbook", "-i", "localhost,", str(tmp_path / "play.yml"),
                           "-e", f"@{tmp_path / 'vars.json'}"], capture_output=True, text=True, env=env,
                          timeout=300)


def recap(out: str) -> dict:
    m = re.search(r"localhost\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", out)
    assert m, out[-3000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups())))


def test_role_converges_gates_and_is_idempotent(tmp_path):
    play.ports = None
    profile = tmp_path / "etc" / "node.yaml"
    try:
        p = play(tmp_path)
        assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
        assert recap(p.stdout)["changed"] >= 2  # the model file, the repository + service
        assert "triton gate passed: doubler: p99 " in p.stdout
        t = load_profile(str(profile)).section("triton")
        assert launch.status(t)["active"]
        # nothing changes the second time
        p = play(tmp_path)
        assert p.returncode == 0, p.stdout[-4000:]
        assert recap(p.stdout)["changed"] == 0, p.stdout[-4000:]
        # an impossible SLO: the play fails with the figures
        p = play(tmp_path, {"hkgpu_triton_gate": {"ready_timeout_s": 60, "warmup_requests": 2,
                                                  "load": {"requests": 16, "concurrency": 4}, "p99_ms": 0.001}})
        assert p.returncode == 2
        assert recap(p.stdout)["failed"] == 1
        assert "triton gate failed: doubler: p99 latency " in p.stdout and "over the SLO of 0.001 ms" in p.stdout
    finally:
        if profile.exists():
            launch.stop(load_profile(str(profile)).section("triton"))


def test_role_runs_several_services_each_gated(tmp_path):
    """hkgpu_triton_services: two servers from one play, each with its own unit, ports, repository
    and gate; both answer (read by hand over HTTP); the second run changes nothing."""
    import http.client
    play.ports = None
    services = []
    for unit in ("hk-role-a", "hk-role-b"):
        h, g, m = free_ports(3)
        services.append({"unit": unit, "http": {"port": h, "address": "127.0.0.1"},
                         "grpc": {"port": g, "address": "127.0.0.1"}, "metrics": {"port": m, "address": "127.0.0.1"},
                         "model_repository": str(tmp_path / unit / "models"), "run_dir": str(tmp_path / unit / "run")})
    profile = tmp_path / "etc" / "node.yaml"
    try:
        p = play(tmp_path, {"hkgpu_triton_services": services})
        assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
        for s in services:
            assert f"triton gate {s['unit']} passed: doubler: p99 " in p.stdout, p.stdout[-4000:]
            c = http.client.HTTPConnection("127.0.0.1", s["http"]["port"], timeout=10)
            c.request("GET", "/v2/models/doubler/ready")
            assert c.getresponse().status == 200
            c.close()
        p = play(tmp_path, {"hkgpu_triton_services": services})
        assert p.returncode == 0 and recap(p.stdout)["changed"] == 0, p.stdout[-4000:]
    finally:
        if profile.exists():
            from hkgpu_tune.serve.schema.config import services as every
            for t in every(load_profile(str(profile))):
                launch.stop(t)
