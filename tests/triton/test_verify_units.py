"""Verify's comparison with swapped backends: systemd answers through a fake `cmd`, and synthetic states."""
from __future__ import annotations

from hkgpu_tune.backends import Backends
from hkgpu_tune.backends.command import Completed
from hkgpu_tune.profile import parse_profile_text
from hkgpu_tune.report import DRIFT, ERROR, OK, UNSUPPORTED
from hkgpu_tune.subsystems.triton import Plugin
from hkgpu_tune.triton import launch

from .conftest import dump, profile_dict


class FakeCmd:
    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def run(self, argv, timeout=30, env=None):
        self.calls.append(argv)
        out = self.answers.get(tuple(argv[1:]), "")
        return Completed(0 if out == "active" else 3, out + "\n", "")


def plugin(tmp_path, **top):
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    doc["triton"].update(top)
    prof = parse_profile_text(dump(doc), str(tmp_path / "p.yaml"))
    return prof, prof.section("triton")


def test_systemd_status_through_systemctl(tmp_path):
    _, t = plugin(tmp_path, supervisor="systemd", unit="tritonA")
    b = Backends(cmd=FakeCmd({("is-active", "tritonA.service"): "active"}))
    st = launch.status(t, b)
    assert st == {"active": True, "state": "active", "target": "tritonA.service", "pid": None, "reason": ""}
    b = Backends(cmd=FakeCmd({("is-active", "tritonA.service"): "failed"}))
    st = launch.status(t, b)
    assert not st["active"] and st["reason"] == "systemctl is-active: failed"


def test_service_down_is_fixable_drift_and_nothing_else_is_probed(tmp_path):
    prof, t = plugin(tmp_path, supervisor="systemd")
    b = Backends(cmd=FakeCmd({("is-active", "hkgpu-triton.service"): "inactive"}))
    p = Plugin(prof, b)
    res = p.verify()
    assert [(r.key, r.status) for r in res] == [("repository", DRIFT), ("service", DRIFT)]
    assert res[0].reason == "config.pbtxt absent; 1/model.py absent" and res[0].write == "rendered"
    assert res[1].write == "running" and res[1].current == "inactive"
    changes, _ = p.plan()
    assert [c.key for c in changes] == ["repository", "service"]


def test_compare_of_a_running_service(tmp_path):
    prof, t = plugin(tmp_path)
    p = Plugin(prof, Backends())
    served = {"name": "doubler", "backend": "python", "max_batch_size": 16,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
              "dynamic_batching": {"max_queue_delay_microseconds": 20000, "preferred_batch_size": [16]},
              "instance_group": [{"name": "doubler_0", "count": 1, "kind": "KIND_CPU"}]}
    state = {"repository": {"doubler": {"current": "a/b", "desired": "a/b", "reason": ""}},
             "service": {"active": True, "state": "running", "target": "process 7", "reason": ""},
             "server_ready": True,
             "models": {"doubler": {"ready": True, "config": served}},
             "metrics": {"ok": True, "status": "answering", "reason": ""}}
    assert {r.key: r.status for r in p.compare(state)} == {
        "repository": OK, "service": OK, "server_ready": OK, "model_ready": OK, "served_config": OK, "metrics": OK}
    served["input"][0]["data_type"] = "TYPE_FP16"
    state["models"]["doubler"]["ready"] = False
    state["metrics"] = {"ok": False, "status": "not answering", "reason": "connection refused"}
    res = {r.key: r for r in p.compare(state)}
    assert res["model_ready"].status == DRIFT
    assert res["served_config"].status == DRIFT and res["served_config"].current == "TYPE_FP16"
    assert res["served_config"].reason.startswith("input[0].data_type: served 'TYPE_FP16', profile 'TYPE_FP32'")
    assert res["metrics"].status == DRIFT and res["metrics"].reason == "connection refused"
    state["models"]["doubler"] = {"ready": False, "config_error": "triton: /v2/models/doubler/config answered 404"}
    assert {r.key: r.status for r in p.compare(state)}["served_config"] == ERROR


def test_plan_without_trtexec_is_unsupported_not_a_crash(tmp_path, monkeypatch):
    (tmp_path / "m.onnx").write_bytes(b"x")
    from hkgpu_tune.triton import engine
    monkeypatch.setattr(engine, "trtexec_path", lambda: None)
    prof = parse_profile_text(f"""\
triton:
  model_repository: {tmp_path}/repo
  supervisor: systemd
  models:
    - name: m
      platform: tensorrt_plan
      max_batch_size: 8
      inputs: [{{name: input, data_type: FP32, dims: [4]}}]
      outputs: [{{name: output, data_type: FP32, dims: [4]}}]
      build: {{onnx: {tmp_path}/m.onnx}}
""", str(tmp_path / "p.yaml"))
    p = Plugin(prof, Backends(cmd=FakeCmd({})))
    res = p.verify()
    assert (res[0].key, res[0].status) == ("repository", UNSUPPORTED)
    assert res[0].reason.startswith("trtexec not found")
