"""A device deleted, or replaced by another of the same name (and even the same ifindex), between
apply and rollback is never touched: rollback reports it and keeps its originals until it returns."""
import pytest

from .conftest import sh, write_profile

pytestmark = pytest.mark.root


def features(net):
    return sh("ethtool", "-k", net.a, ns=net.A).stdout


def recreate(net, index, mac):
    sh("ip", "-n", net.A, "link", "add", net.a, "index", str(index), "address", mac, "type", "veth",
       "peer", "name", net.b, "netns", net.B)
    for ns, dev, ip in ((net.A, net.a, net.ipa), (net.B, net.b, net.ipb)):
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")


@pytest.mark.slow
def test_a_replaced_device_is_not_touched_and_its_entry_kept(net, tmp_path):
    sh("ip", "-n", net.B, "link", "set", net.b, "mtu", "9000")
    first = net.link()
    p = write_profile(tmp_path, f"""\
network:
  interfaces:
    - match: {{name: {net.a}}}
      mtu: 9000
      offloads: {{gro: true}}
  fabric_peers: [{net.ipb}]
""")
    st = tmp_path / "st"
    rc, doc = net.hkjson("apply", "--profile", p, "--only", "link,ethtool", state=st)
    assert doc["error"] == "" and rc == 0, doc
    assert net.link()["mtu"] == 9000 and "generic-receive-offload: on" in features(net)

    # replaced: same name, same ifindex, another MAC, set up by someone else: not touched
    sh("ip", "-n", net.A, "link", "del", net.a)
    other = "02:00:5e:10:00:01" if first["address"] != "02:00:5e:10:00:01" else "02:00:5e:10:00:02"
    recreate(net, first["ifindex"], other)
    sh("ip", "-n", net.A, "link", "set", net.a, "mtu", "1400")
    sh("ethtool", "-K", net.a, "gro", "on", ns=net.A)
    seen = features(net)
    r = net.hk("rollback", state=st)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "was replaced" in out and first["address"] in out and other in out, out
    now = net.link()
    assert (now["ifindex"], now["address"], now["mtu"]) == (first["ifindex"], other, 1400)
    assert features(net) == seen

    # gone: rollback names it and keeps its originals
    sh("ip", "-n", net.A, "link", "del", net.a)
    r = net.hk("rollback", state=st)
    assert r.returncode == 1 and "the device is gone" in r.stdout + r.stderr, r.stdout + r.stderr
    assert (st / "state.json").exists()

    # the device returns (its own MAC): the kept originals are restored
    recreate(net, first["ifindex"], first["address"])
    sh("ip", "-n", net.A, "link", "set", net.a, "mtu", "9000")
    sh("ethtool", "-K", net.a, "gro", "on", ns=net.A)
    r = net.hk("rollback", state=st)
    assert r.returncode == 0, r.stdout + r.stderr
    assert net.link()["mtu"] == 1500 and "generic-receive-offload: off" in features(net)
    assert not (st / "state.json").exists()


def test_a_replaced_device_gets_its_own_original_when_apply_runs_again(net, tmp_path):
    """Same name, another device: a second apply saves the new device's original; rollback puts
    the new one back and reports (and keeps) the old one's."""
    sh("ip", "-n", net.B, "link", "set", net.b, "mtu", "9000")
    first = net.link()
    p = write_profile(tmp_path, f"network:\n  interfaces:\n    - match: {{name: {net.a}}}\n      mtu: 9000\n"
                                f"  fabric_peers: [{net.ipb}]\n")
    st = tmp_path / "st"
    rc, doc = net.hkjson("apply", "--profile", p, "--only", "link", state=st)
    assert rc == 0 and doc["error"] == "", doc
    sh("ip", "-n", net.A, "link", "del", net.a)
    other = "02:00:5e:10:00:01" if first["address"] != "02:00:5e:10:00:01" else "02:00:5e:10:00:02"
    recreate(net, first["ifindex"], other)
    sh("ip", "-n", net.A, "link", "set", net.a, "mtu", "1400")
    sh("ip", "-n", net.B, "link", "set", net.b, "mtu", "9000")
    rc, doc = net.hkjson("apply", "--profile", p, "--only", "link", state=st)
    assert rc == 0 and doc["error"] == "" and net.link()["mtu"] == 9000, doc
    r = net.hk("rollback", state=st)
    out = r.stdout + r.stderr
    assert net.link()["mtu"] == 1400, out            # the new device's own original
    assert r.returncode == 1 and "was replaced" in out and first["address"] in out, out
    assert (st / "state.json").exists()              # the old device's original is kept


def test_a_rollback_in_another_namespace_never_writes_there(net, tmp_path):
    key = "net.ipv4.tcp_mtu_probing"

    def val(ns):
        return sh("sysctl", "-n", key, ns=ns).stdout.strip()
    sh("sysctl", "-w", f"{key}=0", ns=net.A)
    sh("sysctl", "-w", f"{key}=2", ns=net.B)
    p = write_profile(tmp_path, f"sysctl:\n  {key}: 1\n")
    st = tmp_path / "st"
    rc, doc = net.hkjson("apply", "--profile", p, "--only", "sysctl", state=st)
    assert rc == 0 and val(net.A) == "1", doc
    r = net.hk("rollback", state=st, ns=net.B)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "another network namespace" in out, out
    assert val(net.B) == "2" and val(net.A) == "1"
    r = net.hk("rollback", state=st)                 # in its own namespace: restored
    assert r.returncode == 0 and val(net.A) == "0", r.stdout + r.stderr
