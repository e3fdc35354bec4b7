"""probe: real pings between network namespaces (198.18.x.x), parsed per reply."""
import json
import sys
import time

import pytest

from hkgpu_tune.observe.collect import probe
from hkgpu_tune.core.profile import parse_profile_text

from .conftest import sh

pytestmark = pytest.mark.root


def in_ns(ns, code):
    """Run collector code inside a namespace (its own network view); JSON back."""
    p = sh(sys.executable, "-c", code, ns=ns)
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_ping_between_namespaces_measures_every_reply(pair):
    s = in_ns(pair.A, f"""
import json; from hkgpu_tune.observe.collect.probe import ping
print(json.dumps(ping({pair.ipb!r}, count=5, interval_s=0.05, timeout_s=1).to_dict()))""")
    assert s["error"] is None, s
    assert (s["sent"], s["received"], s["loss_ratio"]) == (5, 5, 0.0)
    assert len(s["rtts_ms"]) == 5 and all(0 < r < 100 for r in s["rtts_ms"])
    srt = sorted(s["rtts_ms"])
    assert s["p50_ms"] == srt[2] and s["p99_ms"] == srt[4]
    diffs = [abs(b - a) for a, b in zip(s["rtts_ms"], s["rtts_ms"][1:])]
    assert s["jitter_ms"] == pytest.approx(sum(diffs) / 4)


def test_unreachable_peer_is_full_loss_within_the_deadline(pair):
    # 198.18.N.99 is on the link but nobody has it: no reply, no exception
    t = time.monotonic()
    s = in_ns(pair.A, f"""
import json; from hkgpu_tune.observe.collect.probe import ping
print(json.dumps(ping('198.18.{pair.net}.99', count=3, interval_s=0.2, timeout_s=1, deadline_s=2).to_dict()))""")
    assert time.monotonic() - t < 6
    assert s["received"] == 0 and s["loss_ratio"] == 1.0 and s["p50_ms"] is None and s["rtts_ms"] == []


def test_df_probe_bigger_than_the_mtu_fails_and_smaller_passes(pair):
    sh("ip", "-n", pair.B, "link", "set", pair.b, "mtu", "1400")
    sh("ip", "-n", pair.A, "link", "set", pair.a, "mtu", "1400")
    ok, big = in_ns(pair.A, f"""
import json; from hkgpu_tune.observe.collect.probe import ping
a = ping({pair.ipb!r}, count=2, interval_s=0.05, size=1372, df=True).to_dict()
b = ping({pair.ipb!r}, count=2, interval_s=0.05, size=1373, df=True, deadline_s=2).to_dict()
print(json.dumps([a, b]))""")
    assert ok["received"] == 2 and ok["error"] is None
    assert big["received"] == 0


def test_probe_peers_runs_fabric_and_wan_peers_in_parallel_with_the_profile_names(pair):
    prof = f"""
name: t
network:
  fabric_peers: [{pair.ipb}]
  wan_peers:
    - {{address: 198.18.{pair.net}.98, name: sgp-gw, rtt_ms: 35}}
"""
    res = in_ns(pair.A, f"""
import json, time; from hkgpu_tune.observe.collect.probe import probe_peers
from hkgpu_tune.core.profile import parse_profile_text
p = parse_profile_text({prof!r}, 't.yaml')
t = time.monotonic(); r = probe_peers(p, count=3, deadline_s=2); dt = time.monotonic() - t
print(json.dumps([dt, [[n, k, s.to_dict()] for n, k, s in r]]))""")
    dt, rows = res
    assert dt < 4.5    # both within one deadline, not one after the other
    by = {n: (k, s) for n, k, s in rows}
    assert by[pair.ipb][0] == "fabric" and by[pair.ipb][1]["received"] == 3
    assert by["sgp-gw"][0] == "wan" and by["sgp-gw"][1]["loss_ratio"] == 1.0
    # families: expected RTT from the profile, loss 1 for the dead peer
    p = parse_profile_text(prof, "t.yaml")
    stats = [(n, k, probe.PingStats(**s)) for n, k, s in rows]
    fams = {f.name: f for f in probe.families(p, stats)}
    assert fams["hkgpu_tune_peer_rtt_expected_seconds"].samples == [({"peer": "sgp-gw", "kind": "wan"}, 0.035)]
    loss = dict((lab["peer"], v) for lab, v in fams["hkgpu_tune_peer_loss_ratio"].samples)
    assert loss == {pair.ipb: 0.0, "sgp-gw": 1.0}


def test_parse_counts_duplicates_once_and_reads_the_sent_count():
    out = """PING 198.18.0.2 (198.18.0.2) 56(84) bytes of data.
64 bytes from 198.18.0.2: icmp_seq=1 ttl=64 time=0.051 ms
64 bytes from 198.18.0.2: icmp_seq=1 ttl=64 time=0.090 ms (DUP!)
64 bytes from 198.18.0.2: icmp_seq=3 ttl=64 time=0.070 ms

--- 198.18.0.2 ping statistics ---
4 packets transmitted, 2 received, +1 duplicates, 50% packet loss, time 3004ms
"""
    s = probe.parse("198.18.0.2", out, 4)
    assert s.rtts_ms == [0.051, 0.070] and s.sent == 4 and s.loss_ratio == 0.5
    assert s.jitter_ms == pytest.approx(0.019)
