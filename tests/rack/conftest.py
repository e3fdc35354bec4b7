"""The simulated rack for the role tests: real sshd per network namespace, real ansible-playbook."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simrack  # noqa: E402

REPO = simrack.REPO
# the tools of this interpreter's environment (ansible-playbook, ansible-lint) even when its
# bin/ is not on PATH (CI runs `$VENV/bin/python -m pytest`)
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
HOSTS = int(os.environ.get("HKRACK_HOSTS", "4"))


def rack_missing() -> str:
    if os.geteuid() != 0:
        return "needs root (network namespaces, sshd)"
    for tool in ("/usr/sbin/sshd", "ssh", "ssh-keygen", "ip", "ethtool", "ansible-playbook"):
        if not shutil.which(tool):
            return f"{tool} is not installed (scripts/apt-packages.txt, pip install -e .[test])"
    return ""


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    why = rack_missing()
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
