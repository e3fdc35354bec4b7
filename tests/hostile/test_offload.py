"""Offloads that cover several kernel features (tso: tx-tcp-segmentation, tx-tcp-ecn-segmentation,
tx-tcp-mangleid-segmentation, tx-tcp6-segmentation, tx-tcp-accecn-segmentation): each one is saved,
set, verified and put back, checked against `ethtool -k` itself."""
import re

import pytest

from .conftest import sh, write_profile

pytestmark = pytest.mark.root


def tso(net):
    """{kernel feature: on} for every tso feature `ethtool -k` shows."""
    out = sh("ethtool", "-k", net.a, ns=net.A).stdout
    return {m[1]: m[2] == "on" for m in re.finditer(r"^\s*(tx-tcp[\w-]*-segmentation): (on|off)", out, re.M)}


def profile(tmp_path, net, on):
    return write_profile(tmp_path, f"network:\n  interfaces:\n    - match: {{name: {net.a}}}\n"
                                   f"      offloads: {{tso: {'true' if on else 'false'}}}\n")


@pytest.fixture
def mixed(net):
    """tso on, two of its features off: what a driver or an operator may leave."""
    sh("ethtool", "-K", net.a, "tx-tcp-ecn-segmentation", "off", "tx-tcp-mangleid-segmentation", "off", ns=net.A)
    have = tso(net)
    assert len(have) >= 4 and not have["tx-tcp-ecn-segmentation"] and have["tx-tcp-segmentation"], have
    return have


def test_tso_off_then_rollback_restores_every_feature(net, mixed, tmp_path):
    before = sh("ethtool", "-k", net.a, ns=net.A).stdout
    st = tmp_path / "st"
    rc, doc = net.hkjson("apply", "--profile", profile(tmp_path, net, False), state=st)
    assert doc["error"] == "" and rc == 0, doc
    assert not any(tso(net).values()), tso(net)
    r = net.hk("rollback", state=st)
    assert r.returncode == 0, r.stdout + r.stderr
    assert tso(net) == mixed
    assert sh("ethtool", "-k", net.a, ns=net.A).stdout == before


def test_tso_partly_off_is_drift_and_apply_turns_every_feature_on(net, mixed, tmp_path):
    p = profile(tmp_path, net, True)
    rc, doc = net.hkjson("verify", "--profile", p)
    r = next(x for x in doc["results"] if x["key"] == "tso")
    assert r["status"] == "drift" and "tx-tcp-ecn-segmentation" in r["reason"], r
    st = tmp_path / "st"
    rc, doc = net.hkjson("apply", "--profile", p, state=st)
    assert doc["error"] == "" and rc == 0, doc
    assert all(tso(net).values()), tso(net)
    assert net.hk("rollback", state=st).returncode == 0
    assert tso(net) == mixed
