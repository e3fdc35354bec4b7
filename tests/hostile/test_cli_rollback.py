"""`rollback --only` restores just the subsystems it names (the rest stay applied and saved), then a
plain rollback restores the rest; run in a namespace pair of the test's own."""
import re

import pytest

from .conftest import sh, write_profile

pytestmark = pytest.mark.root


def gro(net):
    return re.search(r"^generic-receive-offload: (on|off)", sh("ethtool", "-k", net.a, ns=net.A).stdout, re.M)[1]


def probing(net):
    return sh("cat", "/proc/sys/net/ipv4/tcp_mtu_probing", ns=net.A).stdout.strip()


def test_rollback_only_restores_just_those_subsystems(net, tmp_path):
    gro0, probing0 = gro(net), probing(net)
    want_gro = "off" if gro0 == "on" else "on"
    want_probing = "2" if probing0 != "2" else "1"
    prof = write_profile(tmp_path, f"sysctl:\n  net.ipv4.tcp_mtu_probing: {want_probing}\n"
                                   f"network:\n  interfaces:\n    - match: {{name: {net.a}}}\n"
                                   f"      offloads: {{gro: {'true' if want_gro == 'on' else 'false'}}}\n")
    st = tmp_path / "st"
    rc, doc = net.hkjson("apply", "--profile", prof, state=st)
    assert rc == 0 and doc["error"] == "", doc
    assert (gro(net), probing(net)) == (want_gro, want_probing)

    rc, doc = net.hkjson("rollback", "--only", "sysctl", state=st)
    assert rc == 0, doc
    assert {c["subsystem"] for c in doc["restored"]} == {"sysctl"}
    assert (gro(net), probing(net)) == (want_gro, probing0)  # the offload stays applied

    p = net.hk("rollback", "--only", "sysctl", state=st)
    assert p.returncode == 0 and "nothing to roll back" in p.stdout and "for sysctl" in p.stdout, p.stdout

    rc, doc = net.hkjson("rollback", state=st)
    assert rc == 0 and {c["subsystem"] for c in doc["restored"]} == {"ethtool"}, doc
    assert (gro(net), probing(net)) == (gro0, probing0)


def test_rollback_only_unknown_subsystem_is_refused(net, tmp_path):
    p = net.hk("rollback", "--only", "sysctl,nope", state=tmp_path / "st")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.startswith("hkgpu-tune: error: rollback --only: unknown subsystem nope"), p.stderr
