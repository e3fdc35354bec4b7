"""Each simulated host's /etc is its own, also while other runs' racks come and go on the machine: what
a host writes over SSH lands in /etc/netns/NAME, never in the machine's /etc, and a host whose bind did
not take would be refused loudly before it is used (simrack's checks, tried on the machine's own /etc)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import simrack
from tests.helpers import missing_tool

pytestmark = [pytest.mark.slow, pytest.mark.root]
SIMRACK = os.path.abspath(simrack.__file__)


@pytest.fixture(autouse=True)
def tools():
    why = missing_tool(("/usr/sbin/sshd", "ssh", "ssh-keygen", "ip"))
    if why:
        pytest.skip(why)


def ssh(run: str, addr: str, cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-i", os.path.join(run, "id_ed25519"), "-o", "BatchMode=yes", "-o",
                           "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", f"root@{addr}", cmd],
                          capture_output=True, text=True, timeout=60)


def cli(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, SIMRACK, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def hosts_of(run: str, n: int) -> list[tuple[str, str]]:
    with open(os.path.join(run, "rack.json")) as f:
        k = json.load(f)["rack"]
    return [(f"hksim-{k}-n{i}", f"198.19.{k}.{10 + i}") for i in range(1, n + 1)]


def test_racks_coming_and_going_leave_each_host_its_own_etc(tmp_path):
    """Run A's rack goes down while run B's comes up (two processes started at once): B's hosts see
    their own /etc, and a file written into it over SSH is theirs, not the machine's."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    up = cli("up", "--hosts", "2", "--dir", a)
    assert up.wait(120) == 0, up.stderr.read()
    try:
        down, up = cli("down", "--dir", a), cli("up", "--hosts", "2", "--dir", b)
        assert down.wait(120) == 0, down.stderr.read()
        assert up.wait(120) == 0, up.stderr.read()
        for name, addr in hosts_of(b, 2):
            simrack.check_private_etc(name, b)
            marker = f"written-by-{name}"
            r = ssh(b, addr, f"touch /etc/hkgpu-tune/{marker} && ls -a /etc/hkgpu-tune")
            assert r.returncode == 0 and marker in r.stdout.split(), r.stdout + r.stderr
            assert os.path.exists(f"/etc/netns/{name}/hkgpu-tune/{marker}")
            assert not os.path.exists(f"/etc/hkgpu-tune/{marker}")   # the machine's own /etc: untouched
            assert simrack.nsexec(name, "ls", "/etc/hkgpu-tune").stdout.split() == [marker]
            # the checks, on a process without the host's binds (this one): each entry is named, the
            # command does not run
            bad = simrack._etc_not_own(name, "/proc/self/root")
            assert bad == [f"/etc/{e} is the machine's own" for e in simrack.PRIVATE_ETC], bad
            r = subprocess.run(["sh", "-c", simrack._OWN_ETC, name, "echo", "ran"], capture_output=True, text=True,
                               timeout=30)
            assert r.returncode == simrack.NOT_OWN and "ran" not in r.stdout, r
            assert r.stderr.startswith(f"simrack: {name}: /etc/hkgpu-tune is the machine's own"), r.stderr
    finally:
        for run in (a, b):
            subprocess.run([sys.executable, SIMRACK, "down", "--dir", run], capture_output=True, timeout=120)

