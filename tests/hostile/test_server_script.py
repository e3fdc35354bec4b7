"""A `server:` that is a script (a wrapper that sets something up, then runs the server) is the
process root started: status says running, stop stops it (never "was not running"), and a later
start does not start a second server beside it. Recognised by the pid root started, its start
time, session and user, whether the script runs the server as a child or execs it."""
import os
import time

import pytest

from hkgpu_tune.serve.running import forms, launch

from .test_triton_trust import section

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: starts a process as root")


@pytest.mark.parametrize("body", ["/bin/sleep 300\n", "exec /bin/sleep 300\n"])
def test_a_server_script_is_recognised_and_stopped(tmp_path, body):
    os.chmod(tmp_path, 0o755)
    script = tmp_path / "bin" / "tritonserver-wrapper"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n" + body)
    os.chmod(script, 0o755)
    t = section(tmp_path, server=str(script))
    ref = forms.ServiceRef.of(t)
    pid = launch._spawn(ref, [str(script), "--model-repository=/m"], {}, "root", "binary", {})
    try:
        time.sleep(0.3)                                   # the shell has started (and exec'd)
        st = launch.status(t)
        assert st["active"] and st["pid"] == pid, st
        assert launch.process_record(t)["pid"] == pid
        rep = launch.stop(t, timeout=2)
        assert rep["how"] != "was not running" and rep["stopped"], rep
        time.sleep(0.2)
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    finally:
        try:
            os.killpg(pid, 9)
        except ProcessLookupError:
            pass
