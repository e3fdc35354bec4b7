"""A Triton service on one MIG device, named by its UUID (triton.gpu: MIG-...), against the MIG
records of tests/fixtures/gpu (an A30 laid out as 2 x 2g.12gb, MIG-...0301 and MIG-...0401). The
server sees that device alone (CUDA_VISIBLE_DEVICES and the NVIDIA container toolkit's --gpus
device=MIG-..., as NVIDIA's MIG user guide and the toolkit's "Specialized Configurations with
Docker" name it), as device 0; its CPUs come from the parent GPU; the plan key names the profile."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from hkgpu_tune.backends import Backends
from hkgpu_tune.backends.nvml import ReplayNvml
from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.serve.repository import render, tensorrt
from hkgpu_tune.serve.running import forms

from .conftest import dump, profile_dict

FIX = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "gpu")
STANDINS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "standins")
MIG_A = "MIG-a30a30a3-0000-5000-8000-000000000301"
MIG_B = "MIG-a30a30a3-0000-5000-8000-000000000401"


def a30_host(second_is_1g=False) -> Backends:
    """GPU 0: an A100 with MIG off on NUMA node 0; GPU 1: the recorded A30 with its two MIG devices
    on NUMA node 1 (the A30 record's own fields, placed second)."""
    a100 = json.load(open(os.path.join(FIX, "mig-a100.json")))["gpu"]
    a30 = json.load(open(os.path.join(FIX, "mig-a30.json")))["gpu"]
    g0 = dict(a100["gpus"][0], index=0, numa_node=0, cpu_affinity=[0])
    g1 = dict(copy.deepcopy(a30["gpus"][0]), index=1, numa_node=1, cpu_affinity=[1])
    if second_is_1g:   # MIG-...0401 on a 1g.6gb GPU instance (profile id 14) instead of 2g.12gb
        g1["mig_instances"][1].update(profile_id=14, size=1, name="1g.6gb")
    return Backends(nvml=ReplayNvml({"driver": a30["driver"], "gpus": [g0, g1]}))


def write(tmp_path, gpu, groups=None, name="svc", **top) -> str:
    doc = profile_dict(tmp_path / name, (18000, 18001, 18002))
    doc["triton"].update(gpu=gpu, unit=f"triton-{name}", **top)
    if groups is not None:
        doc["triton"]["models"][0]["instance_group"] = groups
    f = tmp_path / f"{name}.yaml"
    f.write_text(dump(doc))
    return str(f)


def service(tmp_path, gpu, groups=None, name="svc", **top):
    f = write(tmp_path, gpu, groups, name, **top)
    return parse_profile_text(open(f).read(), f).section("triton")


def test_binary_form_sees_exactly_the_mig_device_as_device_0(tmp_path):
    t = service(tmp_path, MIG_B, [{"count": 2, "kind": "KIND_GPU", "gpus": [1]}])
    assert t.mig == MIG_B and t.gpu is None
    assert t.models[0].config["instance_group"][0]["gpus"] == [0]        # the parent GPU 1 is 0 inside
    assert "gpus: 0" in render.render_config(t.models[0])
    env = forms.server_env(t)
    assert env["CUDA_VISIBLE_DEVICES"] == MIG_B
    place = {"cpus": [1], "mems": [1], "numa_node": 1, "source": "test"}
    assert f"Environment=CUDA_VISIBLE_DEVICES={MIG_B}" in forms.render_unit(t, place).splitlines()
    # no gpus in the group: the server's one device
    t = service(tmp_path, MIG_B, [{"count": 1, "kind": "KIND_GPU"}], name="nogpus")
    assert "gpus" not in t.models[0].config["instance_group"][0]


def test_container_form_uses_the_toolkits_device_form_and_docker_accepts_it(tmp_path):
    t = service(tmp_path, MIG_A, launch="container", image="tritonserver:24.08-py3")
    argv = forms.container_argv(t, {"cpus": [0]})
    assert argv[argv.index("--gpus") + 1] == f"device={MIG_A}"
    assert not any(a.startswith("CUDA_VISIBLE_DEVICES") for a in argv)
    images = tmp_path / "images.json"
    images.write_text(json.dumps({"tritonserver:24.08-py3": {"backends": ["python"], "tensorrt": None}}))
    env = dict(os.environ, STANDIN_DOCKER_IMAGES=str(images))

    def docker(gpus):
        return subprocess.run([os.path.join(STANDINS, "docker"), "run", "--rm", "--gpus", gpus,
                               "tritonserver:24.08-py3", "ls", "/opt/tritonserver/backends"],
                              capture_output=True, text=True, env=env)
    ok = docker(f"device={MIG_A}")
    assert ok.returncode == 0 and ok.stdout.split() == ["python"], ok.stderr
    bad = docker("device=MIG-a30a30a3")          # a cut UUID: the toolkit knows no such device
    assert bad.returncode == 125 and "device error: MIG-a30a30a3: unknown device" in bad.stderr
    two = docker(f"device={MIG_A},{MIG_B}")      # unquoted: Docker reads a second CSV field
    assert two.returncode == 125 and "invalid argument" in two.stderr


@pytest.mark.parametrize("gpu, msg", [
    ("MIG-a30a30a3-0000-5000-8000-00000000030", "expected a GPU index or a MIG device UUID"),
    ("MIG-A30A30A3-0000-5000-8000-000000000301", "expected a GPU index or a MIG device UUID"),
    ("GPU-3a30a30a-0000-4000-8000-00000000a300", "expected a GPU index or a MIG device UUID"),
    ([MIG_A, MIG_B], "a MIG device is named alone"),
    ([0, MIG_A], "a MIG device is named alone"),
])
def test_a_malformed_or_listed_mig_uuid_is_refused_at_its_line(tmp_path, gpu, msg):
    f = write(tmp_path, gpu)
    with pytest.raises(HkError) as e:
        parse_profile_text(open(f).read(), f)
    assert msg in str(e.value) and "triton.gpu" in str(e.value) and f"{f}:" in str(e.value), str(e.value)
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "triton", "command", "-p", f],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "Traceback" not in p.stderr and msg in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_group_naming_two_gpus_on_a_mig_device_is_refused(tmp_path):
    with pytest.raises(HkError, match="the server sees one MIG device"):
        service(tmp_path, MIG_A, [{"count": 1, "kind": "KIND_GPU", "gpus": [0, 1]}])


def test_placement_comes_from_the_parent_gpu(tmp_path):
    b = a30_host()
    t = service(tmp_path, MIG_B, launch="container", image="tritonserver:24.08-py3")
    place = forms.placement(t, b)
    assert place["numa_node"] == 1 and place["mems"] == [1], place          # GPU 1's node, not GPU 0's
    gone = service(tmp_path, "MIG-00000000-0000-5000-8000-000000000000", name="gone")
    place = forms.placement(gone, b)
    assert place["mems"] == [] and "no MIG device MIG-00000000-0000-5000-8000-000000000000" in place["source"]


def test_the_plan_key_names_the_mig_profile(tmp_path):
    b = a30_host(second_is_1g=True)
    assert tensorrt.gpu_name(b, MIG_A) == "NVIDIA A30 MIG 2g.12gb"
    assert tensorrt.gpu_name(b, MIG_B) == "NVIDIA A30 MIG 1g.6gb"
    assert tensorrt.gpu_name(b, 1) == "NVIDIA A30"
    assert tensorrt.gpu_name(b, "MIG-00000000-0000-5000-8000-000000000000") == "unknown MIG device"
    assert tensorrt.gpu_name(Backends(nvml=ReplayNvml.missing("no NVML")), MIG_A) == "unknown MIG device"


def test_verify_names_a_missing_mig_device_as_drift_never_ok(tmp_path):
    from hkgpu_tune.tune.engine import Engine

    def mig_result(gpu, b):
        f = write(tmp_path, gpu, name="v" + str(abs(hash(gpu)) % 1000))
        prof = parse_profile_text(open(f).read(), f)
        res = Engine(prof, only=["triton"], state_dir=str(tmp_path / "state"), backends=b).verify()
        return [r for r in res if r.key == "mig_device"]
    [r] = mig_result(MIG_B, a30_host())
    assert (r.target, r.status, r.current) == (MIG_B, "ok", "2g.12gb on GPU 1")
    [r] = mig_result("MIG-00000000-0000-5000-8000-000000000000", a30_host())
    assert r.status == "drift" and r.current == "absent" and "do not survive a GPU reset" in r.reason
    [r] = mig_result(MIG_B, Backends(nvml=ReplayNvml.missing("NVML library not found")))
    assert r.status == "unsupported" and "NVML library not found" in r.reason
    assert mig_result(1, a30_host()) == []


def test_an_mps_client_on_a_mig_device_keeps_its_uuid(tmp_path):
    """NVIDIA's MPS guide: a UUID in CUDA_VISIBLE_DEVICES means the same device to the daemon and its
    clients (indices are renumbered among the daemon's); the daemon must serve that MIG device."""
    from hkgpu_tune.serve.schema.config import section
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    doc["triton"].update(gpu=MIG_A, launch="binary")
    doc["mps"] = {"pipe_dir": f"{tmp_path}/pipe", "log_dir": f"{tmp_path}/log", "gpus": [MIG_A]}
    f = tmp_path / "mps.yaml"
    f.write_text(dump(doc))
    t = section(parse_profile_text(f.read_text(), str(f)))
    env = forms.server_env(t)
    assert env["CUDA_VISIBLE_DEVICES"] == MIG_A and env["CUDA_MPS_PIPE_DIRECTORY"] == f"{tmp_path}/pipe"
    for gpus, msg in (([MIG_B], f"GPU {MIG_A} is not one the MPS daemon serves"),
                      ([0], f"GPU {MIG_A} is not one the MPS daemon serves"),
                      (None, "an MPS daemon serves a MIG device named in mps.gpus")):
        if gpus is None:
            doc["mps"].pop("gpus")
        else:
            doc["mps"]["gpus"] = gpus
        f.write_text(dump(doc))
        with pytest.raises(HkError, match=msg):
            section(parse_profile_text(f.read_text(), str(f)))


def test_the_mps_client_check_reads_the_parent_gpus_processes(tmp_path, monkeypatch):
    from hkgpu_tune.serve.running import launch as launch_mod
    from hkgpu_tune.subsystems.triton import Plugin
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    doc["triton"].update(gpu=MIG_B)
    doc["mps"] = {"pipe_dir": f"{tmp_path}/pipe", "log_dir": f"{tmp_path}/log", "gpus": [MIG_B]}
    f = tmp_path / "mps.yaml"
    f.write_text(dump(doc))
    b = a30_host()
    b.nvml.facts["gpus"][1]["processes"] = {"compute": [4242], "mps": [4242]}    # GPU 1: the parent
    monkeypatch.setattr(launch_mod, "server_pids", lambda t, backends=None: [4242])
    plug = Plugin(parse_profile_text(f.read_text(), str(f)), b).services[0]   # the profile's one service
    st = plug._mps_clients(plug.t)
    assert st["mps"] == [4242], st
    r = plug._mps_result(plug.t, st)
    assert (r.target, r.status) == (MIG_B, "ok")
    b.nvml.facts["gpus"][1]["processes"] = {"compute": [4242], "mps": []}
    r = plug._mps_result(plug.t, plug._mps_clients(plug.t))
    assert (r.target, r.status, r.current) == (MIG_B, "drift", "own context")


def test_health_names_the_triton_services_mig_device(tmp_path):
    from hkgpu_tune.observe import health
    f = write(tmp_path, MIG_B)
    p = parse_profile_text(open(f).read(), f)
    assert health.named_mig(p) == [MIG_B]
    r = health.check(p, nvml=a30_host().nvml, kmsg_events=[])
    assert [(c.target, c.status) for c in r.checks if c.name == "mig_device"] == [(MIG_B, "ok")]


def test_the_cli_prints_the_mig_device_in_the_command(tmp_path):
    """`hkgpu-tune triton command` as a user runs it (a host without NVML: placement falls back to
    every CPU and says why, the device form does not depend on it)."""
    f = write(tmp_path, MIG_A, launch="container", image="tritonserver:24.08-py3")
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "triton", "command", "-p", f, "--json"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)["argv"]
    assert got[:7] == ["docker", "run", "--rm", "--name", "triton-svc", "--gpus", f"device={MIG_A}"]
