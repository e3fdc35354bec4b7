"""The container form: a plan is built by the serving image's trtexec (`docker run --rm IMAGE
trtexec ...`, the ONNX and plan directories mounted), the image's TensorRT version is in the plan's
key (an image upgrade makes the plan stale), and before the start the image is checked for each
model's backend (and torch for the torch engine), one line naming the model.

No Docker engine runs here: tests/standins/docker stands in for `docker run` (Docker's run
reference) over described images, and runs tests/standins/trtexec (trtexec's help text) for the
image's trtexec; tests/standins/triton_tensorrt.py is the load check of Triton's TensorRT backend."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from hkgpu_tune.backends import Backends
from hkgpu_tune.backends.nvml import ReplayNvml
from hkgpu_tune.core.errors import HkError, UnsupportedError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.core.report import DRIFT, OK
from hkgpu_tune.subsystems.triton import Plugin
from hkgpu_tune.serve.repository import render
from hkgpu_tune.serve.running import container, forms, launch
from tests.standins import triton_tensorrt

STANDINS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "standins")
DGX = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "gpu", "dgx-h100-8gpu.json")
IMAGE = "nvcr.io/nvidia/tritonserver:25.01-py3"


@pytest.fixture
def node(tmp_path, monkeypatch):
    """docker (the stand-in) on PATH and no trtexec on the host; the images it knows."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").symlink_to(os.path.join(STANDINS, "docker"))
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    images = tmp_path / "images.json"
    monkeypatch.setenv("STANDIN_DOCKER_IMAGES", str(images))
    monkeypatch.setenv("STANDIN_DOCKER_LOG", str(tmp_path / "docker.log"))
    container.forget()

    def set_images(**described):
        images.write_text(json.dumps(described))
        container.forget()
    set_images(**{IMAGE: {"backends": ["onnxruntime", "python", "pytorch", "tensorrt"], "tensorrt": "100700",
                          "torch": None}})
    yield set_images
    container.forget()


def write_profile(tmp_path, models: str, gpu="3"):
    (tmp_path / "resnet.onnx").write_text(json.dumps({"inputs": [{"name": "input"}], "outputs": [{"name": "output"}]}))
    f = tmp_path / "p.yaml"
    f.write_text(f"""\
triton:
  launch: container
  image: {IMAGE}
  model_repository: {tmp_path}/repo
  run_dir: {tmp_path}/run
  gpu: {gpu}
  models:
{models}""")
    return parse_profile_text(f.read_text(), str(f))


TRT = """\
    - name: resnet50
      platform: tensorrt_plan
      max_batch_size: 8
      inputs: [{name: input, data_type: FP16, dims: [3, 224, 224]}]
      outputs: [{name: output, data_type: FP16, dims: [1000]}]
      build: {onnx: resnet.onnx}
"""
TORCH = """\
    - name: r18
      platform: tensorrt_plan
      max_batch_size: 8
      inputs: [{name: input, data_type: FP32, dims: [3, 64, 64]}]
      outputs: [{name: output, data_type: FP32, dims: [1000]}]
      build: {torchvision: resnet18, image_size: 64}
"""


def docker_calls(tmp_path):
    return [json.loads(x) for x in (tmp_path / "docker.log").read_text().splitlines()]


def test_the_plan_is_built_in_the_image_that_serves_it(tmp_path, node):
    prof = write_profile(tmp_path, TRT)
    t = prof.section("triton")
    m = t.models[0]
    assert m.engine == "tensorrt" and "the container form" in m.engine_reason
    b = Backends(nvml=ReplayNvml(DGX))
    render.write_model(t, m, b)
    d = tmp_path / "repo" / "resnet50"
    triton_tensorrt.load(str(d))                                  # FP16 bindings, as the config says
    key = json.loads((d / "1" / "model.plan.key.json").read_text())
    assert key["key"]["tensorrt"] == "100700" and key["where"] == f"image {IMAGE}"
    build = next(c for c in docker_calls(tmp_path) if "--skipInference" in c)
    assert build[:7] == ["run", "--rm", "--network", "none", "--gpus", "device=3", "--volume"]
    assert build[build.index("--entrypoint") + 1:build.index("--entrypoint") + 3] == ["trtexec", IMAGE]
    # an image upgrade (its TensorRT) makes the plan stale: drift, not ok
    assert next(r for r in Plugin(prof, b).verify() if r.key == "repository").status == OK
    node(**{IMAGE: {"backends": ["python", "tensorrt"], "tensorrt": "100800", "torch": None}})
    r = next(r for r in Plugin(prof, b).verify() if r.key == "repository")
    assert r.status == DRIFT and "plan is stale: tensorrt changed" in r.reason, r.reason


def test_where_a_plan_can_be_built_is_the_launch_forms_to_say(tmp_path, node):
    from hkgpu_tune.serve.repository import tensorrt
    t = write_profile(tmp_path, TRT).section("triton")
    assert tensorrt.cannot_build(t) is None                           # the image has trtexec; the host has none
    node(**{IMAGE: {"backends": ["python", "tensorrt"], "tensorrt": None, "torch": None}})
    assert tensorrt.cannot_build(t) == f"image {IMAGE} has no trtexec"
    binary = dataclasses.replace(t, launch="binary")
    assert tensorrt.cannot_build(binary) == tensorrt.TRTEXEC_MISSING  # the host's trtexec decides
    with pytest.raises(UnsupportedError, match="trtexec not found"):
        tensorrt.runner(binary, t.models[0].build, str(tmp_path / "m.plan"))


def test_a_path_outside_the_mounts_is_not_seen_by_the_container(tmp_path, node):
    from hkgpu_tune.backends.command import Command
    (tmp_path / "n.onnx").write_text("{}")
    r = Command().run(["docker", "run", "--rm", "--entrypoint", "trtexec", IMAGE, f"--onnx={tmp_path}/n.onnx"])
    assert r.rc == 1 and "not inside the container" in r.err
    r = Command().run(["docker", "run", "--rm", "--gpus", "device=2,3", IMAGE, "ls"])
    assert r.rc == 125 and "--gpus" in r.err
    r = Command().run(["docker", "run", "--rm", "--privileged", IMAGE, "ls"])
    assert r.rc == 125 and "unknown flag: --privileged" in r.err


def test_the_image_is_checked_for_each_models_backend_before_the_start(tmp_path, node):
    node(**{IMAGE: {"backends": ["python"], "tensorrt": "100700", "torch": None}})
    t = write_profile(tmp_path, TRT).section("triton")
    with pytest.raises(HkError) as e:
        launch.start(t, Backends(nvml=ReplayNvml(DGX)))
    assert str(e.value) == (f"triton: model resnet50 needs the tensorrt backend, which image {IMAGE} lacks "
                            f"(it has: python)")
    t = write_profile(tmp_path, TORCH).section("triton")
    assert t.models[0].engine == "torch" and t.models[0].backend == "python"
    with pytest.raises(HkError) as e:
        launch.start(t, Backends(nvml=ReplayNvml(DGX)))
    assert "\n" not in str(e.value) and str(e.value).startswith("triton: model r18 (the torch engine) needs torch "
                                                                  f"in image {IMAGE}")
    assert not (tmp_path / "run" / forms.PID_FILE).exists()     # nothing was started
