"""The torch engine where TensorRT is absent: which engine a built model gets and why, the
Python-backend config and model file it is served with, and the CUDA-graph batch sizes.
(The engine itself runs on the GPU machine: tests/gpu/test_serving.py.)"""
from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys

import pytest

from hkgpu_tune.core.errors import HkError, ProfileError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.serve.schema.config import TORCH_MODEL, Build, choose_engine
from hkgpu_tune.serve.repository.torch_model import graph_batches

PROFILE = """\
name: t
triton:
  model_repository: {root}/models
  run_dir: {root}/run
  models:
    - name: resnet50
      platform: tensorrt_plan
      max_batch_size: 64
      inputs: [{{name: INPUT, data_type: FP16, dims: [3, 224, 224]}}]
      outputs: [{{name: OUTPUT, data_type: FP16, dims: [1000]}}]
      dynamic_batching: {{max_queue_delay_microseconds: 200}}
      build: {build}
"""


def test_graph_batches_cover_every_batch_with_little_padding():
    sizes = graph_batches(64, preferred=[24, 100])
    assert sizes[0] == 1 and sizes[-1] == 64 and 24 in sizes and 100 not in sizes
    for n in range(1, 65):   # the next size up wastes at most a third of the work
        b = next(s for s in sizes if s >= n)
        assert b == n or (b - n) / b <= 1 / 3 + 1e-9 or n <= 2, (n, b)
    assert graph_batches(1) == [1]


@pytest.mark.parametrize("build,trtexec,want", [
    (Build(onnx="m.onnx", torchvision="resnet50"), "/usr/bin/trtexec", ("tensorrt", "trtexec found at /usr/bin/trtexec")),
    (Build(onnx="m.onnx", torchvision="resnet50"), None, ("torch", "trtexec not found")),
    (Build(torchvision="resnet50"), "/usr/bin/trtexec", ("torch", "no onnx to build a TensorRT plan from")),
    (Build(onnx="m.onnx"), None, ("tensorrt", "no torchvision model for the torch engine")),
    (Build(onnx="m.onnx", torchvision="resnet50", engine="torch"), "/usr/bin/trtexec", ("torch", "asked for (engine: torch)")),
])
def test_choose_engine(build, trtexec, want):
    assert choose_engine(build, trtexec) == want


@pytest.mark.parametrize("backend", ["python", "hkbatch"])
def test_a_torch_model_is_served_by_the_backend_asked_for_with_the_engine_file(tmp_path, backend):
    text = PROFILE.format(root=tmp_path, build=f"{{torchvision: resnet50, cuda_graphs: true, backend: {backend}}}")
    t = parse_profile_text(text, "p.yaml").section("triton")
    m = t.models[0]
    assert (m.engine, m.backend, m.model_file) == ("torch", backend, TORCH_MODEL)
    assert f"served by {backend}: asked for (backend: {backend})" in m.engine_reason
    assert "platform" not in m.config
    assert m.config["parameters"]["torchvision"] == {"string_value": "resnet50"}
    assert m.config["parameters"]["cuda_graphs"] == {"string_value": "true"}
    from hkgpu_tune.serve.repository import batch_backend, render
    if backend == "hkbatch" and not batch_backend.available()[0]:
        pytest.skip(f"hkbatch cannot be built here: {batch_backend.available()[1]}")
    files = render.write_repository(t)
    assert filecmp.cmp(os.path.join(tmp_path, "models/resnet50/1/model.py"), TORCH_MODEL, shallow=False), files
    cfg = render.parse_config(open(os.path.join(tmp_path, "models/resnet50/config.pbtxt")).read())
    assert cfg["backend"] == backend and cfg["parameters"]["fp16"]["string_value"] == "true"
    lib = os.path.join(tmp_path, "models/resnet50", batch_backend.LIBRARY)
    assert os.path.isfile(lib) == (backend == "hkbatch")


@pytest.mark.parametrize("have_cxx,have_lib,want", [
    (True, True, ("hkbatch", "c++ at /usr/bin/c++")),
    (False, True, ("python", "hkbatch unavailable: no C++ compiler with a static libstdc++ (install g++)")),
    (True, False, ("python", "hkbatch unavailable: this Python")),
])
def test_auto_picks_hkbatch_where_it_builds_and_says_why_not(monkeypatch, have_cxx, have_lib, want):
    from hkgpu_tune.serve.schema.config import choose_backend
    from hkgpu_tune.serve.repository import batch_backend
    monkeypatch.setattr(batch_backend, "compiler", lambda: "/usr/bin/c++" if have_cxx else None)
    monkeypatch.setattr(batch_backend, "python_library", lambda: "/usr/lib/libpython3.11.so.1.0" if have_lib else None)
    monkeypatch.setattr(batch_backend, "PREBUILT", "/nonexistent/libtriton_hkbatch.so")
    backend, why = choose_backend(Build(torchvision="resnet50"))
    assert backend == want[0] and why.startswith(want[1]), why
    assert choose_backend(Build(torchvision="resnet50", backend="python")) == ("python", "asked for (backend: python)")


def test_hkbatch_library_drift_and_unsupported_in_the_repository_state(tmp_path, monkeypatch):
    from hkgpu_tune.serve.repository import batch_backend, render
    text = PROFILE.format(root=tmp_path, build="{torchvision: resnet50, backend: hkbatch}")
    t = parse_profile_text(text, "p.yaml").section("triton")
    m = t.models[0]
    d = os.path.join(tmp_path, "models", m.name)
    os.makedirs(d)
    monkeypatch.setattr(batch_backend, "compiler", lambda: None)
    monkeypatch.setattr(batch_backend, "PREBUILT", "/nonexistent/libtriton_hkbatch.so")
    st = render.model_state(t, m)
    assert f"{batch_backend.LIBRARY} absent" in st["reason"]
    assert st["unsupported"] == ("the hkbatch backend: no C++ compiler with a static libstdc++ (install g++) "
                                 "to build the hkbatch backend")
    import hashlib
    with open(os.path.join(d, batch_backend.LIBRARY), "wb") as f:   # built from another source
        f.write(b"old")
    with open(os.path.join(d, batch_backend.LIBRARY + ".sha256"), "w") as f:
        f.write("0" * 64 + " " + hashlib.sha256(b"old").hexdigest() + "\n")
    st = render.model_state(t, m)
    assert f"{batch_backend.LIBRARY} from another source" in st["reason"] and st["current"] != st["desired"]
    with open(os.path.join(d, batch_backend.LIBRARY + ".sha256"), "w") as f:   # the right source ...
        f.write(batch_backend.source_sha() + " " + hashlib.sha256(b"old").hexdigest() + "\n")
    assert batch_backend.LIBRARY not in render.model_state(t, m)["reason"]
    with open(os.path.join(d, batch_backend.LIBRARY), "ab") as f:               # ... then the bytes change
        f.write(b"planted")
    st = render.model_state(t, m)
    assert f"{batch_backend.LIBRARY} changed since it was built" in st["reason"], st
    with pytest.raises(HkError, match="no C\\+\\+ compiler"):
        batch_backend.install(d)
    assert open(os.path.join(d, batch_backend.LIBRARY), "rb").read() == b"oldplanted"   # left as it was
    assert not [f for f in os.listdir(d) if f.startswith(".hkbatch-")]


@pytest.mark.parametrize("build,msg", [
    ("{engine: tensorrt, torchvision: resnet50}", "engine tensorrt needs 'onnx'"),
    ("{engine: torch, onnx: m.onnx}", "engine torch needs 'torchvision'"),
    ("{onnx: missing.onnx, torchvision: resnet50}", "no such file"),
    ("{fp16: true}", "give 'onnx' (built into a TensorRT plan) or 'torchvision'"),
    ("{torchvision: 'ResNet 50'}", "a torchvision model name"),
    ("{torchvision: resnet50, backend: onnxruntime}", "backend"),
])
def test_bad_build_sections_name_file_line_and_key(tmp_path, build, msg):
    with pytest.raises(ProfileError, match=r"p\.yaml:\d+: ") as e:
        parse_profile_text(PROFILE.format(root=tmp_path, build=build), "p.yaml")
    assert msg in str(e.value)


def test_verify_shows_the_engine_and_why(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(PROFILE.format(root=tmp_path, build="{torchvision: resnet50}"))
    r = subprocess.run([sys.executable, "-m", "hkgpu_tune", "verify", "--only", "triton", "-p", str(p), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    row = next(x for x in json.loads(r.stdout)["results"] if x["key"] == "engine")
    assert row["current"] == "torch"
    import importlib.util
    if importlib.util.find_spec("torch") and importlib.util.find_spec("torchvision"):
        assert row["status"] == "ok" and "no onnx to build a TensorRT plan from" in row["reason"]
    else:   # this machine: no torch, so the engine cannot run here and verify says so
        assert row["status"] == "unsupported" and "needs torch" in row["reason"], row


# ---------------------------------------------------------------- engine options (config parameters)
from hkgpu_tune.serve.repository.torch_model import AUTOTUNE_MIN_BUDGET_S, engine_options, private_dir  # noqa: E402


def test_engine_options_defaults_and_values():
    o = engine_options({}, "TYPE_FP16")
    assert (o["fp16"], o["cuda_graphs"], o["fold_bn"], o["compile"], o["sync"], o["input_type"]) == \
        (True, True, False, False, "blocking", "FP16")
    o = engine_options({"compile": "true", "compile_cache_dir": "/var/cache/x", "sync": "spin", "fold_bn": "yes",
                        "compile_budget_s": "90"}, "TYPE_UINT8")
    assert (o["compile"], o["compile_cache_dir"], o["sync"], o["fold_bn"], o["compile_budget_s"], o["input_type"]) == \
        (True, "/var/cache/x", "spin", True, 90.0, "UINT8")


@pytest.mark.parametrize("params,itype,msg", [
    ({"fold_bn": "maybe"}, "FP16", "parameter fold_bn: 'maybe' is not true or false"),
    ({"compile": "true", "compile_mode": "max-autotune-no-cudagraphs"}, "FP16", "compile_budget_s of 300 or more"),
    ({"compile_mode": "reduce-overhead"}, "FP16", "parameter compile_mode: 'reduce-overhead' is not one of"),
    ({"compile_cache_dir": "cache"}, "FP16", "is not an absolute path"),
    ({"compile": "true", "cuda_graphs": "false"}, "FP16", "needs cuda_graphs true"),
    ({"compile_budget_s": "soon"}, "FP16", "parameter compile_budget_s: 'soon' is not a number"),
    ({"compile_budget_s": "0"}, "FP16", "outside"),
    ({"sync": "poll"}, "FP16", "parameter sync: 'poll' is not blocking or spin"),
    ({}, "TYPE_INT64", "input data_type INT64: the torch engine takes FP16, FP32, UINT8"),
])
def test_engine_options_refuse_what_the_engine_cannot_use(params, itype, msg):
    with pytest.raises(ValueError) as e:
        engine_options(params, itype)
    assert msg in str(e.value)


def test_autotune_is_allowed_with_a_budget_that_fits_it():
    o = engine_options({"compile": "true", "compile_mode": "max-autotune-no-cudagraphs",
                        "compile_budget_s": str(AUTOTUNE_MIN_BUDGET_S)})
    assert o["compile_mode"] == "max-autotune-no-cudagraphs"


def test_compile_cache_dir_is_private(tmp_path):
    d = tmp_path / "cache"
    assert private_dir(str(d)) == str(d) and (d.stat().st_mode & 0o777) == 0o700
    d.chmod(0o777)   # others could plant code the engine loads
    with pytest.raises(ValueError, match="writable by group or others"):
        private_dir(str(d))
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ValueError, match="not a directory"):
        private_dir(str(tmp_path / "link"))
    (tmp_path / "file").write_text("")
    with pytest.raises((ValueError, FileExistsError)):
        private_dir(str(tmp_path / "file"))


def test_engine_parameters_from_the_profile_reach_the_rendered_config(tmp_path):
    text = PROFILE.format(root=tmp_path, build="{torchvision: resnet50}").replace("data_type: FP16, dims", "data_type: UINT8, dims", 1)
    text += ("      config:\n        parameters:\n          compile: {string_value: \"true\"}\n"
             "          sync: {string_value: blocking}\n")
    t = parse_profile_text(text, "p.yaml").section("triton")
    from hkgpu_tune.serve.repository import render
    render.write_repository(t)
    cfg = render.parse_config(open(os.path.join(tmp_path, "models/resnet50/config.pbtxt")).read())
    params = {k: v["string_value"] for k, v in cfg["parameters"].items()}
    assert params["compile"] == "true" and params["torchvision"] == "resnet50"
    o = engine_options(params, cfg["input"][0]["data_type"])   # what the model's initialize does
    assert o["compile"] and o["input_type"] == "UINT8" and o["sync"] == "blocking"


def test_the_bench_profile_serves_the_compiled_uint8_engine():
    from hkgpu_tune.core.profile import load_profile
    m = load_profile(os.path.join(os.path.dirname(__file__), "..", "..", "bench", "h200-resnet50.yaml")) \
        .section("triton").model("resnet50")
    params = {k: v["string_value"] for k, v in m.config["parameters"].items()}
    o = engine_options(params, m.inputs[0]["data_type"])
    assert o["compile"] and o["input_type"] == "UINT8" and o["compile_cache_dir"].startswith("/")


@pytest.mark.parametrize("build,want", [
    ("{torchvision: resnet50}", ("python", "the container form runs the image's Python; hkbatch embeds this host's")),
    ("{torchvision: resnet50, backend: hkbatch}", None),
])
def test_the_container_form_never_gets_hkbatch(tmp_path, build, want):
    """hkbatch embeds this host's libpython: in an image's tritonserver the model would not load."""
    text = PROFILE.format(root=tmp_path, build=build).replace(
        "triton:\n", "triton:\n  launch: container\n  image: nvcr.io/nvidia/tritonserver:24.10-py3\n", 1)
    if want is None:
        with pytest.raises(ProfileError, match=r"p\.yaml:\d+: .*backend hkbatch: the container form runs the "
                                               r"image's Python"):
            parse_profile_text(text, "p.yaml")
        return
    m = parse_profile_text(text, "p.yaml").section("triton").models[0]
    assert m.backend == want[0] and m.engine_reason.endswith(f"served by {want[0]}: {want[1]}"), m.engine_reason


def test_install_writes_no_link_and_rebuilds_a_changed_library(tmp_path):
    from hkgpu_tune.serve.repository import batch_backend
    if not batch_backend.available()[0]:
        pytest.skip(f"hkbatch cannot be built here: {batch_backend.available()[1]}")
    victim = tmp_path / "victim"
    victim.write_text("keep")
    d = tmp_path / "model"
    d.mkdir()
    (d / batch_backend.LIBRARY).symlink_to(victim)   # root must not write through it
    with pytest.raises(HkError, match="it is a link"):
        batch_backend.install(str(d))
    assert victim.read_text() == "keep"
    (d / batch_backend.LIBRARY).unlink()
    assert batch_backend.install(str(d)) is True and batch_backend.install(str(d)) is False
    with open(d / batch_backend.LIBRARY, "ab") as f:   # changed after the build: built again
        f.write(b"x")
    assert batch_backend.installed_sha(str(d)) is None and batch_backend.install(str(d)) is True
    assert batch_backend.installed_sha(str(d)) == batch_backend.source_sha()[:12]
