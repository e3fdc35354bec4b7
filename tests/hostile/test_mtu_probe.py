"""The safe-MTU probe is never skipped: a peer not routed through an interface whose MTU the profile
sets, or a raised interface that is down, fails the apply naming it; IPv6 peers are probed with
IPv6 sizes (MTU - 48)."""
import pytest

from .conftest import sh, write_profile

pytestmark = pytest.mark.root


def profile(tmp_path, net, peers):
    return write_profile(tmp_path, f"""\
network:
  interfaces:
    - match: {{name: {net.a}}}
      mtu: 9000
  fabric_peers: [{', '.join(f'"{p}"' for p in peers)}]
  probe: {{gateway: false, count: 1, timeout_s: 1}}
""")


def test_a_peer_not_routed_through_the_changed_interface_fails_the_apply(net, tmp_path):
    net.veth("hkother0", "hkother1", net.net)
    sh("ip", "-n", net.B, "link", "set", net.b, "mtu", "9000")
    elsewhere = f"198.19.{net.net}.2"
    rc, doc = net.hkjson("apply", "--profile", profile(tmp_path, net, [net.ipb, elsewhere]), state=tmp_path / "st")
    assert rc == 1 and doc["rolled_back"], doc
    assert f"fabric peer {elsewhere} is routed through hkother0" in doc["error"]
    assert net.link()["mtu"] == 1500


def test_a_changed_interface_that_is_down_fails_the_apply(net, tmp_path):
    sh("ip", "-n", net.B, "link", "set", net.b, "mtu", "9000")
    sh("ip", "-n", net.A, "link", "set", net.a, "down")
    rc, doc = net.hkjson("apply", "--profile", profile(tmp_path, net, [net.ipb]), state=tmp_path / "st")
    assert rc == 1 and doc["rolled_back"], doc
    assert f"{net.a} is down" in doc["error"] and f"fabric peer {net.ipb}: no route" in doc["error"]
    assert net.link()["mtu"] == 1500


def test_an_ipv6_peer_is_probed_with_ipv6_sizes(net, tmp_path):
    p = profile(tmp_path, net, [net.ip6b])
    # the peer at 1500: the probe fails, naming the peer and the IPv6 size
    rc, doc = net.hkjson("apply", "--profile", p, state=tmp_path / "st")
    assert rc == 1, doc
    assert f"fabric peer {net.ip6b} did not answer a 8952-byte don't-fragment ping via {net.a}" in doc["error"]
    assert net.link()["mtu"] == 1500
    # the peer at 9000: a full 9000-byte IPv6 packet passes
    sh("ip", "-n", net.B, "link", "set", net.b, "mtu", "9000")
    rc, doc = net.hkjson("apply", "--profile", p, state=tmp_path / "st")
    assert doc["error"] == "" and rc == 0, doc
    assert net.link()["mtu"] == 9000
