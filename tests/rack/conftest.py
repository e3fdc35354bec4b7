"""The simulated rack for the role tests: real sshd per network namespace, real ansible-playbook."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simrack  # noqa: E402

from tests.helpers import env_tools_on_path, missing_tool  # noqa: E402

REPO = simrack.REPO
env_tools_on_path()
HOSTS = int(os.environ.get("HKRACK_HOSTS", "4"))


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    # root: the tests are marked root (tests/conftest.py skips them otherwise)
    why = missing_tool(("/usr/sbin/sshd", "ssh", "ssh-keygen", "ip", "ethtool", "ansible-playbook"))
    if why:
        pytest.skip(why)
    run = str(tmp_path_factory.mktemp("hkrack"))
    inv = simrack.up(HOSTS, run=run)
    wheels = str(tmp_path_factory.mktemp("wheels"))
    names = simrack.host_names(HOSTS)
    try:
        yield {"inventory": inv, "hosts": names, "dir": run,
               "extra": {"hkgpu_install_wheel_dir": wheels, "hkgpu_install_source": REPO},
               "originals": {n: simrack.snapshot(n) for n in names}}
    finally:
        simrack.down(run, quiet=True)
