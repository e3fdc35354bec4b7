"""nic: /sys statistics and per-queue drops from ethtool -S; checked against `ip -s -j link`."""
import json
import os
import sys

import pytest

from hkgpu_tune.observe.collect import nic

from .conftest import sh

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "monitor")


def fixture(name):
    with open(os.path.join(FIX, name)) as f:
        return f.read()


def test_veth_queues_from_a_recorded_ethtool_s():
    st = nic.parse_ethtool_s(fixture("ethtool-S-veth.txt"))
    assert st["peer_ifindex"] == 2 and "NIC statistics" not in st
    q = nic.queues(st)
    assert set(q) == {"rx-0", "tx-0"}
    assert q["rx-0"]["drops"] == 0 and q["tx-0"]["xdp_xmit"] == 0
    assert nic.queue_drops(q["rx-0"]) == 0 and nic.queue_drops(q["tx-0"]) is None   # tx has no drop counter


def test_virtio_net_new_names_and_port_totals_are_not_queues():
    q = nic.queues(nic.parse_ethtool_s(fixture("ethtool-S-virtio_net.txt")))
    assert set(q) == {"rx-0", "tx-0"}          # rx_drops / rx_kicks are port totals, not a queue
    assert q["rx-0"]["kicks"] > 0


def test_mlx5_64_queues_drops_summed_per_queue():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from tests.fixtures.monitor import replay_host as R
    st = nic.parse_ethtool_s(R.ethtool_s(1))
    q = nic.queues(st)
    assert len(q) == 128 and "ch-0" not in q
    assert {k: nic.queue_drops(v) for k, v in q.items()} == R.expected_queue_drops(1)
    assert "tx_queue_dropped" in st and "rx_prio0_bytes" in st   # port-wide, kept in the flat stats


@pytest.mark.parametrize("name,queue,what", [
    ("rx_queue_12_drops", "rx-12", "drops"), ("tx3_dropped", "tx-3", "dropped"),
    ("rx-7.bytes", "rx-7", "bytes"), ("[2]: rx_ucast_packets", "rx-2", "ucast_packets"),
    ("tx_queue_dropped", None, None), ("rx_prio3_packets", None, None), ("ch0_events", None, None)])
def test_queue_name_forms(name, queue, what):
    q = nic.queues({name: 5})
    assert (q == {}) if queue is None else (q == {queue: {what: 5}})


@pytest.mark.root
def test_live_counters_match_ip_s_link(pair):
    """The kernel may send on a fresh link at any time (IPv6 router solicitations, MLD reports), so
    the collector's read is bracketed by two reads of `ip -s`, not compared with one read after it."""
    def ip_stats():
        return json.loads(sh("ip", "-s", "-j", "link", "show", pair.a, ns=pair.A).stdout)[0]["stats64"]
    sh("ping", "-c", "3", "-i", "0.05", pair.ipb, ns=pair.A)
    code = f"import json; from hkgpu_tune.observe.collect import nic; print(json.dumps(nic.read([{pair.a!r}])))"
    before = ip_stats()
    got = json.loads(sh(sys.executable, "-c", code, ns=pair.A).stdout)[pair.a]
    after = ip_stats()
    for key, d, k in (("rx_dropped", "rx", "dropped"), ("tx_errors", "tx", "errors"), ("tx_packets", "tx", "packets"),
                      ("rx_packets", "rx", "packets")):
        assert before[d][k] <= got[key] <= after[d][k], (key, before[d][k], got[key], after[d][k])
    assert got["tx_packets"] >= 3
    assert set(got["queues"]) == {"rx-0", "rx-1", "tx-0", "tx-1"}   # the veth's 2 queues, from ethtool -S


@pytest.mark.root
def test_default_devices_are_backed_by_hardware_not_veth(pair):
    code = "import json; from hkgpu_tune.observe.collect import nic; print(json.dumps(sorted(nic.read())))"
    assert json.loads(sh(sys.executable, "-c", code, ns=pair.A).stdout) == []   # only lo and a veth there


@pytest.mark.root
def test_an_interface_the_profile_names_is_read_even_a_veth(pair):
    """network.interfaces[].match.name: the collector watches what the profile tunes (a veth, bond or
    VLAN has no device link); a named interface this host lacks is left out."""
    code = ("import json; from hkgpu_tune.observe.collect import Sources, collect; "
            "from hkgpu_tune.core.profile import parse_profile_text; "
            f"p = parse_profile_text('network:\\n  interfaces:\\n    - match: {{name: {pair.a}}}\\n"
            "    - match: {name: nosuch0}\\n      optional: true\\n'); "
            "r = collect(p, ['nic'])[0]; print(json.dumps([r.up, sorted(r.data['nics'])]))")
    assert json.loads(sh(sys.executable, "-c", code, ns=pair.A).stdout) == [True, [pair.a]]
