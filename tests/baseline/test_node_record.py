"""A snapshot records the node (settings the profile names, NIC driver, speed, MTU, GPU versions);
compare names what changed between two snapshots beside its verdicts. Real kernel in a namespace:
the MTU and a sysctl are changed with ip and sysctl between two captures."""
import itertools
import json
import os
import subprocess
import sys

import pytest

from hkgpu_tune.baseline.node import changes

from .snapshots import snapshot, write

_n = itertools.count()


def sh(*argv, ns=None):
    if ns:
        argv = ("ip", "netns", "exec", ns, *argv)
    p = subprocess.run(argv, capture_output=True, text=True)
    assert p.returncode == 0, f"{argv}: {p.stderr}"
    return p.stdout


@pytest.fixture
def ns():
    name = f"hkt-node{os.getpid()}-{next(_n)}"
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "link", "add", "hknode0", "netns", name, "type", "veth", "peer", "name", "hknode1", "netns", name)
        sh("ip", "-n", name, "link", "set", "hknode0", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def hk(ns, *args):
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "hkgpu_tune", *args],
                          capture_output=True, text=True)


PROFILE = "network:\n  interfaces:\n    - match: {name: hknode0}\n      mtu: 1500\n" \
          "sysctl:\n  net.ipv4.tcp_keepalive_time: 60\n"


def test_compare_names_a_lowered_mtu_and_a_changed_sysctl(ns, tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text(PROFILE)
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    assert hk(ns, "baseline", "capture", "--profile", str(prof), "--quick", "--out", str(before)).returncode == 0
    node = json.loads(before.read_text())["node"]
    # recorded as the kernel shows it (read here with ip and sysctl, not through the tool)
    assert node["nics"]["hknode0"]["mtu"] == int(sh("cat", "/sys/class/net/hknode0/mtu", ns=ns))
    assert node["nics"]["hknode0"]["driver"] == "veth" and node["nics"]["hknode0"]["speed_mbit"] == 10000
    assert node["settings"]["sysctl host net.ipv4.tcp_keepalive_time"] == sh(
        "sysctl", "-n", "net.ipv4.tcp_keepalive_time", ns=ns).strip()
    assert "unsupported" in node["gpu"] or node["gpu"]["driver_version"]
    sh("ip", "-n", ns, "link", "set", "hknode0", "mtu", "1280")
    sh("sysctl", "-qw", "net.ipv4.tcp_keepalive_time=30", ns=ns)
    assert hk(ns, "baseline", "capture", "--profile", str(prof), "--quick", "--out", str(after)).returncode == 0
    p = hk(ns, "baseline", "compare", str(before), str(after), "--json")
    doc = json.loads(p.stdout)
    got = {c["what"]: (c["before"], c["after"]) for c in doc["node_changes"]}
    assert got["settings.link hknode0 mtu"] == (1500, 1280) and got["nics.hknode0.mtu"] == (1500, 1280)
    assert got["settings.sysctl host net.ipv4.tcp_keepalive_time"] == ("7200", "30")
    assert set(got) == {"settings.link hknode0 mtu", "nics.hknode0.mtu",
                        "settings.sysctl host net.ipv4.tcp_keepalive_time"}
    text = hk(ns, "baseline", "compare", str(before), str(after)).stdout
    assert "node changed: nics.hknode0.mtu: 1500 -> 1280" in " ".join(text.split())


def test_snapshot_without_a_node_record_says_so(tmp_path):
    old = write(tmp_path / "old.json", snapshot())
    new_doc = snapshot()
    new_doc["node"] = {"settings": {}}
    new = write(tmp_path / "new.json", new_doc)
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "baseline", "compare", old, new, "--json"],
                       capture_output=True, text=True)
    doc = json.loads(p.stdout)
    assert doc["node_changes"] == [] and any("no node record in " + old in w for w in doc["warnings"])


def test_changes_lists_each_side():
    assert changes({"gpu": {"driver_version": "570.1"}}, {"gpu": {"driver_version": "580.159.04"}}) == [
        {"what": "gpu.driver_version", "before": "570.1", "after": "580.159.04"}]
    assert changes({"nics": {"a": {"mtu": 9000}}}, {"nics": {}}) == [
        {"what": "nics.a.mtu", "before": 9000, "after": None}, {"what": "nics", "before": None, "after": {}}]
    assert changes({"x": 1}, {"x": 1}) == []
