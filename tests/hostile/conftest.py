"""Namespaces for the hostile network tests: a veth pair between two namespaces of the test's own
(198.18.N.0/24, fd00:198:18:N::/64), more links on request, all removed afterwards. Every command
runs under a timeout, so no test can hang."""
import json
import subprocess
import sys
import time

import pytest

from ..integration.conftest import Pair

TIMEOUT = 60


def sh(*argv, ns=None, check=True):
    if ns:
        argv = ("ip", "netns", "exec", ns, *argv)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {p.returncode} {p.stderr}")
    return p


class Net(Pair):
    """Pair A <-> B (veth hkdata0 in A, hkpeer0 in B), with IPv6 and extra links."""

    def __init__(self, tag="h"):
        super().__init__(tag)
        self.ip6a, self.ip6b = f"fd00:198:18:{self.net:x}::1", f"fd00:198:18:{self.net:x}::2"
        sh("ip", "-n", self.A, "addr", "add", f"{self.ip6a}/64", "dev", self.a, "nodad")
        sh("ip", "-n", self.B, "addr", "add", f"{self.ip6b}/64", "dev", self.b, "nodad")

    def veth(self, name_a, name_b, subnet):
        """A second link A <-> B on 198.19.<subnet>.0/24 (.1 in A, .2 in B)."""
        sh("ip", "link", "add", name_a, "netns", self.A, "type", "veth", "peer", "name", name_b, "netns", self.B)
        for ns, dev, ip in ((self.A, name_a, f"198.19.{subnet}.1"), (self.B, name_b, f"198.19.{subnet}.2")):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")

    def link(self, dev=None, ns=None):
        """`ip -j link show` of one device, as a dict."""
        return json.loads(sh("ip", "-j", "-n", ns or self.A, "link", "show", dev or self.a).stdout)[0]

    def routes(self, *sel, ns=None):
        # the kernel adds a link's fe80:: local route when duplicate address detection ends:
        # read routes only once no address is tentative (a snapshot taken before raced it)
        deadline = time.monotonic() + 10
        while sh("ip", "-n", ns or self.A, "-6", "addr", "show", "tentative").stdout.strip():
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return sh("ip", "-n", ns or self.A, *sel).stdout

    def hk(self, *args, state=None, ns=None):
        argv = ["ip", "netns", "exec", ns or self.A, sys.executable, "-m", "hkgpu_tune", *args]
        if state:
            argv += ["--state-dir", str(state)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)

    def hkjson(self, *args, state=None):
        p = self.hk(*args, "--json", state=state)
        try:
            return p.returncode, json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"no JSON: rc={p.returncode} {p.stdout} {p.stderr}") from None


@pytest.fixture
def net():
    n = Net()
    try:
        yield n
    finally:
        n.remove()


def write_profile(tmp_path, text, name="p.yaml"):
    f = tmp_path / name
    f.write_text(text)
    return str(f)
