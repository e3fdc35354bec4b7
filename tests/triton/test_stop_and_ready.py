"""The launcher's two timings against tritonserver's own: ready means every endpoint answers
(tritonserver starts its metrics endpoint after HTTP), and a stop lets the server use its whole
--exit-timeout-secs before anything is killed. Stand-in processes play the server here; the real
tritonserver runs the same paths in test_server.py."""
from __future__ import annotations

import os
import re
import sys
import time
import urllib.request

import pytest

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.serve.running import forms, launch
from tests.helpers import gone

from .conftest import DATA, dump, free_ports, profile_dict


def section(tmp_path, ports, stop_timeout_s=1, extra_args=()):
    doc = profile_dict(tmp_path, ports)
    doc["triton"]["supervisor"] = "process"
    doc["triton"]["gate"]["stop_timeout_s"] = stop_timeout_s
    if extra_args:
        doc["triton"]["extra_args"] = list(extra_args)
    return parse_profile_text(dump(doc), str(tmp_path / "p.yaml")).section("triton")


def spawn(t, *argv) -> int:
    return launch._spawn(forms.ServiceRef.of(t), [sys.executable, *argv], {}, t.user, "binary", {})


@pytest.fixture
def stopped():
    made = []
    yield made
    for t in made:
        launch.stop(t, timeout=0)   # no grace: killed at once


def spawn_slow_exit(t, exit_s: str) -> int:
    """slow_exit.py, once its SIGTERM handler is in place (it prints "ready" then)."""
    pid = spawn(t, os.path.join(DATA, "slow_exit.py"), exit_s)
    deadline = time.monotonic() + 30
    while "ready" not in open(os.path.join(t.run_dir, "tritonserver.log")).read():
        assert time.monotonic() < deadline, "slow_exit.py did not start in 30 s"
        time.sleep(0.05)
    return pid


def metrics_answer(port) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.status


def test_ready_waits_for_the_metrics_endpoint(tmp_path, stopped):
    ports = free_ports(3)
    t = section(tmp_path, ports)
    spawn(t, os.path.join(DATA, "fake_endpoints.py"), *map(str, ports), "1.0")
    stopped.append(t)
    waited = launch.wait_ready(t, timeout=20)
    assert metrics_answer(ports[2]) == 200      # what a scrape or a gate right after ready reads
    assert waited >= 0.9, waited


def test_a_metrics_endpoint_that_never_answers_is_named(tmp_path, stopped):
    ports = free_ports(3)
    t = section(tmp_path, ports)
    spawn(t, os.path.join(DATA, "fake_endpoints.py"), *map(str, ports), "-1")
    stopped.append(t)
    with pytest.raises(HkError) as e:
        launch.wait_ready(t, timeout=5)
    assert str(e.value).startswith(f"triton: not ready after 5 s (the metrics (127.0.0.1:{ports[2]}) "
                                   f"endpoint not answering)"), str(e.value)


def test_an_endpoint_switched_off_in_extra_args_is_not_waited_for(tmp_path, stopped):
    ports = free_ports(3)
    t = section(tmp_path, ports, extra_args=("--allow-metrics=true", "--allow-metrics=False"))
    spawn(t, os.path.join(DATA, "fake_endpoints.py"), *map(str, ports), "-1")
    stopped.append(t)
    assert launch.wait_ready(t, timeout=20) < 10


@pytest.mark.parametrize("exit_s, grace, how, seconds, note", [
    # tritonserver ends itself at its exit timeout (open connections, a hung unload): not killed
    ("1.3", 2, "SIGTERM", (1.2, 3.0), "the server used its whole exit timeout (1 s)"),
    # a server that never ends: killed after the exit timeout and the grace
    ("-1", 1, "SIGKILL after timeout", (2.0, 10), "the server did not end within its exit timeout (1 s)"),
])
def test_the_kill_comes_only_after_the_servers_exit_timeout_and_the_grace(tmp_path, monkeypatch, stopped, exit_s,
                                                                            grace, how, seconds, note):
    monkeypatch.setattr(forms, "STOP_GRACE_S", grace)
    t = section(tmp_path, free_ports(3), stop_timeout_s=1)
    pid = spawn_slow_exit(t, exit_s)
    stopped.append(t)
    rep = launch.stop(t)
    assert rep["how"] == how and rep["left"] == [] and rep["stopped"], rep
    assert seconds[0] <= rep["seconds"] < seconds[1] and rep["note"].startswith(note), rep
    assert gone(pid)


def test_the_unit_outlasts_the_servers_exit_timeout(tmp_path):
    for form in ("binary", "container"):
        t = section(tmp_path, (18000, 18001, 18002), stop_timeout_s=30)
        if form == "container":
            doc = profile_dict(tmp_path, (18000, 18001, 18002))
            doc["triton"].update(launch="container", image="tritonserver:24.08-py3", gpu=0)
            t = parse_profile_text(dump(doc), str(tmp_path / "c.yaml")).section("triton")
        text = forms.render_unit(t, {"cpus": [0], "mems": [0], "source": "test"})
        exit_s = int(re.search(r"--exit-timeout-secs=(\d+)", text).group(1))
        systemd_s = int(re.search(r"^TimeoutStopSec=(\d+)$", text, re.M).group(1))
        assert exit_s == 30 and systemd_s > exit_s, (form, exit_s, systemd_s)
        if form == "container":
            stop_s = int(re.search(r"^ExecStop=\S+ stop --time (\d+) ", text, re.M).group(1))
            assert exit_s < stop_s < systemd_s, (exit_s, stop_s, systemd_s)
