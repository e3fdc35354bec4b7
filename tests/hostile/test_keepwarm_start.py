"""keep-warm started before Triton is up (its unit ordered beside the server's, or started first)
waits for the server instead of exiting, then keeps the idle model warm: against a real
tritonserver started after it."""
import re
import subprocess
import sys
import time

import pytest

from hkgpu_tune.core.profile import load_profile
from hkgpu_tune.serve.repository import render
from hkgpu_tune.serve.running import launch

from ..triton.conftest import dump, free_ports, needs_server, profile_dict

pytestmark = [needs_server, pytest.mark.slow]


def test_keepwarm_waits_for_a_server_that_is_not_up_yet(tmp_path):
    doc = profile_dict(tmp_path, free_ports(3))
    path = tmp_path / "profile.yaml"
    path.write_text(dump(doc))
    t = load_profile(str(path)).section("triton")
    kw = subprocess.Popen([sys.executable, "-m", "hkgpu_tune.serve.running.keepwarm", "--profile", str(path),
                           "--idle-s", "1", "--period-s", "0.5", "--duration-s", "45"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2)
        assert kw.poll() is None, kw.communicate()          # still there: waiting, not gone
        render.write_repository(t)
        launch.start(t)
        try:
            launch.wait_ready(t)
            out, err = kw.communicate(timeout=90)
        finally:
            launch.stop(t)
    finally:
        if kw.poll() is None:
            kw.kill()
            kw.wait()
    assert kw.returncode == 0, err
    assert "waiting for the server" in err and err.count("waiting for the server") == 1, err
    assert int(re.search(r"sent (\d+) request", out).group(1)) >= 3, out + err
