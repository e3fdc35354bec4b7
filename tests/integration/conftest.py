"""Test hosts: network namespaces joined by veth pairs, addresses in 198.18.0.0/15, removed afterwards."""
import itertools
import json
import os
import subprocess
import sys

import pytest

_ids = itertools.count(1)


def sh(*argv, check=True, ns=None):
    if ns:
        argv = ("ip", "netns", "exec", ns, *argv)
    p = subprocess.run(argv, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {p.returncode} {p.stderr}")
    return p


class Pair:
    """Two namespaces A and B; A has veth `a` (198.18.N.1), B has `b` (198.18.N.2)."""

    def __init__(self, tag, txq=2):
        n = next(_ids) + (os.getpid() % 50) * 4
        self.net = n % 250
        self.A, self.B = f"hkt-{tag}{os.getpid()}-{self.net}a", f"hkt-{tag}{os.getpid()}-{self.net}b"
        self.a, self.b = "hkdata0", "hkpeer0"
        self.ipa, self.ipb = f"198.18.{self.net}.1", f"198.18.{self.net}.2"
        sh("ip", "netns", "add", self.A)
        sh("ip", "netns", "add", self.B)
        sh("ip", "link", "add", self.a, "netns", self.A, "numtxqueues", str(txq), "numrxqueues", str(txq),
           "type", "veth", "peer", "name", self.b, "netns", self.B)
        for ns, dev, ip in ((self.A, self.a, self.ipa), (self.B, self.b, self.ipb)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def remove(self):
        for ns in (self.A, self.B):
            sh("ip", "netns", "del", ns, check=False)

    def hk(self, *args, state=None, ns=None):
        """Run the real CLI inside namespace A (or ns)."""
        argv = ["ip", "netns", "exec", ns or self.A, sys.executable, "-m", "hkgpu_tune", *args]
        if state:
            argv += ["--state-dir", str(state)]
        return subprocess.run(argv, capture_output=True, text=True)

    def hkjson(self, *args, state=None):
        p = self.hk(*args, "--json", state=state)
        try:
            return p.returncode, json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"no JSON: rc={p.returncode} {p.stdout} {p.stderr}") from None


@pytest.fixture
def pair():
    p = Pair("i")
    try:
        yield p
    finally:
        p.remove()


def statuses(doc):
    return {(r["subsystem"], r["target"], r["key"]): r["status"] for r in doc["results"]}
