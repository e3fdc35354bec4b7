"""Safe redeploy on a real tritonserver (the nvidia-pytriton wheel, CPU): explicit model control, a
changed config loaded with no restart, a failed gate or load bringing the previous config back
while the server keeps answering, a restart undone, and rollback from the saved record alone."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest

from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.profile import load_profile
from hkgpu_tune.core.report import OK
from hkgpu_tune.serve.running import client, launch

from .conftest import MODEL_PY, dump, free_ports, needs_server, profile_dict

pytestmark = [needs_server, pytest.mark.slow]


def write(path, doc) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(doc))
    return str(path)


def served_delay(t) -> int:
    c = client.Client(t.http.host, t.http.port)
    try:
        return int(c.model_config("doubler")["dynamic_batching"]["max_queue_delay_microseconds"])
    finally:
        c.close()


def doubles(t) -> bool:
    c = client.Client(t.http.host, t.http.port)
    try:
        out = c.infer("doubler", [("INPUT0", "FP32", [1, 4], struct.pack("<4f", 1, 2, 3, 4))], outputs=("OUTPUT0",))
        return struct.unpack("<4f", out["outputs"][0]["raw"]) == (2, 4, 6, 8)
    finally:
        c.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """One server for the module, deployed by apply with queue delay 20000 us."""
    root = tmp_path_factory.mktemp("redeploy")
    ports = free_ports(3)
    state = str(root / "state")

    def profile(name, **kw):
        doc = profile_dict(root, ports, requests=16, concurrency=4, **{k: v for k, v in kw.items()
                                                                        if k in ("delay_us", "p99_ms")})
        m = doc["triton"]["models"][0]
        if "model_file" in kw:
            m["model_file"] = kw["model_file"]
        doc["triton"].update(kw.get("top", {}))
        return write(root / "profiles" / f"{name}.yaml", doc)

    first = profile("first")
    rep = Engine(load_profile(first), only=["triton"], state_dir=state).apply()
    assert rep.error == "", rep.error
    t = load_profile(first).section("triton")
    try:
        yield {"root": root, "state": state, "profile": profile, "first": first, "t": t,
               "pid": launch.status(t)["pid"]}
    finally:
        launch.stop(t)


def test_started_in_explicit_model_control(node):
    st = launch.process_record(node["t"])
    assert "--model-control-mode=explicit" in st["argv"] and "--load-model=doubler" in st["argv"]


def test_hot_reload_changes_the_config_with_the_same_server(node):
    t = node["t"]
    assert served_delay(t) == 20000
    path = node["profile"]("delay-300", delay_us=300)
    rep = Engine(load_profile(path), only=["triton"], state_dir=node["state"]).apply()
    assert rep.error == "", rep.error
    assert {c.key for c in rep.changes} == {"repository", "served_config"}
    assert launch.status(t)["pid"] == node["pid"], "the server was restarted"
    assert served_delay(t) == 300 and doubles(t)
    assert all(r.status == OK for r in rep.results), [r.to_dict() for r in rep.results if r.status != OK]


def test_a_failed_gate_brings_the_previous_config_back(node):
    t = node["t"]
    before = served_delay(t)
    path = node["profile"]("delay-7777-tight-slo", delay_us=7777, p99_ms=0.001)
    rep = Engine(load_profile(path), only=["triton"], state_dir=node["state"]).apply()
    assert rep.rolled_back
    assert rep.error.startswith("triton gate failed: doubler: p99 latency ") and "over the SLO of 0.001 ms" in rep.error
    assert rep.error.endswith("; the previous config is serving again"), rep.error
    assert launch.status(t)["pid"] == node["pid"]
    assert served_delay(t) == before and doubles(t)
    # verify against the profile that failed: the old config is what is served and on disk
    res = {r.key: r for r in Engine(load_profile(path), only=["triton"], state_dir=node["state"]).verify()}
    assert "max_queue_delay_microseconds: served %d, profile 7777" % before in res["served_config"].reason
    assert res["repository"].status != OK
    # and against the previous profile everything is as it was
    prev = node["profile"]("delay-back", delay_us=before)
    assert all(r.status == OK for r in Engine(load_profile(prev), only=["triton"]).verify())


def test_a_model_that_fails_to_load_leaves_the_old_one_serving(node, tmp_path):
    t = node["t"]
    before = served_delay(t)
    bad = tmp_path / "bad.py"
    bad.write_text("this is not python\n")
    path = node["profile"]("broken-model", delay_us=before, model_file=str(bad))
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "apply", "--only", "triton", "-p", path,
                        "--state-dir", node["state"]], capture_output=True, text=True, timeout=180)
    assert p.returncode == 1, p.stdout + p.stderr
    errs = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.startswith("error:")]
    assert len(errs) == 1 and "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert errs[0].startswith("error: triton: doubler did not load: version 1 is at UNAVAILABLE state: ")
    assert "NameError" in errs[0] and errs[0].endswith("; the previous config is serving again (rolled back)")
    assert launch.status(t)["pid"] == node["pid"] and doubles(t) and served_delay(t) == before
    with open(os.path.join(t.model_repository, "doubler", "1", "model.py")) as f:
        assert f.read() == open(MODEL_PY).read()


def test_a_failed_gate_after_a_restart_restarts_the_previous_command(node):
    """A new server option needs a restart; when its gate fails the previous command runs again."""
    t = node["t"]
    old = launch.process_record(t)["argv"]
    path = node["profile"]("verbose-tight-slo", delay_us=served_delay(t), p99_ms=0.001,
                           top={"extra_args": ["--log-verbose=1"]})
    rep = Engine(load_profile(path), only=["triton"], state_dir=node["state"]).apply()
    assert [c.key for c in rep.changes] == ["command"]
    assert rep.error.endswith("; the previous config is serving again"), rep.error
    rec = launch.process_record(t)
    assert rec["argv"] == old and "--log-verbose=1" not in rec["argv"]
    assert doubles(t)
    node["pid"] = rec["pid"]


def test_a_failed_gate_after_a_restart_with_new_files_starts_the_previous_command_on_the_previous_files(node):
    """The undo goes through the journal, newest first: the model files are back before the previous
    command runs again (the launch is planned first), so it never starts on the new files."""
    t = node["t"]
    old, before = launch.process_record(t)["argv"], served_delay(t)
    path = node["profile"]("verbose-new-delay-tight-slo", delay_us=before + 111, p99_ms=0.001,
                           top={"extra_args": ["--log-verbose=1"]})
    rep = Engine(load_profile(path), only=["triton"], state_dir=node["state"]).apply()
    assert [c.key for c in rep.changes][0] == "command" and "repository" in {c.key for c in rep.changes}
    assert rep.error.endswith("; the previous config is serving again"), rep.error
    rec = launch.process_record(t)
    assert rec["argv"] == old and served_delay(t) == before and doubles(t)
    with open(os.path.join(t.model_repository, "doubler", "config.pbtxt")) as f:
        assert "max_queue_delay_microseconds: %d" % before in f.read()
    node["pid"] = rec["pid"]


def test_rollback_needs_only_the_saved_record(node, tmp_path):
    """rollback with a profile that has no triton section: the service stops, the repository and
    the kept copies go (the first apply made them)."""
    t = node["t"]
    other = tmp_path / "other.yaml"
    other.write_text("name: other\nsysctl: {}\n")
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "rollback", "-p", str(other), "--state-dir", node["state"]],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert p.returncode == 0, p.stdout + p.stderr
    assert not launch.status(t)["active"]
    assert not os.path.exists(os.path.join(t.model_repository, "doubler"))
    prev = os.path.join(os.path.dirname(t.model_repository), "previous")
    assert not os.path.isdir(prev) or os.listdir(prev) == []
    assert not os.path.exists(os.path.join(node["state"], "state.json"))


def test_state_record_of_a_repository_change_is_self_contained(node):
    """What restore reads is in the state file: paths and the service's address, no profile."""
    path = node["profile"]("delay-42", delay_us=42)
    changes, _ = Engine(load_profile(path), only=["triton"]).plan()
    (c,) = [c for c in changes if c.key == "repository"]
    d = json.loads(json.dumps(c.to_dict()))["data"]
    assert {"model", "repository", "model_dir", "existed", "backup", "service"} <= set(d)
    assert set(d["service"]) >= {"supervisor", "unit", "run_dir", "http_host", "http_port"}
