"""Routes in a namespace: a profile route never costs the node its default route, and a route
that existed is put back exactly as it was (next hop, metric, protocol, MTU)."""
import subprocess
import sys

import pytest

from .conftest import TIMEOUT, sh, write_profile

pytestmark = pytest.mark.root


def test_a_default_wan_route_is_refused_and_the_default_route_kept(net, tmp_path):
    sh("ip", "-n", net.A, "route", "add", "default", "via", net.ipb)
    before = net.routes("route", "show", "table", "all")
    p = write_profile(tmp_path, f"network:\n  wan_routes:\n    - {{prefix: 0.0.0.0/0, via: {net.ipb}, mtu: 1400}}\n")
    st = tmp_path / "st"
    r = net.hk("apply", "--profile", p, state=st)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{p}:3: network.wan_routes[0].prefix: a default route" in r.stderr
    assert "Traceback" not in r.stderr
    net.hk("rollback", state=st)
    assert net.routes("route", "show", "table", "all") == before
    assert f"default via {net.ipb}" in net.routes("route", "show", "default")


def test_rollback_never_deletes_a_default_route(net, tmp_path):
    """A saved entry (tampered, or from another version) that says 'this run added 0.0.0.0/0':
    restore refuses to delete the default route."""
    sh("ip", "-n", net.A, "route", "add", "default", "via", net.ipb, "mtu", "1400")
    before = net.routes("route", "show", "default")
    code = f"""
import sys
from hkgpu_tune.backends import Backends
from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.profile import Profile
from hkgpu_tune.core.report import Change
from hkgpu_tune.subsystems.link import Plugin
b = Backends()
ln = next(x for x in b.net.links() if x["name"] == "{net.a}")
data = {{"identity": {{"name": ln["name"], "perm_mac": ln.get("perm_mac"), "mac": ln["mac"]}}, "orig": None,
        "want": {{"gateway": "{net.ipb}", "dev": None, "mtu": 1400}}}}
try:
    Plugin(Profile(path="-"), b).restore(Change("link", "route 0.0.0.0/0", "mtu", None, 1400, data))
except HkError as e:
    print("refused:", e)
    sys.exit(0)
sys.exit(3)
"""
    p = subprocess.run(["ip", "netns", "exec", net.A, sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert p.returncode == 0 and "never deletes a default route" in p.stdout, p.stdout + p.stderr
    assert net.routes("route", "show", "default") == before != ""


def table(net, fam):
    """Every route of the family, in detail (link-local ones left out: the kernel adds them late)."""
    return [ln for ln in net.routes("-d", fam, "route", "show", "table", "all").splitlines() if "fe80" not in ln]


@pytest.mark.slow
def test_a_route_with_another_next_hop_is_restored_exactly(net, tmp_path):
    # a second next hop on the same link, and a route to a WAN prefix through it
    sh("ip", "-n", net.B, "addr", "add", f"198.18.{net.net}.3/24", "dev", net.b)
    prefix = f"198.19.{net.net}.0/24"
    sh("ip", "-n", net.A, "route", "add", prefix, "via", f"198.18.{net.net}.3", "metric", "50", "proto", "static",
       "mtu", "1400")
    before = table(net, "-4")
    p = write_profile(tmp_path, f"""\
network:
  wan_routes:
    - {{prefix: {prefix}, via: {net.ipb}, mtu: 1500}}
    - {{prefix: 198.19.{net.net + 1}.0/24, via: {net.ipb}, mtu: 1500}}
""")
    st = tmp_path / "st"
    rc, doc = net.hkjson("apply", "--profile", p, state=st)
    assert doc["error"] == "" and rc == 0, doc
    shown = net.routes("route", "show", prefix)
    assert f"via {net.ipb}" in shown and "mtu 1500" in shown and "metric 50" in shown, shown
    assert f"via {net.ipb}" in net.routes("route", "show", f"198.19.{net.net + 1}.0/24")   # added
    r = net.hk("rollback", state=st)
    assert r.returncode == 0, r.stdout + r.stderr
    assert table(net, "-4") == before
    assert not (st / "state.json").exists()


def test_an_ipv6_route_mtu_is_set_and_restored(net, tmp_path):
    sh("ip", "-n", net.A, "-6", "route", "add", "2001:2:0:1::/64", "via", net.ip6b, "metric", "70")
    before = table(net, "-6")
    p = write_profile(tmp_path, 'network:\n  wan_routes: [{prefix: "2001:2:0:1::/64", mtu: 1280}]\n')
    st = tmp_path / "st"
    rc, doc = net.hkjson("apply", "--profile", p, state=st)
    assert doc["error"] == "" and rc == 0, doc
    shown = net.routes("-6", "route", "show", "2001:2:0:1::/64")
    assert "mtu 1280" in shown and f"via {net.ip6b}" in shown and "metric 70" in shown, shown
    r = net.hk("rollback", state=st)
    assert r.returncode == 0, r.stdout + r.stderr
    assert table(net, "-6") == before


@pytest.mark.parametrize("six", [True, False], ids=["ipv6", "ipv4"])
def test_a_route_apply_creates_is_recorded_and_removed_by_rollback(net, tmp_path, six):
    """A route the profile creates (none before): IPv6 as IPv4, recorded whole and removed again;
    never left in the kernel without a record."""
    fam = "-6" if six else "-4"
    prefix, via = ("2001:2:0:7::/64", net.ip6b) if six else ("198.19.77.0/24", net.ipb)
    before = table(net, fam)
    p = write_profile(tmp_path, f'network:\n  wan_routes: [{{prefix: "{prefix}", via: "{via}", mtu: 1280}}]\n')
    st = tmp_path / "st"
    rc, doc = net.hkjson("apply", "--profile", p, "--only", "link", state=st)
    assert doc["error"] == "" and rc == 0, doc
    shown = net.routes(fam, "route", "show", prefix)
    assert "mtu 1280" in shown and f"via {via}" in shown, shown
    r = net.hk("rollback", state=st)
    assert r.returncode == 0, r.stdout + r.stderr
    assert table(net, fam) == before


def test_a_route_write_the_kernel_takes_otherwise_leaves_nothing_behind(tmp_path):
    """The kernel shows another route than the one written (the IPv6 default metric once was such a
    case, in the priority): the write fails, and the route it added is removed before the failure is reported, so
    nothing is left in the kernel without a record."""
    from hkgpu_tune.core.profile import parse_profile_text
    from hkgpu_tune.tune.engine import Engine

    from ..unit.test_engine import host
    b = host()
    real_route = type(b.net).route

    def skewed(self, prefix, table=254):
        r = real_route(self, prefix, table)
        return r and {**r, "mtu": 1500}      # the kernel kept another MTU than the one written
    b.net.route = skewed.__get__(b.net)
    text = 'network:\n  wan_routes: [{prefix: "2001:2:0:9::/64", dev: ens1f0, mtu: 1280}]\n'
    rep = Engine(parse_profile_text(text, "t.yaml"), only=["link"], state_dir=str(tmp_path / "st"),
                 backends=b).apply()
    assert "the kernel shows mtu 1500" in rep.error and rep.rolled_back, rep.error
    assert "2001:2:0:9::/64" not in b.net.routes
    assert not (tmp_path / "st" / "state.json").exists()
