"""One Triton service per GPU or per set of GPUs on an 8-GPU node (the DGX H100 recorded in
tests/fixtures/gpu: NVML facts and `nvidia-smi topo -m`). The server sees only its GPUs, renumbered
from 0 (CUDA's CUDA_VISIBLE_DEVICES, docker's --gpus device=...); every GPU id the profile names
(NVML's numbering) is mapped to the one the server sees, and a GPU outside the set is refused."""
from __future__ import annotations

import os

import pytest

from hkgpu_tune.backends import Backends
from hkgpu_tune.backends.nvml import ReplayNvml
from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.serve.repository import render
from hkgpu_tune.serve.running import forms

from .conftest import dump, profile_dict

FIX = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "gpu")


# The NUMA node of each service's GPUs, written down by hand from the DGX H100's documented layout
# (two sockets: GPUs 0-3 under socket 0, GPUs 4-7 under socket 1), not read from the fixture files
# that the replayed NVML facts were generated from (tests/fixtures/gpu/make_dgx_h100.py): a check
# derived from its own input would agree with any mistake in it.
SERVICE_NUMA = {"low": 0, "high": 1}


def service(tmp_path, gpu, groups, name="svc", **top):
    doc = profile_dict(tmp_path / name, (18000, 18001, 18002))
    doc["triton"].update(gpu=gpu, unit=f"triton-{name}", **top)
    doc["triton"]["models"][0]["instance_group"] = groups
    f = tmp_path / f"{name}.yaml"
    f.write_text(dump(doc))
    return parse_profile_text(f.read_text(), str(f)).section("triton")


def test_a_single_gpu_is_device_0_inside(tmp_path):
    t = service(tmp_path, 3, [{"count": 2, "kind": "KIND_GPU", "gpus": [3]}])
    assert t.models[0].config["instance_group"][0]["gpus"] == [0]
    assert "gpus: 0" in render.render_config(t.models[0])
    env = forms.server_env(t)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_two_services_of_four_gpus_on_an_8_gpu_node(tmp_path):
    b = Backends(nvml=ReplayNvml(os.path.join(FIX, "dgx-h100-8gpu.json")))
    for name, gpus in (("low", [0, 1, 2, 3]), ("high", [4, 5, 6, 7])):
        groups = [{"count": 1, "kind": "KIND_GPU", "gpus": [g]} for g in gpus]
        t = service(tmp_path, gpus, groups, name=name, launch="container", image="tritonserver:24.08-py3")
        assert [g["gpus"] for g in t.models[0].config["instance_group"]] == [[0], [1], [2], [3]]
        place = forms.placement(t, b)
        assert place["numa_node"] == SERVICE_NUMA[name] and place["mems"] == [SERVICE_NUMA[name]], place
        argv = forms.container_argv(t, place)
        assert argv[argv.index("--gpus") + 1] == f'"device={",".join(map(str, gpus))}"'
        assert f"Environment=CUDA_VISIBLE_DEVICES={','.join(map(str, gpus))}" in \
            forms.render_unit(service(tmp_path, gpus, groups, name=name + "-bin"), place).splitlines()


def test_a_gpu_outside_the_set_is_refused_at_its_line(tmp_path):
    with pytest.raises(HkError) as e:
        service(tmp_path, [4, 5, 6, 7], [{"count": 1, "kind": "KIND_GPU", "gpus": [4, 2]}])
    msg = str(e.value)
    assert "GPU 2 is not one this server sees (triton.gpu: [4, 5, 6, 7])" in msg and "instance_group" in msg, msg
    with pytest.raises(HkError, match="distinct GPU indices"):
        service(tmp_path, [1, 1], [{"count": 1, "kind": "KIND_GPU"}])


def test_an_mps_client_counts_among_the_daemons_gpus(tmp_path):
    """NVIDIA's MPS guide: a client's CUDA_VISIBLE_DEVICES is read among the devices its control
    daemon sees (the daemon's own CUDA_VISIBLE_DEVICES), so GPU 5 of a daemon serving 4-7 is 1."""
    from hkgpu_tune.serve.schema.config import section
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    doc["triton"].update(gpu=[5, 6], launch="binary")
    doc["triton"]["models"][0]["instance_group"] = [{"count": 1, "kind": "KIND_GPU", "gpus": [6]}]
    doc["mps"] = {"pipe_dir": f"{tmp_path}/pipe", "log_dir": f"{tmp_path}/log", "gpus": [4, 5, 6, 7]}
    f = tmp_path / "mps.yaml"
    f.write_text(dump(doc))
    t = section(parse_profile_text(f.read_text(), str(f)))
    assert forms.server_env(t)["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert t.models[0].config["instance_group"][0]["gpus"] == [1]        # among the server's 5, 6
    container = section(parse_profile_text(f.read_text().replace("launch: binary", "launch: container\n  image: x"),
                                           str(f)))
    argv = forms.container_argv(container, {"cpus": [0]})
    assert argv[argv.index("--gpus") + 1] == '"device=5,6"'               # the runtime counts the host's
    doc["triton"]["gpu"] = [3]
    doc["triton"]["models"][0]["instance_group"][0]["gpus"] = [3]
    f.write_text(dump(doc))
    with pytest.raises(HkError, match=r"GPU 3 is not one the MPS daemon serves \(mps.gpus: \[4, 5, 6, 7\]\)"):
        section(parse_profile_text(f.read_text(), str(f)))
