"""What the packaging tests share: one wheel built from a clean copy of the source tree, and a
small simulated rack (tests/rack/simrack.py: real sshd per network namespace)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO, env_tools_on_path, missing_tool

sys.path.insert(0, os.path.join(REPO, "tests", "rack"))
import simrack  # noqa: E402

env_tools_on_path()
HOSTS = 2
# not part of the package: left out of the copy the wheel is built from
_NOT_SHIPPED = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".venv",
                                      ".pytest_cache", ".cache", ".whl", ".gl", "bench", "docs")


def NOT_SHIPPED(d, names):
    """No tests either, but tests/infra: the testinfra checks the collection ships (links to them)."""
    out = set(_NOT_SHIPPED(d, names))
    if "tests" in names and os.path.realpath(d) != os.path.realpath(REPO):
        out.add("tests")
    if os.path.realpath(d) == os.path.realpath(os.path.join(REPO, "tests")):
        out |= {n for n in names if n != "infra"}
    return out


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> str:
    """hkgpu_tune-*.whl built (pip wheel, no index) from a copy of the tree: never the shared build/."""
    d = tmp_path_factory.mktemp("wheel")
    src = d / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=NOT_SHIPPED)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                        "--quiet", "--wheel-dir", str(d / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (whl,) = (d / "dist").glob("hkgpu_tune-*.whl")
    return str(whl)


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    """A rack of HOSTS simulated hosts; removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("the simulated rack needs root (network namespaces, sshd)")
    why = missing_tool(("/usr/sbin/sshd", "ssh", "ssh-keygen", "ip", "ethtool", "ansible-playbook", "/usr/bin/python3"))
    if why:
        pytest.skip(why)
    run = str(tmp_path_factory.mktemp("hkrack"))
    # as an operator's inventory: connection, per-host paths and the settings; the node venv is
    # made from the system's python3 (the role's default), which lacks some dependencies: the
    # controller ships them
    inv = simrack.up(HOSTS, run=run, python=None)
    names = simrack.host_names(HOSTS)
    try:
        yield {"inventory": inv, "hosts": names, "dir": run,
               "originals": {n: simrack.snapshot(n) for n in names}}
    finally:
        simrack.down(run, quiet=True)
