"""ONNX -> TensorRT plan: the trtexec command, the cache key beside the plan, the plan's I/O types
against the config, a stale plan as drift, and 'trtexec not found'.

TensorRT is not installable here (the wheels are over a gigabyte): tests/standins/trtexec stands in
for trtexec, built from trtexec's documented options (TensorRT's samples/trtexec help text), and
refuses what trtexec refuses; tests/standins/triton_tensorrt.py is the load-time I/O check of
Triton's TensorRT backend (tensorrt_backend's instance_state.cc)."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil

import pytest

from hkgpu_tune.backends import Backends
from hkgpu_tune.backends.nvml import ReplayNvml
from hkgpu_tune.core.errors import HkError, UnsupportedError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.core.report import DRIFT, OK
from hkgpu_tune.subsystems.triton import Plugin
from hkgpu_tune.serve.repository import render, tensorrt
from tests.standins import triton_tensorrt

STANDINS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "standins")
DGX = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "gpu", "dgx-h100-8gpu.json")
NETWORK = {"inputs": [{"name": "input"}], "outputs": [{"name": "output"}]}


def fake_trtexec(tmp_path, monkeypatch, version="100300", rc=0):
    """The trtexec stand-in on PATH (rc != 0: a trtexec that fails every build)."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    exe = d / "trtexec"
    if exe.exists() or exe.is_symlink():
        exe.unlink()      # never write through the link into the stand-in
    if rc:
        exe.write_text(f"#!/bin/sh\necho '&&&& RUNNING TensorRT.trtexec [TensorRT v{version}]'\n"
                       f"[ \"$1\" = --help ] && exit 0\nexit {rc}\n")
        exe.chmod(0o755)
    else:
        exe.symlink_to(os.path.join(STANDINS, "trtexec"))
    monkeypatch.setenv("PATH", f"{d}:{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_TRT_VERSION", version)
    monkeypatch.setenv("STANDIN_TRTEXEC_LOG", str(tmp_path / "calls.log"))
    return tmp_path / "calls.log"


def calls(log) -> list[str]:
    return [ln for ln in log.read_text().splitlines() if not ln.endswith("--help")] if log.exists() else []


def section(tmp_path, fp16=True, io="FP16", network=None):
    onnx = tmp_path / "resnet.onnx"
    if not onnx.exists():
        onnx.write_text(json.dumps(network or NETWORK))
    return parse_profile_text(f"""\
triton:
  model_repository: {tmp_path}/repo
  models:
    - name: resnet50
      platform: tensorrt_plan
      max_batch_size: 32
      inputs: [{{name: input, data_type: {io}, dims: [3, 224, 224]}}]
      outputs: [{{name: output, data_type: {io}, dims: [1000]}}]
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
    assert r.built and r.reason == "no plan yet" and plan.is_file()
    assert calls(log) == [f"--onnx={tmp_path}/resnet.onnx --saveEngine={plan}.building --skipInference --fp16 "
                          "--minShapes=input:1x3x224x224 --optShapes=input:8x3x224x224 --maxShapes=input:32x3x224x224 "
                          "--inputIOFormats=fp16:chw --outputIOFormats=fp16:chw"]
    key = json.loads((tmp_path / "repo" / "resnet50" / "1" / "model.plan.key.json").read_text())
    assert key["key"]["tensorrt"] == "100300" and key["key"]["flags"][1] == "--fp16"
    assert key["io"] == {"input": {"input": "fp16"}, "output": {"output": "fp16"}}
    # same inputs: no second trtexec run
    r2 = tensorrt.build_model(t, m)
    assert not r2.built and r2.reason == "cache key matches" and len(calls(log)) == 1
    # the ONNX changes -> rebuilt
    (tmp_path / "resnet.onnx").write_text(json.dumps(NETWORK) + " ")
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


def test_fp16_io_builds_a_plan_that_tritons_tensorrt_backend_loads(tmp_path, monkeypatch):
    """The documented config (FP16 inputs and outputs, build fp16): the plan's bindings are FP16,
    written through the path apply uses, and trtexec's benchmark is skipped."""
    log = fake_trtexec(tmp_path, monkeypatch)
    t = section(tmp_path)
    render.write_model(t, t.models[0])
    triton_tensorrt.load(str(tmp_path / "repo" / "resnet50"))      # raises as Triton would
    assert "--skipInference" in calls(log)[0] and "# inference ran" not in calls(log)
    # a plan with FP32 bindings under the same config is what Triton refuses, and so do we
    plan = tmp_path / "repo" / "resnet50" / "1" / "model.plan"
    doc = json.loads(plan.read_text())
    doc["bindings"]["input"]["input"] = "fp32"
    plan.write_text(json.dumps(doc))
    with pytest.raises(triton_tensorrt.LoadRefused, match="unexpected datatype TYPE_FP32 for inference input"):
        triton_tensorrt.load(str(tmp_path / "repo" / "resnet50"))


def test_the_standin_refuses_what_trtexec_refuses(tmp_path, monkeypatch):
    log = fake_trtexec(tmp_path, monkeypatch)
    from hkgpu_tune.backends.command import Command
    exe = shutil.which("trtexec")
    (tmp_path / "n.onnx").write_text(json.dumps({"inputs": [{"name": "a"}, {"name": "b"}], "outputs": [{"name": "o"}]}))
    bad = {"--workspace=64": "Unknown option", "--inputIOFormats=fp16:chw,fp16:chw,fp16:chw": "must match",
           "--inputIOFormats=half:chw": "Invalid input IO format", "--minShapes=x:1x3": "Cannot find input tensor"}
    for arg, msg in bad.items():
        r = Command().run([exe, f"--onnx={tmp_path}/n.onnx", arg, "--skipInference"])
        assert r.rc == 1 and msg in r.err, (arg, r.err)
    r = Command().run([exe, f"--onnx={tmp_path}/n.onnx", f"--saveEngine={tmp_path}/e", "--inputIOFormats=fp16:chw,int32:chw"])
    assert r.rc == 0 and "# inference ran" in log.read_text()   # without --skipInference it benchmarks
    assert json.loads((tmp_path / "e").read_text())["bindings"]["input"] == {"a": "fp16", "b": "int32"}


@pytest.mark.parametrize("io,msg", [("STRING", "TYPE_STRING cannot be a TensorRT plan's I/O type"),
                                    ("INT8", "INT8 I/O needs an INT8 build")])
def test_io_a_plan_cannot_have_is_refused_at_its_line(tmp_path, monkeypatch, io, msg):
    fake_trtexec(tmp_path, monkeypatch)
    with pytest.raises(HkError) as e:
        section(tmp_path, io=io)
    assert msg in str(e.value) and "p.yaml:7: triton.models[0].inputs[0].data_type" in str(e.value), str(e.value)


def _plugin(tmp_path, nvml_facts):
    prof = parse_profile_text((tmp_path / "p.yaml").read_text(), str(tmp_path / "p.yaml"))
    return Plugin(prof, Backends(nvml=ReplayNvml(nvml_facts)))


def _repo_result(results):
    return next(r for r in results if r.key == "repository")


def test_a_stale_plan_is_drift_with_its_reason_and_apply_rebuilds_it(tmp_path, monkeypatch):
    log = fake_trtexec(tmp_path, monkeypatch)
    section(tmp_path)
    (tmp_path / "p.yaml").write_text(f"""\
triton:
  model_repository: {tmp_path}/repo
  run_dir: {tmp_path}/run
  gpu: 3
  models:
    - name: resnet50
      platform: tensorrt_plan
      max_batch_size: 32
      inputs: [{{name: input, data_type: FP16, dims: [3, 224, 224]}}]
      outputs: [{{name: output, data_type: FP16, dims: [1000]}}]
      build: {{onnx: resnet.onnx}}
""")
    facts = json.load(open(DGX))["gpu"]
    p = _plugin(tmp_path, facts)
    changes, results = p.plan()
    assert _repo_result(results).status == DRIFT
    for ch in changes:
        if ch.key == "repository":
            p.apply(ch)
    key = json.loads((tmp_path / "repo/resnet50/1/model.plan.key.json").read_text())["key"]
    assert key["gpu"] == facts["gpus"][3]["name"] and key["driver"] == "535.161.08"
    assert _repo_result(p.verify()).status == OK
    n = len(calls(log))

    def drifts(why):
        r = _repo_result(_plugin(tmp_path, facts).verify())
        assert r.status == DRIFT and why in r.reason, r.reason
        return r
    (tmp_path / "resnet.onnx").write_text(json.dumps(NETWORK) + "\n")        # the ONNX changes
    drifts("plan is stale: onnx_sha256 changed")
    (tmp_path / "resnet.onnx").write_text(json.dumps(NETWORK))
    assert _repo_result(_plugin(tmp_path, facts).verify()).status == OK
    facts2 = copy.deepcopy(facts)
    facts2["driver"]["driver_version"] = "550.54.15"                            # a driver upgrade
    facts, old = facts2, facts
    drifts("plan is stale: driver changed")
    facts = old
    fake_trtexec(tmp_path, monkeypatch, version="100500")                      # a TensorRT upgrade
    drifts("plan is stale: tensorrt changed")
    assert len(calls(log)) == n            # verify built nothing
    p = _plugin(tmp_path, facts)
    changes, _ = p.plan()
    [ch] = [c for c in changes if c.key == "repository"]
    p.apply(ch)
    assert len(calls(log)) == n + 1 and _repo_result(p.verify()).status == OK


def test_trtexec_failure_keeps_the_old_plan(tmp_path, monkeypatch):
    fake_trtexec(tmp_path, monkeypatch)
    t = section(tmp_path)
    tensorrt.build_model(t, t.models[0])
    (tmp_path / "resnet.onnx").write_text("broken")
    fake_trtexec(tmp_path, monkeypatch, rc=3)
    with pytest.raises(Exception) as e:
        tensorrt.build_model(t, t.models[0])
    assert "trtexec failed (exit 3, host)" in str(e.value)
    assert json.loads((tmp_path / "repo" / "resnet50" / "1" / "model.plan").read_text())["standin"] == "trtexec"


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


def test_a_plan_whose_key_cannot_be_computed_is_ok_with_a_note(tmp_path, monkeypatch):
    """Built, then trtexec is gone: the bindings still match the config, but the cache key cannot be
    computed, so the ok says so (never a silent ok)."""
    fake_trtexec(tmp_path, monkeypatch)
    t = section(tmp_path)
    render.write_model(t, t.models[0])
    st = render.repository_state(t)["resnet50"]
    assert st["current"] == st["desired"] and "note" not in st
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(tensorrt, "trtexec_path", lambda: None)
    st = render.repository_state(t)["resnet50"]
    assert st["current"] == st["desired"] and "unsupported" not in st
    assert st["note"].startswith("1/model.plan: bindings match the config; cache key not checked (trtexec not found")
