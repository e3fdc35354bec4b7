"""The server's user must reach what the server reads. Found on the VM test node: the role's model
repository lay inside the 0700 state directory (/var/lib/hkgpu-tune), so the unit, running as
triton-server, died with only "failed to stat file" in the journal and apply reported a service
that stopped before ready. Now start() refuses first, naming the directory that blocks, and
writes no unit."""
from __future__ import annotations

import os
import pwd
import shutil
import tempfile

import pytest

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.serve.repository import render
from hkgpu_tune.serve.running import launch

from .conftest import dump, free_ports, profile_dict
from .test_verify_units import systemd

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (directories owned by root, user nobody)")
USER = "nobody"


@pytest.fixture
def base():
    """A directory every user can search (pytest's own tmp dirs are 0700), removed afterwards."""
    d = tempfile.mkdtemp(prefix="hkgpu-access-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d)


def section(base, repo_parent_mode: int, user=USER):
    """A binary-form profile whose repository lies in base/parent (of the given mode); the server
    is an executable of the test's own, so nothing outside base is read."""
    parent = os.path.join(base, "parent")
    os.makedirs(os.path.join(base, "server", "bin"))
    server = os.path.join(base, "server", "bin", "tritonserver")
    with open(server, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(server, 0o755)
    os.mkdir(parent)
    os.chmod(parent, repo_parent_mode)
    doc = profile_dict(parent, free_ports(3))
    doc["triton"].update(server=server, user=user, supervisor="systemd", run_dir=os.path.join(base, "run"))
    t = parse_profile_text(dump(doc), os.path.join(base, "p.yaml")).section("triton")
    render.write_repository(t)
    return t


def test_a_repository_the_user_cannot_reach_is_refused_before_any_unit(tmp_path, base):
    t = section(base, 0o700)
    b, cmd = systemd(tmp_path)
    with pytest.raises(HkError) as e:
        launch.start(t, b, place={"cpus": [0], "mems": [], "source": "test"})
    msg = str(e.value)
    assert f"runs as {USER}, who cannot reach {base}/parent/models: {base}/parent is mode 0700 owned by root" in msg
    assert "triton.model_repository: /var/lib/hkgpu-triton/models" in msg and "\n" not in msg
    assert not (tmp_path / "root" / "etc" / "systemd" / "system" / "hkgpu-triton.service").exists()
    assert not any(c[0] in ("enable", "start") for c in cmd.calls), cmd.calls


def test_a_group_the_user_is_not_in_does_not_open_it(tmp_path, base):
    t = section(base, 0o750)          # root:root 0750: nobody is neither owner nor in the group
    b, _ = systemd(tmp_path)
    with pytest.raises(HkError, match="is mode 0750 owned by root"):
        launch.start(t, b, place={"cpus": [0], "mems": [], "source": "test"})


def test_a_reachable_repository_starts(tmp_path, base):
    t = section(base, 0o755)
    b, cmd = systemd(tmp_path)
    st = launch.start(t, b, place={"cpus": [0], "mems": [], "source": "test"})
    assert st["active"] and ["enable", "--now", "hkgpu-triton.service"] in cmd.calls
    unit = (tmp_path / "root" / "etc" / "systemd" / "system" / "hkgpu-triton.service").read_text()
    assert f"User={USER}" in unit.splitlines()


def test_a_user_that_does_not_exist_is_named(tmp_path, base):
    name = "hkgpu-no-such-user"
    with pytest.raises(KeyError):
        pwd.getpwnam(name)
    t = section(base, 0o755, user=name)
    b, _ = systemd(tmp_path)
    with pytest.raises(HkError, match=f"user '{name}' does not exist"):
        launch.start(t, b, place={"cpus": [0], "mems": [], "source": "test"})
