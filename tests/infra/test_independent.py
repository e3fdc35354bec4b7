"""testinfra is a second opinion, not the tool's: with a wrong compare() planted in hkgpu-tune (it
calls every sysctl and link value "ok"), the tool's verify passes a host whose settings are wrong,
and tests/infra still fails that host, on exactly those settings.

The host is a network namespace with a veth eth0 (198.18.20.2/24); its settings are put in place
with ip, sysctl and tc, then two are set wrong. Both the verify and the testinfra run happen with
the planted module loaded (sitecustomize), so testinfra runs with the bug present and is not fooled.
"""
from __future__ import annotations

import json
import os
import re
import sys

import pytest

from tests.helpers import REPO, RUN_TAG, missing_tool, sh, tagged

pytestmark = [pytest.mark.root, pytest.mark.skipif(bool(missing_tool(("ip", "ethtool", "tc", "sysctl"))),
                                                   reason="needs ip, ethtool, tc and sysctl")]
NS = tagged("hkinfra-ind")
PEER, INNER = f"hkinf{RUN_TAG}", f"hkinn{RUN_TAG}"   # host-wide link names: this run's
PROFILE = """\
name: independent
sysctl:
  net.ipv4.tcp_fin_timeout: 15
  net.ipv4.tcp_mtu_probing: 1
  net.ipv4.tcp_rmem: 4096 131072 6291456
network:
  interfaces:
    - match: {name: eth0}
      mtu: 9000
      offloads: {gro: true, tso: false}
      qdisc: pfifo_fast
"""
# the planted bug: sysctl's and link's compare() call every value "ok"
PLANT = """\
import dataclasses
from hkgpu_tune.core.report import OK
from hkgpu_tune.subsystems import link, sysctl

def _says_ok(real):
    def compare(self, state):
        return [dataclasses.replace(r, status=OK, reason="", write=None) for r in real(self, state)]
    return compare

for _mod in (sysctl, link):
    _mod.Plugin.compare = _says_ok(_mod.Plugin.compare)
"""


def ns(*argv, **kw):
    return sh(*argv, ns=NS, **kw)


def put_right():
    """The profile's settings, with the host's own tools."""
    ns("sysctl", "-qw", "net.ipv4.tcp_fin_timeout=15", "net.ipv4.tcp_mtu_probing=1",
       "net.ipv4.tcp_rmem=4096 131072 6291456")
    ns("ip", "link", "set", "eth0", "mtu", "9000")
    ns("ethtool", "-K", "eth0", "gro", "on", "tso", "off")
    ns("tc", "qdisc", "replace", "dev", "eth0", "root", "pfifo_fast")


@pytest.fixture
def node(tmp_path, request):
    if request.config.getoption("hosts", None):
        pytest.skip("a test of tests/infra itself: not part of a run against --hosts")
    sh("ip", "netns", "del", NS, check=False)
    sh("ip", "link", "del", PEER, check=False)
    try:
        sh("ip", "netns", "add", NS)
        sh("ip", "link", "add", PEER, "type", "veth", "peer", "name", INNER)
        sh("ip", "link", "set", INNER, "netns", NS)
        ns("ip", "link", "set", INNER, "name", "eth0")
        ns("ip", "addr", "add", "198.18.20.2/24", "dev", "eth0")
        ns("ip", "link", "set", "eth0", "up")
        ns("ip", "link", "set", "lo", "up")
        sh("ip", "link", "set", PEER, "mtu", "9000", "up")
        put_right()
        (tmp_path / "profile.yaml").write_text(PROFILE)
        plant = tmp_path / "plant"
        plant.mkdir()
        (plant / "sitecustomize.py").write_text(PLANT)
        yield {"profile": str(tmp_path / "profile.yaml"), "plant": str(plant), "state": str(tmp_path / "state")}
    finally:
        sh("ip", "netns", "del", NS, check=False)
        sh("ip", "link", "del", PEER, check=False)


def env(plant=None):
    e = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    e["PYTHONPATH"] = os.pathsep.join(([plant] if plant else []) + [REPO])
    return e


def verify(node, plant=None):
    r = ns(sys.executable, "-m", "hkgpu_tune", "verify", "--profile", node["profile"], "--state-dir", node["state"],
           "--json", "--only", "sysctl,link,ethtool,qdisc", check=False, env=env(plant), timeout=120)
    assert r.returncode in (0, 2), r.stderr[-2000:]
    return r.returncode, {(x["subsystem"], x["key"]): x for x in json.loads(r.stdout)["results"]}


def infra(node, plant=None):
    r = ns(sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--rootdir", REPO,
           os.path.join(REPO, "tests", "infra", "test_settings.py"), "--hosts=local://",
           f"--hkgpu-profile={node['profile']}", check=False, env=env(plant), cwd=REPO, timeout=300)
    ids = {k: sorted(m.group(1) for line in r.stdout.splitlines() if line.startswith(k)
                     for m in [re.search(r"test_setting\[(.+?)\]", line)] if m) for k in ("PASSED", "FAILED")}
    return r, ids["PASSED"], ids["FAILED"]


@pytest.mark.slow
def test_infra_independent_of_a_wrong_compare(node):
    # every setting right: the tool and testinfra agree (7 settings: 3 sysctls, mtu, gro, tso, root qdisc)
    rc, res = verify(node)
    assert rc == 0 and {x["status"] for x in res.values()} == {"ok"}, res
    r, passed, failed = infra(node)
    assert r.returncode == 0 and len(passed) == 7 and not failed, r.stdout[-3000:]

    # two settings wrong on the host
    ns("sysctl", "-qw", "net.ipv4.tcp_fin_timeout=33")
    ns("ip", "link", "set", "eth0", "mtu", "1500")
    rc, res = verify(node)                      # the real tool sees both
    assert rc == 2 and res[("sysctl", "net.ipv4.tcp_fin_timeout")]["status"] == "drift" \
        and res[("link", "mtu")]["status"] == "drift", res

    # the planted compare(): the tool's verify now says ok for both wrong values
    rc, res = verify(node, plant=node["plant"])
    assert rc == 0, res
    assert res[("sysctl", "net.ipv4.tcp_fin_timeout")]["status"] == "ok"
    assert res[("sysctl", "net.ipv4.tcp_fin_timeout")]["current"] == "33"
    assert res[("link", "mtu")]["status"] == "ok" and str(res[("link", "mtu")]["current"]) == "1500"

    # testinfra, with the same bug loaded, fails the host on exactly those two settings
    r, passed, failed = infra(node, plant=node["plant"])
    assert r.returncode == 1, r.stdout[-3000:]
    assert failed == ["local::link::eth0::mtu", "local::sysctl::host::net.ipv4.tcp_fin_timeout"], r.stdout[-3000:]
    assert len(passed) == 5, r.stdout[-3000:]
    assert "current 33, desired 15" in r.stdout and "current 1500, desired 9000" in r.stdout, r.stdout[-3000:]
