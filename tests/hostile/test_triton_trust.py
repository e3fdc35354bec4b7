"""Root's `triton stop` signals a process group on the word of the run directory's record: a
record another user could write is refused, and a record naming a process that is not the server
root started (another program, another session, other arguments) is not acted on. The process
form starts the server as an unprivileged user unless the profile names root. A state entry of
kind `command` can only respawn a Triton server command whose program and paths pass the trust
rule: rollback never runs an argv it did not write."""
import json
import os
import subprocess
import time

import pytest

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.serve.running import forms, launch, records
from hkgpu_tune.tune import settings
from hkgpu_tune.core.report import Change

from ..triton.conftest import dump, profile_dict

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files of other owners")


def section(tmp_path, **top):
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    doc["triton"].update({"supervisor": "process", **top})
    from hkgpu_tune.serve.schema.config import section as sec
    return sec(parse_profile_text(dump(doc), str(tmp_path / "p.yaml")))


@pytest.fixture
def victim():
    """A process another user would like root to kill: its own session, like a server."""
    p = subprocess.Popen(["/bin/sleep", "300"], start_new_session=True)
    yield p
    p.kill()
    p.wait()


def forge(t, victim, **over):
    os.makedirs(t.run_dir, exist_ok=True)
    rec = {"pid": victim.pid, "start_ticks": launch._start_ticks(victim.pid), "argv": ["/bin/sleep", "300"],
           "log": "/dev/null", "started": time.time(), "placement": {}, "launch": "binary", "env": {}, "user": None}
    rec.update(over)
    path = os.path.join(t.run_dir, forms.PID_FILE)
    with open(path, "w") as f:
        json.dump(rec, f)
    return path


def alive(p):
    return p.poll() is None


@pytest.mark.parametrize("who", ["file", "directory", "parent"])
def test_a_record_another_user_could_write_is_refused_and_nothing_is_signalled(tmp_path, victim, who):
    os.chmod(tmp_path, 0o755)
    t = section(tmp_path)
    path = forge(t, victim)
    if who == "file":
        os.chown(path, NOBODY, -1)
    elif who == "directory":
        os.chmod(t.run_dir, 0o777)
    else:
        os.chown(tmp_path, NOBODY, -1)
    with pytest.raises(HkError, match="refused"):
        launch.stop(t)
    with pytest.raises(HkError, match="refused"):
        launch.status(t)
    assert alive(victim)


@pytest.mark.parametrize("over", [{"argv": ["/usr/bin/tritonserver"]}, {"argv": ["/bin/sleep", "301"]},
                                  {"user": "nobody"}, {"start_ticks": 1}])
def test_a_record_naming_a_process_that_is_not_the_server_is_not_acted_on(tmp_path, victim, over):
    t = section(tmp_path)
    forge(t, victim, **over)
    rep = launch.stop(t)
    assert rep["how"] == "was not running" and alive(victim)


def test_a_process_not_leading_its_own_session_is_not_the_server(tmp_path):
    q = subprocess.Popen(["/bin/sleep", "300"])      # in the test's session and group
    try:
        t = section(tmp_path)
        forge(t, q)
        assert launch.stop(t)["how"] == "was not running" and alive(q)
    finally:
        q.kill()
        q.wait()


def test_root_starts_the_process_form_as_the_unprivileged_default_user(tmp_path, monkeypatch):
    """Without `user:` root does not start the server as root: as triton-server (absent here, so
    the start is refused naming it), never as root; with `user: root` named, it may."""
    t = section(tmp_path)
    import dataclasses
    t = dataclasses.replace(t, user=None)
    assert launch.service_user(t, "process") == forms.DEFAULT_USER
    spawned = []

    def popen(*a, **k):
        spawned.append(a)
        raise OSError(1, "not started by this test")
    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    with pytest.raises(HkError, match=f"user '{forms.DEFAULT_USER}' does not exist"):
        launch._spawn(forms.ServiceRef.of(t), ["/bin/sleep", "1"], {}, None, "binary", {})
    assert spawned == []
    assert launch.service_user(dataclasses.replace(t, user="root"), "process") == "root"


GOOD = {"argv": ["/opt/triton/bin/tritonserver", "--model-repository=/m"], "env": {"PYTHONPATH": "/usr/lib/python3"},
        "user": "triton-server", "launch": "binary", "placement": {}}


@pytest.mark.parametrize("bad", [
    {"argv": ["/bin/sh", "-c", "id > /tmp/pwned"]},
    {"argv": ["bin/tritonserver"]},
    {"argv": ["/opt/../bin/sh/tritonserver"]},
    {"env": {"LD_PRELOAD": "/tmp/evil.so"}},
    {"launch": "container", "argv": ["/usr/bin/docker", "exec", "x", "sh"]},
    {"user": "root; id"},
    {"extra": 1},
])
def test_a_saved_command_that_is_not_a_triton_server_is_refused_at_load(bad):
    rec = {**GOOD, **bad}
    good = settings.to_entry(Change("triton", "process 1", "command", "differs", "as rendered",
                                    {"before": GOOD, "service": {"supervisor": "process"}}))
    entry = {**good, "data": {**good["data"], "before": rec}}     # as a state file could hold it
    with pytest.raises(ValueError, match="triton"):
        settings.from_entry(entry)


def test_a_saved_command_whose_program_another_user_owns_is_not_run(tmp_path):
    os.chmod(tmp_path, 0o755)
    prog = tmp_path / "bin" / "tritonserver"
    prog.parent.mkdir()
    prog.write_text("#!/bin/sh\ntouch " + str(tmp_path / "ran") + "\n")
    os.chmod(prog, 0o755)
    os.chown(prog, NOBODY, -1)
    rec = {**GOOD, "argv": [str(prog)]}
    records.check_record(rec)          # the shape is a server's
    with pytest.raises(HkError, match="uid 65534"):
        records.check_record_paths(rec)
    t = section(tmp_path)
    with pytest.raises(HkError, match="uid 65534"):
        launch.respawn(forms.ServiceRef.of(t), rec)
    assert not (tmp_path / "ran").exists()


def test_a_saved_unit_rollback_would_write_runs_only_trusted_programs(tmp_path):
    """The `unit` entry keeps the unit text rollback writes back into /etc/systemd/system: only a
    unit this tool rendered, every Exec program by absolute path and trusted."""
    t = section(tmp_path, user="triton-server", supervisor="systemd")
    rendered = forms.render_unit(t, {"cpus": [], "mems": [], "source": "test"})
    records.check_unit_text(rendered)
    os.chmod(tmp_path, 0o755)
    evil = tmp_path / "tritonserver"
    evil.write_text("#!/bin/sh\n")
    os.chown(evil, NOBODY, -1)
    exec_line = next(ln for ln in rendered.splitlines() if ln.startswith("ExecStart="))
    for bad, why in ((rendered.replace(exec_line, f"ExecStart={evil} --x"), "uid 65534"),
                     (rendered + "ExecStartPost=sh -c id\n", "never write"),
                     ("[Service]\nExecStart=/bin/true\n", "not one hkgpu-tune rendered")):
        with pytest.raises(HkError, match=why):
            records.check_unit_text(bad)


@pytest.mark.parametrize("unit", ["..", "hk\\a", "a/b", "", 7])
def test_a_saved_change_naming_a_service_unit_the_profile_could_not_name_is_refused_at_load(unit):
    """A change of one of several services (triton.services) carries its unit: the state file's
    value passes the profile's own rule for a unit name, or the file is refused."""
    good = settings.to_entry(Change("triton", "hk-a/doubler", "served_config", "as rendered", "loaded",
                                    {"model": "doubler", "served": {}, "service": {"supervisor": "process"},
                                     "unit": "hk-a"}))
    settings.from_entry(good)
    with pytest.raises(ValueError, match="data.unit"):
        settings.from_entry({**good, "data": {**good["data"], "unit": unit}})
