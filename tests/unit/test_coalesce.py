"""network.interfaces[].coalesce / pause / speed_mbit through the ethtool subsystem with a driver
double. The ConnectX values are the mlx5 driver's own defaults (drivers/net/ethernet/mellanox/mlx5/
core/en.h: RX moderation 8 us / 128 packets with adaptive (DIM) on, TX 16 us / 32 packets, DIM off;
pause rx and tx on). The real kernel's answer (veth: unsupported) is tests/integration/test_nic_extras.py."""
import pytest

from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.core.report import Change
from hkgpu_tune.tune.settings import validate

from .fakes import FakeEthtool, FakeNet, backends, link, nic


def mlx5():
    d = nic()
    d["coalesce"] = {"rx_usecs": 8, "tx_usecs": 16, "rx_frames": 128, "tx_frames": 32,
                     "adaptive_rx": True, "adaptive_tx": False}
    d["pause"] = {"autoneg": False, "rx": True, "tx": True}
    d["link_info"] = {"speed_mbit": 100000, "duplex": "Full", "autoneg": True, "driver": "mlx5_core",
                      "firmware": "22.39.1002 (MT_0000000359)"}
    return d


PROFILE = """\
network:
  interfaces:
    - match: {driver: mlx5_core}
      coalesce: {rx_usecs: 32, adaptive_rx: false}
      pause: {rx: false, tx: false}
      speed_mbit: 100000
"""


def engine(tmp_path, dev=None, text=PROFILE):
    b = backends(net=FakeNet([link("ens1f0", 2)]), ethtool=FakeEthtool({"ens1f0": dev or mlx5()}))
    return Engine(parse_profile_text(text, "t.yaml"), only=["ethtool"], state_dir=str(tmp_path / "st"), backends=b)


def keyed(results):
    return {r.key: r for r in results}


def test_plan_apply_rollback(tmp_path):
    eng = engine(tmp_path)
    changes, res = eng.plan()
    assert sorted((c.key, c.current, c.desired) for c in changes) == [
        ("coalesce adaptive_rx", True, False), ("coalesce rx_usecs", 8, 32), ("pause rx", True, False),
        ("pause tx", True, False)]
    assert keyed(res)["speed_mbit"].status == "ok"
    rep = eng.apply()
    dev = eng.b.ethtool.devs["ens1f0"]
    assert not rep.error and dev["coalesce"]["rx_usecs"] == 32 and dev["coalesce"]["adaptive_rx"] is False
    assert dev["pause"] == {"autoneg": False, "rx": False, "tx": False}
    assert {r.status for r in rep.results} == {"ok"}
    _, errs = eng.rollback()
    assert not errs and dev["coalesce"] == mlx5()["coalesce"] and dev["pause"] == mlx5()["pause"]


def test_driver_that_keeps_its_own_value_is_unsupported_the_rest_applied(tmp_path):
    d = mlx5()
    d["ignores"] = ("rx_usecs",)
    eng = engine(tmp_path, d)
    rep = eng.apply()
    r = keyed(rep.results)
    assert not rep.error and r["coalesce rx_usecs"].status == "unsupported"
    assert "wrote 32, the driver shows 8" in r["coalesce rx_usecs"].reason
    assert eng.b.ethtool.devs["ens1f0"]["pause"]["rx"] is False and r["pause rx"].status == "ok"


def test_driver_without_coalescing_or_pause(tmp_path):
    res = keyed(engine(tmp_path, nic()).verify())
    for k in ("coalesce rx_usecs", "coalesce adaptive_rx", "pause rx", "pause tx", "speed_mbit"):
        assert res[k].status == "unsupported" and "not supported by the driver" in res[k].reason


@pytest.mark.parametrize("speed, why", [(25000, "below the expected 100000"), (None, "link is down")])
def test_slow_or_absent_link_is_drift_not_fixable(tmp_path, speed, why):
    d = mlx5()
    d["link_info"]["speed_mbit"] = speed
    eng = engine(tmp_path, d, "network:\n  interfaces:\n    - match: {name: ens1f0}\n      speed_mbit: 100000\n")
    changes, res = eng.plan()
    assert changes == [] and keyed(res)["speed_mbit"].status == "drift" and why in keyed(res)["speed_mbit"].reason


def test_facts_carry_link_speed_and_firmware(tmp_path):
    f = engine(tmp_path).facts()["ethtool"]["ens1f0"]
    assert f["link_info"]["firmware"].startswith("22.39") and f["link_info"]["speed_mbit"] == 100000
    assert f["coalesce"]["adaptive_rx"] is True


@pytest.mark.parametrize("body, msg", [("coalesce: {rx_usec: 8}", "did you mean 'rx_usecs'"),
                                       ("coalesce: {rx_usecs: -1}", "expected an integer"),
                                       ("pause: {rx: maybe}", "expected true or false"),
                                       ("speed_mbit: fast", "expected an integer")])
def test_bad_input_names_the_line_and_key(body, msg):
    with pytest.raises(ProfileError) as e:
        parse_profile_text(f"network:\n  interfaces:\n    - match: {{name: x}}\n      {body}\n", "t.yaml")
    assert str(e.value).startswith("t.yaml:4: network.interfaces[0].") and msg in str(e.value)


def test_saved_entries_are_checked():
    ok = Change("ethtool", "ens1f0", "coalesce rx_usecs", 8, 32, {"part": "coalesce", "field": "rx_usecs"})
    assert validate(ok) == "ethtool.coalesce"
    assert validate(Change("ethtool", "ens1f0", "pause rx", True, False, {"part": "pause", "field": "rx"})) == "ethtool.pause"
    for bad in (Change("ethtool", "ens1f0", "coalesce x", 8, 32, {"part": "coalesce", "field": "rx_usecs;rm"}),
                Change("ethtool", "ens1f0", "pause rx", "on", False, {"part": "pause", "field": "rx"}),
                Change("ethtool", "ens1f0", "coalesce rx_usecs", -5, 32, {"part": "coalesce", "field": "rx_usecs"})):
        with pytest.raises(ValueError):
            validate(bad)
