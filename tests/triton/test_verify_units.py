"""Verify's comparison with swapped backends: systemd answers through a fake `cmd`, and synthetic states."""
from __future__ import annotations

from hkgpu_tune.backends import Backends
from hkgpu_tune.backends.command import Completed
from hkgpu_tune.backends.systemd import Systemd
from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.core.report import DRIFT, ERROR, OK, UNSUPPORTED
from hkgpu_tune.subsystems.triton import Plugin
from hkgpu_tune.serve.running import forms, launch

from .conftest import dump, free_ports, profile_dict


class FakeSystemctl:
    """`systemctl` as a swapped `cmd`: remembers which units are active, records every call."""

    def __init__(self, active=()):
        self.active, self.calls, self.timeouts = set(active), [], []

    def which(self, prog):
        return f"/usr/bin/{prog}"

    def run(self, argv, timeout=30, env=None):
        self.calls.append(argv[1:])
        self.timeouts.append((argv[1:], timeout))
        verb, unit = argv[1], argv[-1]
        if verb == "is-active":
            return Completed(0 if unit in self.active else 3, "", "")
        if verb == "enable" and "--now" in argv or verb == "start":
            self.active.add(unit)
        if verb == "stop":
            self.active.discard(unit)
        return Completed(0, "", "")


def systemd(tmp_path, active=()):
    (tmp_path / "root" / "run" / "systemd" / "system").mkdir(parents=True, exist_ok=True)
    cmd = FakeSystemctl(active)
    return Backends(cmd=cmd, systemd=Systemd(cmd=cmd, root=str(tmp_path / "root"))), cmd


def plugin(tmp_path, **top):
    doc = profile_dict(tmp_path, free_ports(3))
    del doc["triton"]["user"]   # the default user: checked, not started here
    doc["triton"].update(top)
    prof = parse_profile_text(dump(doc), str(tmp_path / "p.yaml"))
    return prof, prof.section("triton")


def test_systemd_status_through_systemctl(tmp_path):
    _, t = plugin(tmp_path, unit="tritonA")
    b, _ = systemd(tmp_path, active={"tritonA.service"})
    assert forms.supervisor(t, b) == "systemd"
    st = launch.status(t, b)
    assert st == {"active": True, "state": "active", "target": "tritonA.service", "pid": None, "reason": ""}
    b, _ = systemd(tmp_path)
    assert not launch.status(t, b)["active"]


def test_start_under_systemd_installs_the_unit_and_enables_it(tmp_path, monkeypatch):
    _, t = plugin(tmp_path)
    b, cmd = systemd(tmp_path)
    # the unit's user (the default, triton-server, absent here) is checked first: test_launch_access.py
    checked = []
    monkeypatch.setattr(launch, "check_user_access", lambda t, user: checked.append(user))
    from hkgpu_tune.serve.repository import render
    render.write_repository(t)
    place = {"cpus": [0], "mems": [], "numa_node": None, "source": "test"}
    st = launch.start(t, b, place=place)
    assert st["active"] and st["target"] == "hkgpu-triton.service"
    unit = tmp_path / "root" / "etc" / "systemd" / "system" / "hkgpu-triton.service"
    assert unit.read_text() == forms.render_unit(t, place)
    assert checked == [forms.DEFAULT_USER]
    assert ["daemon-reload"] in cmd.calls and ["enable", "--now", "hkgpu-triton.service"] in cmd.calls
    rep = launch.stop(t, b)
    assert (rep["stopped"], rep["how"], rep["left"], "note" in rep) == (True, "systemctl stop", [], False), rep
    # systemctl is given longer than the unit's TimeoutStopSec (which can be over its default 60 s)
    stop_call = next(c for c in cmd.timeouts if c[0][0] == "stop")
    assert stop_call[1] > t.gate.stop_timeout_s + 2 * forms.STOP_GRACE_S, stop_call
    assert launch.stop(t, b)["how"] == "was not running"


def test_unit_file_drift_and_service_down_are_fixable(tmp_path):
    prof, t = plugin(tmp_path, supervisor="systemd")
    b, cmd = systemd(tmp_path)
    p = Plugin(prof, b)
    res = p.verify()
    assert [(r.key, r.status) for r in res] == [("repository", DRIFT), ("unit", DRIFT), ("service", DRIFT)]
    assert res[0].reason == "config.pbtxt absent; 1/model.py absent" and res[0].write == "rendered"
    assert res[1].current == "absent" and res[1].write == "rendered"
    assert res[2].write == "running" and res[2].current == "inactive"
    changes, _ = p.plan()
    assert [c.key for c in changes] == ["unit", "repository", "service"]   # the launch first: undone last
    forms.install_unit(t, b)
    unit = tmp_path / "root" / "etc" / "systemd" / "system" / "hkgpu-triton.service"
    assert {r.key: r.status for r in p.verify()}["unit"] == OK
    unit.write_text(unit.read_text().replace("LimitMEMLOCK=infinity\n", ""))
    r = {r.key: r for r in p.verify()}["unit"]
    assert (r.status, r.current, r.reason) == (DRIFT, "differs", "the unit file is not the one the profile renders")


def test_a_unit_whose_stop_settings_changed_is_reloaded_not_restarted(tmp_path, monkeypatch):
    """An upgrade that changes only TimeoutStopSec or ExecStop must not restart every node's server:
    systemd reads those at the stop, after the daemon-reload."""
    prof, t = plugin(tmp_path, supervisor="systemd")
    b, cmd = systemd(tmp_path, active={"hkgpu-triton.service"})
    from hkgpu_tune.serve.repository import render
    render.write_repository(t)
    forms.install_unit(t, b)
    unit = tmp_path / "root" / "etc" / "systemd" / "system" / "hkgpu-triton.service"
    rendered = unit.read_text()
    restarts = []
    monkeypatch.setattr(launch, "restart", lambda *a, **k: restarts.append(a))
    from types import SimpleNamespace
    from hkgpu_tune.serve.measuring import gate
    monkeypatch.setattr(gate, "run_gate", lambda *a, **k: SimpleNamespace(passed=True, client_bound=False,
                                                                         message="p99 ok", loads=[]))
    p = Plugin(prof, b)
    for old, new, restart in (("TimeoutStopSec=50", "TimeoutStopSec=40", False),
                              ("LimitMEMLOCK=infinity", "LimitMEMLOCK=65536", True)):
        assert old in rendered
        unit.write_text(rendered.replace(old, new))
        r = {r.key: r for r in p.verify()}["unit"]
        assert r.status == DRIFT and ("no restart" in r.reason) == (not restart), r.reason
        changes, _ = p.plan()
        changes = [c for c in changes if c.key == "unit"]
        for c in changes:
            p.write(c.target, c.key, c.desired, c.data)
        p.after_apply(changes)
        assert unit.read_text() == rendered and bool(restarts) == restart, (old, restarts)
        restarts.clear()
    assert forms.unit_needs_restart(None, rendered)


def test_extra_args_cannot_override_what_the_profile_sets(tmp_path):
    import pytest
    from hkgpu_tune.core.errors import ProfileError
    for arg, key in (("--grpc-port=9001", "triton.grpc.port"), ("--exit-timeout-secs=5", "triton.gate.stop_timeout_s"),
                     ("--model-repository=/x", "triton.model_repository")):
        doc = profile_dict(tmp_path, free_ports(3))
        doc["triton"]["extra_args"] = ["--log-verbose=1", arg]
        path = tmp_path / "p.yaml"
        path.write_text(dump(doc))
        with pytest.raises(ProfileError) as e:
            parse_profile_text(path.read_text(), str(path)).section("triton")
        line = next(i for i, x in enumerate(path.read_text().splitlines(), 1) if arg in x)
        assert str(e.value) == (f"{path}:{line}: triton.extra_args[1]: {arg.split('=')[0]} is set from the "
                                f"profile: use {key}"), str(e.value)


def test_systemd_asked_for_where_none_runs_is_unsupported(tmp_path):
    prof, t = plugin(tmp_path, supervisor="systemd")
    (tmp_path / "root").mkdir()
    cmd = FakeSystemctl()
    eng = Engine(prof, only=["triton"], backends=Backends(cmd=cmd, systemd=Systemd(cmd=cmd, root=str(tmp_path / "root"))))
    res = eng.verify()
    assert [(r.status, r.reason) for r in res] == [
        (UNSUPPORTED, "systemd is not the service manager here (PID 1 is not systemd)")]


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
    from hkgpu_tune.serve.repository import tensorrt
    monkeypatch.setattr(tensorrt, "trtexec_path", lambda: None)
    prof = parse_profile_text(f"""\
triton:
  model_repository: {tmp_path}/repo
  supervisor: process
  run_dir: {tmp_path}/run
  models:
    - name: m
      platform: tensorrt_plan
      max_batch_size: 8
      inputs: [{{name: input, data_type: FP32, dims: [4]}}]
      outputs: [{{name: output, data_type: FP32, dims: [4]}}]
      build: {{onnx: {tmp_path}/m.onnx}}
""", str(tmp_path / "p.yaml"))
    p = Plugin(prof, Backends())
    res = p.verify()
    res = [r for r in res if r.key != "engine"]
    assert (res[0].key, res[0].status) == ("repository", UNSUPPORTED)
    assert res[0].reason.startswith("trtexec not found")
