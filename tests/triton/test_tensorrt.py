"""ONNX -> TensorRT plan: the trtexec command, the cache key beside the plan, and 'trtexec not found'.

TensorRT is not installable here (the wheels are over a gigabyte), so a stand-in trtexec records
its arguments and writes the plan file; what is tested is our caching and argv, not TensorRT."""
from __future__ import annotations

import importlib.util
import json
import os
import stat

import pytest

from hkgpu_tune.core.errors import UnsupportedError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.serve import render, tensorrt

FAKE = """#!/bin/sh
echo "&&&& RUNNING TensorRT.trtexec [TensorRT v{version}] # trtexec $*"
[ "$1" = "--help" ] && exit 0
echo "$@" >> "{log}"
for a in "$@"; do case "$a" in --saveEngine=*) echo plan > "${{a#--saveEngine=}}";; esac; done
exit {rc}
"""


def fake_trtexec(tmp_path, monkeypatch, version="100300", rc=0):
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    exe = d / "trtexec"
    exe.write_text(FAKE.format(version=version, log=tmp_path / "calls.log", rc=rc))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{d}:{os.environ['PATH']}")
    return tmp_path / "calls.log"


def calls(log) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def section(tmp_path, fp16=True):
    onnx = tmp_path / "resnet.onnx"
    if not onnx.exists():
        onnx.write_bytes(b"onnx-v1")
    return parse_profile_text(f"""\
triton:
  model_repository: {tmp_path}/repo
  models:
    - name: resnet50
      platform: tensorrt_plan
      max_batch_size: 32
      inputs: [{{name: input, data_type: FP16, dims: [3, 224, 224]}}]
      outputs: [{{name: output, data_type: FP16, dims: [1000]}}]
      dynamic_batching: {{max_queue_delay_microseconds: 100}}
      instance_group: [{{count: 1, kind: KIND_GPU, gpus: [0]}}]
      build: {{onnx: resnet.onnx, fp16: {str(fp16).lower()}, opt_batch: 8}}
""", str(tmp_path / "p.yaml")).section("triton")


def test_build_once_then_cached_then_rebuilt_on_change(tmp_path, monkeypatch):
    log = fake_trtexec(tmp_path, monkeypatch)
    t = section(tmp_path)
    m = t.models[0]
    r = tensorrt.build_model(t, m)
    plan = tmp_path / "repo" / "resnet50" / "1" / "model.plan"
    assert r.built and r.reason == "no plan yet" and plan.read_text() == "plan\n"
    assert calls(log) == [f"--onnx={tmp_path}/resnet.onnx --saveEngine={plan}.building --fp16 "
                          "--minShapes=input:1x3x224x224 --optShapes=input:8x3x224x224 --maxShapes=input:32x3x224x224"]
    key = json.loads((tmp_path / "repo" / "resnet50" / "1" / "model.plan.key.json").read_text())
    assert key["key"]["tensorrt"] == "100300" and key["key"]["flags"][0] == "--fp16"
    # same inputs: no second trtexec run
    r2 = tensorrt.build_model(t, m)
    assert not r2.built and r2.reason == "cache key matches" and len(calls(log)) == 1
    # the ONNX changes -> rebuilt
    (tmp_path / "resnet.onnx").write_bytes(b"onnx-v2")
    r3 = tensorrt.build_model(t, m)
    assert r3.built and r3.reason == "changed: onnx_sha256" and len(calls(log)) == 2
    # the flags change -> rebuilt
    t2 = section(tmp_path, fp16=False)
    r4 = tensorrt.build_model(t2, t2.models[0])
    assert r4.built and r4.reason == "changed: flags" and "--fp16" not in calls(log)[-1]
    # TensorRT is upgraded -> rebuilt
    fake_trtexec(tmp_path, monkeypatch, version="100500")
    r5 = tensorrt.build_model(t2, t2.models[0])
    assert r5.built and r5.reason == "changed: tensorrt"
    # the repository state sees the plan
    assert render.repository_state(t2)["resnet50"]["reason"] == "config.pbtxt absent"


def test_trtexec_failure_keeps_the_old_plan(tmp_path, monkeypatch):
    fake_trtexec(tmp_path, monkeypatch)
    t = section(tmp_path)
    tensorrt.build_model(t, t.models[0])
    (tmp_path / "resnet.onnx").write_bytes(b"broken")
    fake_trtexec(tmp_path, monkeypatch, rc=3)
    with pytest.raises(Exception) as e:
        tensorrt.build_model(t, t.models[0])
    assert "trtexec failed (exit 3)" in str(e.value)
    assert (tmp_path / "repo" / "resnet50" / "1" / "model.plan").read_text() == "plan\n"


def test_trtexec_not_found_is_a_clear_skip(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(tensorrt, "trtexec_path", lambda: None)
    t = section(tmp_path)
    r = tensorrt.build_model(t, t.models[0])
    assert not r.built and r.skipped.startswith("trtexec not found")
    assert "skipped: trtexec not found" in r.line()
    with pytest.raises(UnsupportedError, match="trtexec not found"):
        tensorrt.build_plan(t.models[0].build, str(tmp_path / "x.plan"), t.models[0])
    st = render.repository_state(t)["resnet50"]
    assert st["unsupported"].startswith("trtexec not found")


def test_int8_needs_a_calibration_cache(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"x")
    with pytest.raises(Exception, match="int8 needs a calibration_cache"):
        parse_profile_text(f"""\
triton:
  models:
    - name: m
      platform: tensorrt_plan
      max_batch_size: 8
      inputs: [{{name: input, data_type: FP32, dims: [4]}}]
      build: {{onnx: {tmp_path}/m.onnx, int8: true}}
""", "p.yaml")


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None or importlib.util.find_spec("onnx") is None,
                    reason="torch, torchvision and onnx are not installed here (they are on the GPU machine)")
def test_torchvision_export_downloads_nothing(tmp_path, monkeypatch):
    import onnx
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    info = tensorrt.export_torchvision("resnet18", str(tmp_path / "r18.onnx"), image_size=64)
    m = onnx.load(str(tmp_path / "r18.onnx"))
    assert m.graph.input[0].name == "input"
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert info["output"][1:] == [1000]
    assert not (tmp_path / "torch-home").exists()  # no weights were fetched
