"""The triton: section and the rendered model repository, checked with Triton's own schema."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.profile import load_profile, parse_profile_text
from hkgpu_tune.serve.repository.render import check_models
from hkgpu_tune.serve.repository import render

from .conftest import MODEL_PY, dump, profile_dict

GOOD = f"""\
triton:
  model_repository: /tmp/unused-repo
  models:
    - name: doubler
      backend: python
      model_file: {MODEL_PY}
      max_batch_size: 16
      inputs:
        - name: INPUT0
          data_type: FP32
          dims: [4]
      outputs:
        - {{name: OUTPUT0, data_type: FP32, dims: [4]}}
      dynamic_batching: {{max_queue_delay_microseconds: 2000, preferred_batch_size: [4, 8]}}
      instance_group: [{{count: 2, kind: CPU}}]
      model_warmup:
        - name: zeros
          batch_size: 8
          inputs: {{INPUT0: {{data_type: FP32, dims: [4], zero_data: true}}}}
"""


def section(text, file="p.yaml"):
    """The section as plan sees it: parsed, then each model checked against Triton's schema."""
    return check_models(parse_profile_text(text, file).section("triton"))


def test_rendered_config_parses_with_tritons_schema():
    t = section(GOOD)
    m = t.models[0]
    text = render.render_config(m)
    cfg = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert cfg.name == "doubler" and cfg.backend == "python" and cfg.max_batch_size == 16
    assert cfg.input[0].data_type == model_config_pb2.TYPE_FP32 and list(cfg.input[0].dims) == [4]
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 2000
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert cfg.instance_group[0].count == 2
    assert cfg.model_warmup[0].batch_size == 8 and cfg.model_warmup[0].inputs["INPUT0"].zero_data
    # defaults of the section: loopback, the standard ports
    assert (t.http.address, t.http.port, t.grpc.port, t.metrics.port) == ("127.0.0.1", 8000, 8001, 8002)


def test_write_repository_layout_and_idempotence(tmp_path):
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    t = section(dump(doc))
    written = render.write_repository(t)
    repo = tmp_path / "models" / "doubler"
    assert sorted(written) == sorted([str(repo / "config.pbtxt"), str(repo / "1" / "model.py")])
    assert (repo / "1" / "model.py").read_bytes() == open(MODEL_PY, "rb").read()
    assert render.parse_config((repo / "config.pbtxt").read_text())["backend"] == "python"
    assert render.write_repository(t) == []  # nothing to do the second time
    st = render.repository_state(t)["doubler"]
    assert st["current"] == st["desired"] and st["reason"] == ""
    (repo / "config.pbtxt").write_text((repo / "config.pbtxt").read_text().replace("16", "8"))
    st = render.repository_state(t)["doubler"]
    assert st["current"] != st["desired"] and st["reason"] == "config.pbtxt differs from the profile"


@pytest.mark.parametrize("old,new,where,msg", [
    ("data_type: FP32\n          dims", "data_type: FP33\n          dims", "p.yaml:10: triton.models[0].inputs[0].data_type",
     "Invalid enum value TYPE_FP33 for enum type inference.DataType"),
    ("dims: [4]\n      outputs", "dimz: [4]\n      outputs", "p.yaml:11: triton.models[0].inputs[0].dimz",
     'has no field named "dimz"'),
    ("count: 2, kind: CPU", "count: 2, kind: TPU", "p.yaml:15: triton.models[0].instance_group[0].kind",
     "Invalid enum value KIND_TPU"),
    ("max_queue_delay_microseconds: 2000", "max_queue_delay_microseconds: -1",
     "p.yaml:14: triton.models[0].dynamic_batching.max_queue_delay_microseconds", "out of range"),
    ("preferred_batch_size: [4, 8]", "preferred_batch_size: [4, 32]",
     "p.yaml:14: triton.models[0].dynamic_batching.preferred_batch_size[1]", "above max_batch_size 16"),
    ("zero_data: true", "zero_dta: true", "p.yaml:19: triton.models[0].model_warmup[0].inputs.INPUT0.zero_dta",
     'no field named "zero_dta"'),
    ("max_batch_size: 16", "max_batch_size: many", "p.yaml:7: triton.models[0].max_batch_size", "many"),
])
def test_wrong_field_is_a_profile_error_at_its_key_path(old, new, where, msg):
    assert old in GOOD
    with pytest.raises(ProfileError) as e:
        section(GOOD.replace(old, new))
    assert str(e.value).startswith(where + ": "), str(e.value)
    assert msg in str(e.value)


@pytest.mark.parametrize("old,new,expect", [
    (f"model_file: {MODEL_PY}", "model_file: /nonexistent/model.py",
     "p.yaml:6: triton.models[0].model_file: no such file: /nonexistent/model.py"),
    (f"      model_file: {MODEL_PY}\n", "", "p.yaml:4: triton.models[0]: a python-backend model needs 'model_file'"),
    ("backend: python", "platform: onnxruntime_onnx\n      backend: python", "p.yaml:4: triton.models[0]: give exactly one"),
    ("  model_repository: /tmp/unused-repo\n", "  model_repository: /tmp/unused-repo\n  user: 'root;id'\n",
     "p.yaml:3: triton.user: expected a user name"),
    ("  model_repository: /tmp/unused-repo\n", "  model_repository: /tmp/unused-repo\n  grpc: {port: 8000}\n",
     "p.yaml:3: triton.grpc: port 8000 is also the http port"),
    ("  model_repository: /tmp/unused-repo\n", "  model_repository: /tmp/unused-repo\n  http: {address: 0.0.0.300}\n",
     "p.yaml:3: triton.http.address: expected an IP address"),
    ("  model_repository: /tmp/unused-repo\n", "  model_repository: /tmp/unused-repo\n  launch: container\n",
     "p.yaml:3: triton.launch: the container form needs 'image'"),
    ("      max_batch_size: 16\n", "      max_batch_size: 0\n",
     "p.yaml:14: triton.models[0].dynamic_batching: dynamic batching needs max_batch_size > 0"),
    ("      backend: python", "      backend: python\n      max_batchsize: 3", "did you mean 'max_batch_size'?"),
])
def test_bad_input_is_a_clear_profile_error(old, new, expect):
    assert old in GOOD
    with pytest.raises(ProfileError) as e:
        section(GOOD.replace(old, new))
    assert expect in str(e.value), str(e.value)


def test_config_passthrough_is_checked_too():
    text = GOOD.replace("      model_warmup:", "      config:\n        optimizaton: {}\n      model_warmup:")
    with pytest.raises(ProfileError) as e:
        section(text)
    assert str(e.value).startswith("p.yaml:17: triton.models[0].config.optimizaton: ")
    ok = section(GOOD.replace("      model_warmup:", "      config:\n        parameters: {EXECUTION_ENV_PATH: {string_value: x}}\n      model_warmup:"))
    assert ok.models[0].config["parameters"]["EXECUTION_ENV_PATH"]["string_value"] == "x"


def test_config_diff_compares_only_the_fields_the_profile_sets():
    want = section(GOOD).models[0].config
    served = {"name": "doubler", "backend": "python", "max_batch_size": 16, "runtime": "",
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4], "optional": False}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
              "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 2000},
              "instance_group": [{"name": "doubler_0", "kind": "KIND_CPU", "count": 2, "gpus": []}],
              "model_warmup": [{"name": "zeros", "batch_size": 8,
                                "inputs": {"INPUT0": {"data_type": "TYPE_FP32", "dims": [4], "zero_data": True}}}]}
    assert render.config_diff(want, served) == []
    served["dynamic_batching"]["max_queue_delay_microseconds"] = 100
    served["instance_group"][0]["count"] = 1
    assert sorted(render.config_diff(want, served)) == [
        ("dynamic_batching.max_queue_delay_microseconds", 100, 2000),
        ("instance_group[0].count", 1, 2),
    ]


def test_cli_bad_profile_exits_1_with_one_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(GOOD.replace("data_type: FP32\n          dims", "data_type: FLOAT\n          dims"))
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "triton", "render", "-p", str(f)],
                       capture_output=True, text=True)
    assert p.returncode == 1
    assert p.stderr.strip().startswith(f"hkgpu-tune: error: {f}:10: triton.models[0].inputs[0].data_type: ")
    assert "TYPE_FLOAT" in p.stderr and "Traceback" not in p.stderr
    assert not os.path.exists("/tmp/unused-repo")


def test_relative_paths_resolve_against_the_profile(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.py").write_text(open(MODEL_PY).read())
    f = tmp_path / "p.yaml"
    f.write_text(GOOD.replace(MODEL_PY, "m/model.py").replace("/tmp/unused-repo", "repo"))
    t = load_profile(str(f)).section("triton")
    assert t.models[0].model_file == str(tmp_path / "m" / "model.py")
    assert t.model_repository == str(tmp_path / "repo")


def test_tritonclient_without_grpc_extras_is_a_clear_error(tmp_path):
    """tritonclient installed without [grpc] raises RuntimeError on import, not ImportError."""
    fake = tmp_path / "tritonclient" / "grpc"
    fake.mkdir(parents=True)
    (tmp_path / "tritonclient" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text('raise RuntimeError("The installation does not include grpc support.")\n')
    code = ("from hkgpu_tune.core.errors import HkError\nfrom hkgpu_tune.serve.repository import render\n"
            "try:\n    render._schema()\nexcept HkError as e:\n    print(e)\n")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{repo}"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("triton: checking config.pbtxt needs tritonclient[grpc] and protobuf") \
        and "does not include grpc support" in r.stdout, r.stdout


def test_parsing_imports_no_service_code_and_plan_checks_the_schema(tmp_path):
    """Parsing a profile with a triton section imports only the section's schema (serve.schema: services,
    config, connections, gate_spec, devices): no service code and no tritonclient (a wrong config field is found at plan time, with its
    file, line and key path)."""
    f = tmp_path / "p.yaml"
    f.write_text(GOOD.replace("data_type: FP32\n          dims", "data_type: FP33\n          dims"))
    code = ("import sys\nfrom hkgpu_tune.core.profile import load_profile\n"
            f"t = load_profile({str(f)!r}).section('triton')\n"
            "print(sorted(m for m in sys.modules if m.startswith(('hkgpu_tune.serve', 'tritonclient', 'google.protobuf'))"
        " and m not in ('hkgpu_tune.serve', 'hkgpu_tune.serve.schema', 'hkgpu_tune.serve.schema.config',"
        " 'hkgpu_tune.serve.schema.connections', 'hkgpu_tune.serve.schema.devices', 'hkgpu_tune.serve.schema.gate_spec',"
        " 'hkgpu_tune.serve.schema.services')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "plan", "--only", "triton", "-p", str(f), "--json"],
                       capture_output=True, text=True, timeout=60)
    assert "Traceback" not in p.stdout + p.stderr
    # bad input: one line naming file, line and key, exit 1 (not a row among the results)
    assert p.returncode == 1 and p.stdout == "", p.stdout
    assert p.stderr.strip().startswith(
        f"hkgpu-tune: error: {f}:10: triton.models[0].inputs[0].data_type: Invalid enum value TYPE_FP33"), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
