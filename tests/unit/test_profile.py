import pytest

from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.profile import load_profile, parse_profile_text

MINIMUM = """\
network:
  interfaces:
    - match: {name: eth0}
      mtu: 9000
      channels: {combined: max}
      rings: {rx: max, tx: max}
      offloads: {gro: true, gso: true, tso: true, lro: false}
      qdisc: fq_codel
sysctl:
  net.core.rmem_max: 268435456
"""


def err(text, file="hk.yaml"):
    with pytest.raises(ProfileError) as e:
        parse_profile_text(text, file)
    return str(e.value)


def test_minimum_shape_from_the_issue():
    p = parse_profile_text(MINIMUM, "hk.yaml")
    i = p.network.interfaces[0]
    assert (i.match.name, i.mtu, i.channels.combined, i.rings.rx, i.qdisc) == ("eth0", 9000, "max", "max", "fq_codel")
    assert i.offloads == {"gro": True, "gso": True, "tso": True, "lro": False}
    assert p.sysctl[0].key == "net.core.rmem_max" and p.sysctl[0].value == "268435456"
    assert p.sysctl[0].compare == "at_least"


@pytest.mark.parametrize("name", ["hk-inference", "hk-latency"])
def test_shipped_profiles_load(name):
    p = load_profile(name)
    keys = {s.key: s.value for s in p.sysctl}
    assert keys["net.core.default_qdisc"] == "fq_codel"
    assert p.network.interfaces[0].mtu == 9000


def test_default_profile_holds_the_seed_settings():
    p = load_profile(None)
    keys = {s.key: s.value for s in p.sysctl}
    assert keys["net.core.rmem_max"] == keys["net.core.wmem_max"] == "268435456"
    assert keys["net.core.netdev_max_backlog"] == "250000"
    assert keys["net.ipv4.tcp_rmem"].split()[-1] == keys["net.ipv4.tcp_wmem"].split()[-1] == "268435456"
    assert keys["net.ipv4.tcp_mtu_probing"] == "1"
    i = p.network.interfaces[0]
    assert i.offloads["gro"] and i.offloads["tso"] and i.offloads["gso"]
    assert i.channels.combined == "max" and i.rings.rx == "max" and i.qdisc == "fq_codel"


def test_mtu_error_names_file_line_and_key_path():
    text = MINIMUM.replace("mtu: 9000", "mtu: 9k")
    assert err(text) == "hk.yaml:4: network.interfaces[0].mtu: expected an integer 68-65535, got '9k'"


def test_mtu_out_of_range():
    assert "expected an integer 68-65535, got 70000" in err(MINIMUM.replace("9000", "70000"))


def test_unknown_key_with_did_you_mean():
    msg = err(MINIMUM.replace("qdisc: fq_codel", "qdsic: fq_codel"))
    assert msg.startswith("hk.yaml:8: network.interfaces[0].qdsic: unknown key; did you mean 'qdisc'?")


def test_unknown_top_level_section():
    assert "did you mean 'network'" in err("netwrok: {}\n")


def test_duplicate_key():
    msg = err(MINIMUM + "  net.core.rmem_max: 1\n")
    assert "hk.yaml:11: sysctl.net.core.rmem_max: duplicate key (first at line 10)" == msg


@pytest.mark.parametrize("name", ["eth0/../x", "a" * 16, "..", "eth 0", "eth:0"])
def test_bad_interface_names(name):
    msg = err(MINIMUM.replace("{name: eth0}", "{name: '%s'}" % name))
    assert "network.interfaces[0].match.name: expected an interface name" in msg


@pytest.mark.parametrize("key", ["net/../../etc/shadow", "..net.core", "Net.Core.X", "net..core"])
def test_sysctl_keys_that_leave_proc_sys(key):
    msg = err(f"sysctl:\n  '{key}': 1\n")
    assert msg.startswith("hk.yaml:2: sysctl.") and ("not a sysctl key" in msg or "leaves /proc/sys" in msg)


def test_wrong_types():
    assert "offloads.gro: expected true or false, got 'maybe'" in err(MINIMUM.replace("gro: true", "gro: maybe"))
    assert "channels.combined: expected 'max' or an integer" in err(MINIMUM.replace("combined: max", "combined: lots"))
    assert "qdisc: expected one of" in err(MINIMUM.replace("qdisc: fq_codel", "qdisc: fq_codle"))
    assert "network.interfaces: expected a list" in err("network:\n  interfaces: eth0\n")
    assert "at_least' needs numbers" in err("sysctl:\n  net.core.rmem_max: {value: big, compare: at_least}\n")


def test_match_must_say_something_and_mac_pci_are_checked():
    assert "expected at least one of" in err("network:\n  interfaces:\n    - match: {}\n")
    assert "expected a MAC address" in err("network:\n  interfaces:\n    - match: {mac: 'zz'}\n")
    assert "expected a PCI address" in err("network:\n  interfaces:\n    - match: {pci: '3b:00'}\n")
    p = parse_profile_text("network:\n  interfaces:\n    - match: {pci: '3b:00.0', default_route: true}\n")
    assert p.network.interfaces[0].match.pci == "0000:3b:00.0"


def test_peers_and_routes():
    p = parse_profile_text("""\
network:
  fabric_peers: [198.18.0.2]
  wan_peers:
    - {address: 198.19.1.1, name: singapore, rtt_ms: 35}
  wan_routes:
    - {prefix: 198.19.0.0/16, via: 198.18.0.254, mtu: 1500}
""")
    assert p.network.wan_peers[0].rtt_ms == 35 and p.network.wan_routes[0].mtu == 1500
    assert "expected an IP address, got 'gw1'" in err("network:\n  fabric_peers: [gw1]\n")
    assert "expected an IP prefix" in err("network:\n  wan_routes: [{prefix: 198.19.0.1/16}]\n")


def test_wan_peer_jitter_threshold():
    p = parse_profile_text("network:\n  wan_peers:\n    - {address: 198.19.1.1, rtt_ms: 35, jitter_ms: 4.5}\n")
    assert p.network.wan_peers[0].jitter_ms == 4.5
    assert err("network:\n  wan_peers:\n    - {address: 198.19.1.1, jitter_ms: fast}\n") == \
        "hk.yaml:3: network.wan_peers[0].jitter_ms: expected a number of milliseconds, got 'fast'"
    assert "jitter_ms: expected a number" in err("network:\n  wan_peers:\n    - {address: 198.19.1.1, jitter_ms: -1}\n")


def test_yaml_syntax_error_and_empty_and_missing(tmp_path):
    assert err("network: [\n").startswith("hk.yaml:2: not valid YAML")
    assert err("") == "hk.yaml:1: the profile is empty"
    with pytest.raises(ProfileError, match="no such profile file"):
        load_profile(tmp_path / "nope.yaml")


def test_sysctl_value_normalised_and_lists():
    p = parse_profile_text("sysctl:\n  net.ipv4.tcp_rmem: '4096\t87380   268435456'\n  net.ipv4.tcp_wmem: [4096, 65536, 1]\n"
                           "  net.ipv4.ip_forward: true\n")
    assert [s.value for s in p.sysctl] == ["4096 87380 268435456", "4096 65536 1", "1"]
