import json
import os
import stat

import pytest

from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.core.report import exit_code, to_json, to_junit, to_prometheus

from .fakes import FakeCmd, FakeEthtool, FakeNet, FakeSysctl, FakeTc, backends, link

PROFILE = """\
network:
  interfaces:
    - match: {driver: mlx5_core}
      mtu: 9000
      channels: {combined: max}
      rings: {rx: max, tx: max}
      offloads: {gro: true, gso: true, tso: true, lro: false}
      qdisc: fq_codel
  fabric_peers: [198.18.0.2]
sysctl:
  net.core.rmem_max: 268435456
  net.core.netdev_max_backlog: 250000
  net.ipv4.tcp_rmem: 4096 87380 268435456
  net.ipv4.tcp_mtu_probing: 1
  net.core.default_qdisc: fq_codel
"""


def host(**over):
    from .fakes import nic
    b = backends(
        sysctl=FakeSysctl({"net.core.rmem_max": "212992", "net.core.netdev_max_backlog": "1000",
                           "net.ipv4.tcp_rmem": "4096\t131072\t6291456", "net.ipv4.tcp_mtu_probing": "0",
                           "net.core.default_qdisc": "pfifo_fast"}),
        net=FakeNet([link("ens1f0", 2, tx_queues=4), link("eno1", 3, driver="igb", default_route=True)],
                    gateways={2: ["198.18.0.254"]}, oif={"198.18.0.2": 2}),
        ethtool=FakeEthtool({"ens1f0": nic(), "eno1": nic()}),
        tc=FakeTc({2: {"root": "mq", "root_handle": "1:0",
                       "children": {f"1:{i}": "pfifo_fast" for i in range(1, 5)}}}),
        cmd=FakeCmd(),
    )
    b.tc.nq = {2: 4}
    for k, v in over.items():
        setattr(b, k, v)
    return b


def engine(tmp_path, b=None, text=PROFILE, only=None):
    return Engine(parse_profile_text(text, "t.yaml"), only=only, state_dir=str(tmp_path / "state"), backends=b or host())


def by_key(results):
    return {(r.subsystem, r.target, r.key): r for r in results}


def test_plan_lists_changes_with_current_and_desired(tmp_path):
    changes, _ = engine(tmp_path).plan()
    got = {(c.subsystem, c.target, c.key): (c.current, c.desired) for c in changes}
    assert got[("sysctl", "host", "net.core.rmem_max")] == ("212992", "268435456")
    assert got[("sysctl", "host", "net.ipv4.tcp_rmem")] == ("4096 131072 6291456", "4096 131072 268435456")
    assert got[("link", "ens1f0", "mtu")] == (1500, 9000)
    assert got[("ethtool", "ens1f0", "channels combined")] == (8, 63)
    assert got[("ethtool", "ens1f0", "rings rx")] == (1024, 8192)
    assert got[("ethtool", "ens1f0", "gro")] == (False, True)
    assert got[("qdisc", "ens1f0", "queue 3")] == ("pfifo_fast", "fq_codel")
    assert ("link", "eno1", "mtu") not in got  # igb is not matched


def test_apply_then_verify_all_ok_and_rollback_restores(tmp_path):
    b = host()
    eng = engine(tmp_path, b)
    rep = eng.apply()
    assert not rep.error
    assert exit_code(rep.results) == 0, [r for r in rep.results if r.failed]
    assert b.sysctl.values["net.core.rmem_max"] == "268435456"
    assert b.net.links()[0]["mtu"] == 9000
    assert b.tc.qdiscs(2)["children"]["1:4"] == "fq_codel"
    # the probe used DF pings of MTU-28 to the gateway and the fabric peer
    pings = [c for c in b.cmd.calls if c[0] == "ping"]
    assert {p[-1] for p in pings} == {"198.18.0.254", "198.18.0.2"} and all("8972" in p and "do" in p for p in pings)
    st = os.stat(tmp_path / "state" / "state.json")
    assert stat.S_IMODE(st.st_mode) == 0o600
    restored, errs = engine(tmp_path, b).rollback()
    assert not errs and len(restored) == len(rep.changes)
    assert b.sysctl.values["net.ipv4.tcp_rmem"] == "4096 131072 6291456"
    assert b.net.links()[0]["mtu"] == 1500
    assert b.ethtool.devs["ens1f0"]["features"]["gro"]["on"] is False
    assert b.tc.qdiscs(2)["children"]["1:1"] == "pfifo_fast"
    assert not (tmp_path / "state" / "state.json").exists()


def test_at_least_semantics(tmp_path):
    b = host()
    b.sysctl.values["net.core.rmem_max"] = "536870912"
    b.sysctl.values["net.ipv4.tcp_rmem"] = "8192 262144 536870912"
    r = by_key(engine(tmp_path, b, only=["sysctl"]).verify())
    assert r[("sysctl", "host", "net.core.rmem_max")].status == "ok"
    assert r[("sysctl", "host", "net.ipv4.tcp_rmem")].status == "ok"
    assert r[("sysctl", "host", "net.ipv4.tcp_mtu_probing")].status == "drift"


def test_unsupported_sysctl_and_qdisc(tmp_path):
    b = host(tc=FakeTc({}, supported=("pfifo_fast", "mq")))
    del b.sysctl.values["net.core.netdev_max_backlog"]
    r = by_key(engine(tmp_path, b).verify())
    assert r[("sysctl", "host", "net.core.netdev_max_backlog")].status == "unsupported"
    assert r[("sysctl", "host", "net.core.default_qdisc")].status == "unsupported"
    assert "fq_codel" in r[("qdisc", "ens1f0", "queue 1")].reason
    assert r[("qdisc", "ens1f0", "queue 1")].status == "unsupported"
    changes, _ = engine(tmp_path, b).plan()
    assert not [c for c in changes if c.subsystem == "qdisc" or c.key.endswith("default_qdisc")]


def test_combined_falls_back_to_rx_tx_or_unsupported(tmp_path):
    from .fakes import nic
    veth = nic()
    veth["channels"] = {"max_rx": 2, "max_tx": 2, "max_other": 0, "max_combined": 0, "rx_count": 1,
                        "tx_count": 1, "other_count": 0, "combined_count": 0}
    none = nic()
    none["channels"] = {**veth["channels"], "max_rx": 0, "max_tx": 0}
    b = host(ethtool=FakeEthtool({"ens1f0": veth, "ens1f1": none}),
             net=FakeNet([link("ens1f0", 2), link("ens1f1", 4)]))
    r = by_key(engine(tmp_path, b, only=["ethtool"]).verify())
    assert r[("ethtool", "ens1f0", "channels rx")].desired == 2
    assert r[("ethtool", "ens1f0", "channels rx")].status == "drift"
    assert "using rx/tx" in r[("ethtool", "ens1f0", "channels tx")].reason
    assert r[("ethtool", "ens1f1", "channels combined")].status == "unsupported"


def test_rings_unsupported_is_not_a_crash(tmp_path):
    from hkgpu_tune.core.errors import UnsupportedError

    from .fakes import nic
    d = nic()
    d["rings"] = UnsupportedError("ens1f0: ring parameters: not supported by the driver")
    b = host(ethtool=FakeEthtool({"ens1f0": d, "eno1": nic()}))
    r = by_key(engine(tmp_path, b, only=["ethtool"]).verify())
    assert r[("ethtool", "ens1f0", "rings rx")].status == "unsupported"
    assert exit_code(r.values()) == 2


def test_failure_midway_rolls_back_what_was_changed(tmp_path):
    b = host()
    b.sysctl.readonly = {"net.ipv4.tcp_mtu_probing"}
    rep = engine(tmp_path, b).apply()
    assert "tcp_mtu_probing" in rep.error and rep.rolled_back
    assert b.sysctl.values["net.core.rmem_max"] == "212992"  # the earlier write was undone
    assert not (tmp_path / "state" / "state.json").exists()


def test_failed_mtu_probe_restores_everything(tmp_path):
    b = host(cmd=FakeCmd({"198.18.0.2": 1}))
    rep = engine(tmp_path, b).apply()
    assert "fabric peer 198.18.0.2 did not answer a 8972-byte don't-fragment ping" in rep.error
    assert b.net.links()[0]["mtu"] == 1500


def test_wan_peer_checked_at_1472(tmp_path):
    text = PROFILE.replace("  fabric_peers: [198.18.0.2]\n",
                           "  fabric_peers: [198.18.0.2]\n  wan_peers: [{address: 198.19.1.1, name: tokyo}]\n")
    b = host(cmd=FakeCmd({"198.19.1.1": 1}))
    b.net.oif["198.19.1.1"] = 2
    rep = engine(tmp_path, b, text=text).apply()
    assert "WAN peer 198.19.1.1 (tokyo) did not answer a 1472-byte" in rep.error
    assert any("1472" in c for c in b.cmd.calls if "198.19.1.1" in c)


def test_wan_route_mtu_applied_and_removed_on_rollback(tmp_path):
    text = "network:\n  wan_routes: [{prefix: 198.19.0.0/16, via: 198.18.0.254}]\n"
    b = host()
    eng = engine(tmp_path, b, text=text)
    eng.apply()
    assert b.net.routes["198.19.0.0/16"] == 1500
    engine(tmp_path, b, text=text).rollback()
    assert "198.19.0.0/16" not in b.net.routes


def test_crash_mid_apply_then_rollback(tmp_path):
    """The originals are on disk before the first write: a crash leaves enough to undo."""
    b = host()

    class Boom(BaseException):
        pass

    eng = engine(tmp_path, b)
    orig = eng.by_name["link"].write

    def crash(*a, **k):
        orig(*a, **k)
        raise Boom()  # like kill -9: no cleanup runs

    eng.by_name["link"].write = crash
    with pytest.raises(Boom):
        eng.apply()
    assert b.net.links()[0]["mtu"] == 9000
    saved = json.load(open(tmp_path / "state" / "state.json"))["entries"]
    assert any(c["type"] == "link.mtu" and c["original"] == 1500 for c in saved)
    restored, errs = engine(tmp_path, b).rollback()
    assert not errs
    assert b.net.links()[0]["mtu"] == 1500 and b.sysctl.values["net.core.rmem_max"] == "212992"


def test_second_apply_keeps_the_first_originals(tmp_path):
    b = host()
    engine(tmp_path, b, only=["sysctl"]).apply()
    b.sysctl.values["net.ipv4.tcp_mtu_probing"] = "2"  # drift after the first apply
    engine(tmp_path, b, only=["sysctl"]).apply()
    engine(tmp_path, b).rollback()
    assert b.sysctl.values["net.ipv4.tcp_mtu_probing"] == "0"


def test_unmatched_interface_is_unsupported_unless_optional(tmp_path):
    b = host(net=FakeNet([link("eno1", 3, driver="igb")]))
    r = engine(tmp_path, b, only=["link"]).verify()
    assert [x.status for x in r] == ["unsupported"] and "no interface" in r[0].reason
    r = engine(tmp_path, b, text=PROFILE.replace("      mtu: 9000", "      optional: true\n      mtu: 9000"),
               only=["link"]).verify()
    assert [x.status for x in r] == ["ok"] and exit_code(r) == 0


def test_match_by_default_route_mac_and_pci(tmp_path):
    b = host()
    for m, want in (("{default_route: true}", "eno1"), ("{mac: '02:00:00:00:00:02'}", "ens1f0"),
                    ("{pci: '0000:03:00.0'}", "eno1")):
        text = f"network:\n  interfaces:\n    - match: {m}\n      mtu: 9000\n"
        r = engine(tmp_path, b, text=text, only=["link"]).verify()
        assert [x.target for x in r] == [want]


def test_renderers_carry_the_same_result(tmp_path):
    res = engine(tmp_path).verify()
    doc = json.loads(to_json(res))
    assert len(doc["results"]) == len(res) and all(f["status"] != "ok" for f in doc["failures"])
    prom = to_prometheus(res)
    assert 'hkgpu_tune_setting_status{subsystem="sysctl",target="host",key="net.core.rmem_max",status="drift"} 1' in prom
    assert f"hkgpu_tune_failures {len(doc['failures'])}" in prom
    junit = to_junit(res)
    assert junit.count("<testcase") == len(res) and 'failures="%d"' % len(doc["failures"]) in junit


def test_only_rejects_unknown_subsystem(tmp_path):
    from hkgpu_tune.core.errors import HkError
    with pytest.raises(HkError, match="unknown subsystem sysctrl"):
        engine(tmp_path, only=["sysctrl"])


def test_verify_reads_only_the_matched_links(tmp_path):
    """eno1 (igb) matches no rule: verify neither asks ethtool nor dumps its qdiscs."""
    b = host()
    asked = []
    for name in ("channels", "rings", "features"):
        orig = getattr(b.ethtool, name)
        setattr(b.ethtool, name, lambda dev, orig=orig: asked.append(dev) or orig(dev))
    orig_q = b.tc.qdiscs
    b.tc.qdiscs = lambda index: asked.append(index) or orig_q(index)
    engine(tmp_path, b).verify()
    assert set(asked) == {"ens1f0", 2}


def test_qdisc_support_is_asked_only_when_something_must_change(tmp_path):
    b = host(tc=FakeTc({2: {"root": "mq", "root_handle": "1:0",
                            "children": {f"1:{i}": "fq_codel" for i in range(1, 5)}}}))
    b.tc.supported = lambda kind: pytest.fail("probed a qdisc that is already in place")
    r = engine(tmp_path, b, only=["qdisc"]).verify()
    assert {x.status for x in r} == {"ok"} and len(r) == 5


def test_feature_needing_sg_is_unsupported(tmp_path):
    from .fakes import nic
    d = nic(gro=True)
    d["features"]["gso"]["on"] = False
    d["features"]["sg"] = {"on": False, "fixed": True, "names": []}
    b = host(ethtool=FakeEthtool({"ens1f0": d, "eno1": nic()}))
    r = by_key(engine(tmp_path, b, only=["ethtool"]).verify())
    assert r[("ethtool", "ens1f0", "gso")].status == "unsupported"
    assert "scatter-gather" in r[("ethtool", "ens1f0", "gso")].reason


def test_write_the_driver_refuses_is_unsupported_and_the_rest_applies(tmp_path):
    from hkgpu_tune.core.errors import UnsupportedError
    b = host()

    def refuse(name, short, on):
        raise UnsupportedError(f"{name}: {short}: Operation not supported")

    b.ethtool.set_feature = refuse
    rep = engine(tmp_path, b).apply()
    assert rep.error == ""
    r = by_key(rep.results)
    assert r[("ethtool", "ens1f0", "gro")].status == "unsupported"
    assert r[("link", "ens1f0", "mtu")].status == "ok"


class QueuesFollowChannels(FakeEthtool):
    """ethtool -L changes the transmit queues in use, as a multi-queue driver does."""
    def __init__(self, devs, net, tc):
        super().__init__(devs)
        self.net, self.tc = net, tc

    def set_channels(self, name, values):
        super().set_channels(name, values)
        n = values["combined"]
        ln = next(x for x in self.net._links if x["name"] == name)
        ln["tx_queues"] = n
        q = self.tc.q.get(ln["index"])
        if q and q["root"] == "mq":
            maj = q["root_handle"].split(":")[0]
            for i in range(1, n + 1):   # queues coming into use hold the qdisc mq gave them at start
                q["children"].setdefault(f"{maj}:{i}", "pfifo_fast")
        self.tc.nq[ln["index"]] = n


def test_new_queues_from_more_channels_get_the_qdisc_on_the_kernels_own_mq(tmp_path):
    # found on the VM test node: virtio-net starts with 2 of 4 channels under the mq the kernel
    # attached itself (handle 0:, which tc cannot address); channels go to 4, then all four queues
    # must hold fq_codel, and rollback goes back to 2 channels
    from .fakes import nic
    b = host()
    b.net._links[0]["tx_queues"] = 2
    b.tc.q[2] = {"root": "mq", "root_handle": "0:0", "children": {"0:1": "pfifo_fast", "0:2": "pfifo_fast"}}
    b.tc.nq = {2: 4}
    dev = nic(combined=(2, 4))
    b.ethtool = QueuesFollowChannels({"ens1f0": dev, "eno1": nic()}, b.net, b.tc)
    eng = engine(tmp_path, b)
    rep = eng.apply()
    assert not rep.error and exit_code(rep.results) == 0, [(r.key, r.status, r.reason) for r in rep.results if r.failed]
    q = b.tc.qdiscs(2)
    assert q["root"] == "mq" and q["children"] == {f"1:{i}": "fq_codel" for i in range(1, 5)}
    # one change: mq 1: replaces the kernel's mq, with fq_codel on every queue
    assert [c.key for c in rep.changes if c.subsystem == "qdisc"] == ["root"]
    b.tc.default = lambda: b.sysctl.values["net.core.default_qdisc"]
    changed, errs = eng.rollback()
    assert not errs and b.ethtool.channels("ens1f0")["combined_count"] == 2
    # rolled back before default_qdisc (reverse order): the kernel's mq comes back with fq_codel
    # on each queue, so mq 1: replaces it and each queue is set back to pfifo_fast explicitly
    assert b.tc.qdiscs(2)["children"] == {f"1:{i}": "pfifo_fast" for i in range(1, 5)}
    assert b.sysctl.values["net.core.default_qdisc"] == "pfifo_fast"


def test_the_kernels_own_mq_already_in_place_is_left_alone(tmp_path):
    b = host()
    b.tc.q[2] = {"root": "mq", "root_handle": "0:0", "children": {f"0:{i}": "fq_codel" for i in range(1, 5)}}
    r = by_key(engine(tmp_path, b, only=["qdisc"]).verify())
    assert {k[2]: v.status for k, v in r.items()} == {"root": "ok", **{f"queue {i}": "ok" for i in range(1, 5)}}


def test_a_single_queue_nic_that_gets_more_channels_gets_mq(tmp_path):
    # planned before the channels change, the qdisc would be a single root fq_codel; planned
    # after it (apply plans each subsystem again once an earlier one wrote), mq + fq_codel per queue
    from .fakes import nic
    b = host()
    b.net._links[0]["tx_queues"] = 1
    b.tc.q[2] = {"root": "pfifo_fast", "root_handle": "0:0", "children": {}}
    b.ethtool = QueuesFollowChannels({"ens1f0": nic(combined=(1, 4)), "eno1": nic()}, b.net, b.tc)
    b.tc.nq = {2: 1}
    eng = engine(tmp_path, b)
    assert ("qdisc", "ens1f0", "root") in {c.ident for c in eng.plan()[0]}
    rep = eng.apply()
    assert not rep.error and exit_code(rep.results) == 0, [(r.key, r.status, r.reason) for r in rep.results if r.failed]
    q = b.tc.qdiscs(2)
    assert q["root"] == "mq" and q["children"] == {f"1:{i}": "fq_codel" for i in range(1, 5)}
    _, errs = eng.rollback()
    assert not errs and b.tc.qdiscs(2)["root"] == "pfifo_fast" and b.ethtool.channels("ens1f0")["combined_count"] == 1


def test_a_refused_write_that_cannot_be_put_back_keeps_its_original(tmp_path):
    # the driver refuses gro, and refuses to put the original back too; a later failure rolls the
    # run back: the state keeps only gro's original, for a later rollback to try again
    from hkgpu_tune.tune.engine import State
    from hkgpu_tune.core.errors import ApplyError, UnsupportedError
    b = host()

    def refuse(name, short, on):
        raise UnsupportedError(f"{name}: {short}: Operation not supported")

    def busy(index, parent, kind, name=""):
        raise ApplyError(f"{name}: qdisc {kind} on {parent}: Device or resource busy")

    b.ethtool.set_feature, b.tc.replace_child = refuse, busy
    rep = engine(tmp_path, b).apply()
    assert rep.rolled_back and "Device or resource busy" in rep.error
    assert [c.ident for c in State(str(tmp_path / "state")).load()] == [("ethtool", "ens1f0", "gro")]
    assert b.sysctl.values["net.core.rmem_max"] == "212992" and b.net.links()[0]["mtu"] == 1500


def test_rollback_only_restores_those_subsystems_and_keeps_the_rest(tmp_path):
    from hkgpu_tune.tune.engine import State
    b = host()
    engine(tmp_path, b).apply()
    rep = engine(tmp_path, b).rollback(only=["sysctl"])
    assert not rep.errors and {c.subsystem for c in rep.restored} == {"sysctl"}
    assert b.sysctl.values["net.core.rmem_max"] == "212992" and b.net.links()[0]["mtu"] == 9000
    assert "sysctl" not in {c.subsystem for c in State(str(tmp_path / "state")).load()}
    with pytest.raises(HkError, match="rollback --only: unknown subsystem nosuch"):
        engine(tmp_path, b).rollback(only=["nosuch"])
    assert not engine(tmp_path, b).rollback().errors and b.net.links()[0]["mtu"] == 1500


def test_a_gone_target_is_kept_and_reported_or_dropped_on_forget(tmp_path):
    from hkgpu_tune.tune.engine import State
    from hkgpu_tune.core.errors import TargetGone
    b = host()
    engine(tmp_path, b, only=["sysctl", "link"]).apply()

    def gone(change):
        raise TargetGone(f"{change.target}: the device is gone")

    eng = engine(tmp_path, b)
    eng.by_name["link"].restore = gone
    rep = eng.rollback()
    assert [c.ident for c in rep.kept] == [("link", "ens1f0", "mtu")] and "--forget" in rep.errors[0]
    assert b.sysctl.values["net.core.rmem_max"] == "212992"          # the rest was restored
    assert [c.ident for c in State(str(tmp_path / "state")).load()] == [("link", "ens1f0", "mtu")]
    eng = engine(tmp_path, b)
    eng.by_name["link"].restore = gone
    rep = eng.rollback(forget=True)
    assert not rep.errors and rep.forgotten and "original dropped" in rep.forgotten[0]
    assert not (tmp_path / "state" / "state.json").exists()


def test_a_rollback_killed_midway_drops_what_it_restored_and_resumes(tmp_path):
    from hkgpu_tune.tune.engine import State
    b = host()
    engine(tmp_path, b, only=["sysctl", "link"]).apply()
    n_saved = len(State(str(tmp_path / "state")).load())

    class Boom(BaseException):
        pass

    eng = engine(tmp_path, b)
    real, calls = eng.by_name["sysctl"].restore, []

    def crash(change):
        real(change)
        calls.append(change.key)
        if len(calls) == 2:
            raise Boom()   # like kill -9 right after the second sysctl is back

    eng.by_name["sysctl"].restore = crash
    with pytest.raises(Boom):
        eng.rollback()
    left = State(str(tmp_path / "state")).load()
    # the link (newest) and the first sysctl are off the file; the second is back but still listed
    assert len(left) == n_saved - 2 and calls[1] in {c.key for c in left}
    rep = engine(tmp_path, b).rollback()
    assert not rep.errors and b.sysctl.values["net.ipv4.tcp_mtu_probing"] == "0"
    assert not (tmp_path / "state" / "state.json").exists()
