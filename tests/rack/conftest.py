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
def rack(tmp_path_factory, monkeypatch_module):
    # root: the tests are marked root (tests/conftest.py skips them otherwise)
    why = missing_tool(("/usr/sbin/sshd", "ssh", "ssh-keygen", "ip", "ethtool", "ansible-playbook"))
    if why:
        pytest.skip(why)
    run = str(tmp_path_factory.mktemp("hkrack"))
    inv = simrack.up(HOSTS, run=run)
    # the controller's wheel cache (hkgpu_install's default place) in this test's directory
    monkeypatch_module.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    names = simrack.host_names(HOSTS)
    try:
        # no extra variables: the roles' defaults, as an operator runs them
        yield {"inventory": inv, "hosts": names, "dir": run, "extra": {},
               "originals": {n: simrack.snapshot(n) for n in names}}
    finally:
        simrack.down(run, quiet=True)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp
