"""Interfaces meet profile rules in one place (hkgpu_tune.core.match): globs and permanent MACs match,
and two rules that set one key of one device differently are an error naming both lines."""
import pytest

from hkgpu_tune.core.match import identity, matches, same_device
from hkgpu_tune.core.profile import Match

from .conftest import sh, write_profile


@pytest.mark.root
def test_two_rules_setting_one_device_differently_name_both_lines(net, tmp_path):
    mac = net.link()["address"]
    p = write_profile(tmp_path, f"""\
network:
  interfaces:
    - match: {{name: "hkdata*"}}
      mtu: 9000
      offloads: {{gro: true}}
    - match: {{mac: "{mac}"}}
      mtu: 1500
      offloads: {{gso: true}}
""")
    offloads = sh("ethtool", "-k", net.a, ns=net.A).stdout
    want = (f"hkgpu-tune: error: {p}:3: network.interfaces: the rules at lines 3 and 6 both match {net.a} "
            "and set mtu differently (9000 and 1500)")
    # bad input stops the whole run before any write: no subsystem applies, not even the ones that agree
    for args in (("verify",), ("apply",), ("apply", "--only", "link"), ("plan", "--json")):
        r = net.hk(*args, "--profile", p, state=tmp_path / "st")
        assert r.returncode == 1 and r.stderr.strip() == want and "Traceback" not in r.stderr, r.stderr
    assert net.link()["mtu"] == 1500 and not (tmp_path / "st" / "state.json").exists()
    assert sh("ethtool", "-k", net.a, ns=net.A).stdout == offloads


@pytest.mark.root
def test_rules_that_agree_or_set_other_keys_merge(net, tmp_path):
    p = write_profile(tmp_path, f"""\
network:
  interfaces:
    - match: {{name: "hkdata*"}}
      offloads: {{gro: true}}
    - match: {{name: {net.a}}}
      offloads: {{gro: true, gso: false}}
""")
    rc, doc = net.hkjson("verify", "--profile", p, "--only", "ethtool")
    keys = sorted((r["target"], r["key"]) for r in doc["results"])
    assert keys == [(net.a, "gro"), (net.a, "gso")], doc   # one result per key, not per rule


def test_match_keys():
    ln = {"name": "ens1f0", "mac": "02:00:00:00:00:01", "perm_mac": "0c:42:a1:00:00:01", "driver": "mlx5_core",
          "pci": "0000:3b:00.0", "default_route": False}
    assert matches(Match(name="ens*"), ln) and matches(Match(name="ens1f[0-1]"), ln)
    assert not matches(Match(name="ens1"), ln) and not matches(Match(name="eth*"), ln)
    assert matches(Match(mac="0C:42:A1:00:00:01"), ln) and matches(Match(mac="02:00:00:00:00:01"), ln)
    assert not matches(Match(name="ens*", driver="igb"), ln)
    assert not matches(Match(default_route=True), ln)
    # identity: the permanent MAC decides where there is one; the current MAC where there is none
    ident = identity(ln)
    assert ident == {"name": "ens1f0", "perm_mac": "0c:42:a1:00:00:01", "mac": "02:00:00:00:00:01"}
    assert same_device(ident, {**ln, "mac": "02:aa:00:00:00:01", "index": 99})
    assert not same_device(ident, {**ln, "perm_mac": "0c:42:a1:00:00:02"})
    veth = {**ln, "perm_mac": None}
    assert same_device(identity(veth), veth) and not same_device(identity(veth), {**veth, "mac": "02:00:00:00:00:09"})

