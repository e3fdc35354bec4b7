"""On a GPU host: the unit and the container command pin the service to the CPUs NVML reports for the GPU."""
from __future__ import annotations

import pytest

from hkgpu_tune.backends import Backends
from hkgpu_tune.backends.nvml import Nvml
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.serve.running import forms

from .conftest import dump, profile_dict


def _driver():
    nv = Nvml()
    try:
        return nv.available()
    finally:
        nv.close()


OK, WHY = _driver()


@pytest.mark.gpu
@pytest.mark.skipif(not OK, reason=f"no NVIDIA driver here: {WHY}")
def test_placement_follows_nvml_cpu_affinity(tmp_path):
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    doc["triton"].update(gpu=0, launch="container", image="tritonserver:24.08-py3")
    t = parse_profile_text(dump(doc), "p.yaml").section("triton")
    b = Backends()
    try:
        want = b.nvml.gpu(0, ("cpu_affinity",))["cpu_affinity"]
        place = forms.placement(t, b)
    finally:
        b.close()
    assert set(place["cpus"]) <= set(want) and place["cpus"], place
    argv = forms.container_argv(t, place)
    assert argv[argv.index("--cpuset-cpus") + 1] == forms.cpu_list(place["cpus"])
    assert argv[argv.index("--gpus") + 1] == "device=0"
