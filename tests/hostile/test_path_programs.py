"""Root runs no program found on PATH that another user owns or can write (or whose directory
they can write): the one trust rule of core/fsutil, at every place a program is looked up by name
(the Command backend, the MPS control program, iperf3, the collectors' ethtool/journalctl/ping)."""
import os
import pwd
import subprocess
import sys

import pytest

from hkgpu_tune.backends.command import Command
from hkgpu_tune.backends.mps import MpsControl
from hkgpu_tune.core.errors import HkError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the rule is root's: needs root")
NOBODY = pwd.getpwnam("nobody").pw_uid


def stand_in(d, name, marker, mode=0o755, owner=0):
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text(f"#!/bin/sh\ntouch {marker}\necho ran\n")
    os.chmod(p, mode)
    os.chown(p, owner, owner)
    return p


@pytest.fixture(params=["dir-writable", "file-writable", "file-owned"])
def hostile(request, tmp_path):
    """A directory put first on PATH that holds a program root must refuse, and the marker it leaves."""
    d, marker = tmp_path / "bin", tmp_path / "ran"
    kind = request.param
    yield d, marker, lambda name: stand_in(
        d, name, marker, mode=0o777 if kind == "file-writable" else 0o755,
        owner=NOBODY if kind == "file-owned" else 0), kind
    assert not marker.exists(), f"root ran a program another user controls ({kind})"


def on_path(monkeypatch, d):
    monkeypatch.setenv("PATH", f"{d}:{os.environ['PATH']}")


def test_the_command_backend_refuses(monkeypatch, hostile):
    d, marker, make, kind = hostile
    make("ethtool")
    if kind == "dir-writable":
        os.chmod(d, 0o777)
    on_path(monkeypatch, d)
    with pytest.raises(HkError, match="refused"):
        Command().run(["ethtool", "--version"])


def test_the_mps_control_program_is_refused(monkeypatch, hostile):
    d, marker, make, kind = hostile
    make("nvidia-cuda-mps-control")
    if kind == "dir-writable":
        os.chmod(d, 0o777)
    on_path(monkeypatch, d)
    with pytest.raises(HkError, match="refused"):
        MpsControl()._exe()


def test_baseline_serve_refuses_an_iperf3_another_user_controls(hostile):
    d, marker, make, kind = hostile
    make("iperf3")
    if kind == "dir-writable":
        os.chmod(d, 0o777)
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "baseline", "serve", "--bind", "127.0.0.1",
                        "--port", "5398", "--seconds", "2"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PATH": f"{d}:{os.environ['PATH']}"})
    assert p.returncode == 1 and "refused" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_trusted_program_on_path_runs(monkeypatch, tmp_path):
    """The control: the same program, root's own in a directory only root writes, is run."""
    marker = tmp_path / "ran"
    stand_in(tmp_path / "bin", "ethtool", marker)
    on_path(monkeypatch, tmp_path / "bin")
    assert Command().run(["ethtool", "--version"]).out == "ran\n"
    assert marker.exists()
