"""TCP keepalive from the shipped profiles, applied in a namespace and seen on a real socket."""
import re
import sys

import pytest

from hkgpu_tune.core.profile import load_profile, resolve_profile

from .conftest import sh, statuses

KEYS = {"net.ipv4.tcp_keepalive_time": "60", "net.ipv4.tcp_keepalive_intvl": "10",
        "net.ipv4.tcp_keepalive_probes": "6"}

# a connected pair of sockets over loopback, SO_KEEPALIVE on, then the kernel's own view of its timer
SOCKET = r"""
import socket, subprocess, sys
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
c = socket.socket(); c.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
c.connect(srv.getsockname()); s, _ = srv.accept()
port = c.getsockname()[1]
print(subprocess.run(["ss", "-tnoH", "state", "established", f"sport = :{port}"],
                     capture_output=True, text=True).stdout)
"""


@pytest.mark.parametrize("name", ["hk-inference", "hk-latency"])
def test_shipped_profiles_set_keepalive(name):
    keys = {s.key: s.value for s in load_profile(resolve_profile(name)).sysctl}
    assert {k: keys.get(k) for k in KEYS} == KEYS
    # a dead peer is found well inside the kernel's default 7875 s, probes well inside a 300 s NAT timeout
    assert int(keys["net.ipv4.tcp_keepalive_time"]) < 300
    text = open(resolve_profile("hk-inference")).read()
    assert "60 + 6 x 10 = 120 s" in text      # the profile says why


def test_default_profile_keepalive_applied_and_rolled_back(pair, tmp_path):
    before = {k: sh("sysctl", "-n", k, ns=pair.A).stdout.strip() for k in KEYS}
    assert before["net.ipv4.tcp_keepalive_time"] == "7200"   # a new namespace has the kernel's defaults
    rc, doc = pair.hkjson("apply", "--profile", "hk-inference", "--only", "sysctl", state=tmp_path / "st")
    s = statuses(doc)
    assert doc["error"] == "", doc["error"]
    for k, v in KEYS.items():
        assert s[("sysctl", "host", k)] == "ok"
        assert sh("sysctl", "-n", k, ns=pair.A).stdout.strip() == v
    # the kernel gives a new SO_KEEPALIVE socket the new idle time (ss shows the running timer)
    out = sh(sys.executable, "-c", SOCKET, ns=pair.A).stdout
    m = re.search(r"timer:\(keepalive,(\d+)(?:min|sec)", out)
    assert m, out
    assert "keepalive,1min" in out or 50 <= int(m.group(1)) <= 60, out
    assert pair.hk("rollback", state=tmp_path / "st").returncode == 0
    assert {k: sh("sysctl", "-n", k, ns=pair.A).stdout.strip() for k in KEYS} == before
