"""Namespaces for the collector tests: two namespaces joined by a veth pair, 198.18.N.1 and .2,
removed afterwards."""
import itertools
import os
import shutil
import subprocess

import pytest

_ids = itertools.count(1)


def sh(*argv, check=True, ns=None, timeout=60):
    if ns:
        argv = ("ip", "netns", "exec", ns, *argv)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {p.returncode} {p.stderr}")
    return p


class Pair:
    def __init__(self):
        n = 100 + (next(_ids) + os.getpid()) % 100
        self.net = n
        self.A, self.B = f"hkcol-{os.getpid()}-{n}a", f"hkcol-{os.getpid()}-{n}b"
        self.a, self.b = "hkc0", "hkc1"
        self.ipa, self.ipb = f"198.18.{n}.1", f"198.18.{n}.2"
        sh("ip", "netns", "add", self.A)
        sh("ip", "netns", "add", self.B)
        sh("ip", "link", "add", self.a, "netns", self.A, "numtxqueues", "2", "numrxqueues", "2",
           "type", "veth", "peer", "name", self.b, "netns", self.B)
        for ns, dev, ip in ((self.A, self.a, self.ipa), (self.B, self.b, self.ipb)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def remove(self):
        for ns in (self.A, self.B):
            sh("ip", "netns", "del", ns, check=False)


@pytest.fixture
def pair():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2 (network namespaces)")
    if not shutil.which("ping"):
        pytest.skip("needs ping (Debian's iputils-ping, in scripts/apt-packages.txt)")
    p = Pair()
    try:
        yield p
    finally:
        p.remove()
