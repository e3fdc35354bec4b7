"""The probe's threshold series come from the profile (wan_peers[].rtt_ms and .jitter_ms), per peer."""
from hkgpu_tune.observe.collect import probe
from hkgpu_tune.core.profile import parse_profile_text

PROFILE = """\
network:
  fabric_peers: [198.18.0.2]
  wan_peers:
    - {address: 198.19.1.1, name: singapore, rtt_ms: 35, jitter_ms: 5}
    - {address: 198.19.2.1, name: tokyo, rtt_ms: 50}
"""


def test_jitter_threshold_is_exported_per_wan_peer_that_sets_one():
    prof = parse_profile_text(PROFILE)
    res = [(name, kind, probe.stats(addr, 3, [1.0, 2.0, 1.5])) for name, kind, addr, _ in probe.peers(prof)]
    fams = {f.name: f for f in probe.families(prof, res)}
    assert fams["hkgpu_tune_peer_jitter_threshold_seconds"].samples == [({"peer": "singapore", "kind": "wan"}, 0.005)]
    assert sorted(fams["hkgpu_tune_peer_rtt_expected_seconds"].samples, key=lambda s: s[0]["peer"]) == \
        [({"peer": "singapore", "kind": "wan"}, 0.035), ({"peer": "tokyo", "kind": "wan"}, 0.05)]
