"""Real iperf3 and ping between network namespaces: capture, compare, a deliberate regression."""
import json

import pytest

from .netns import sh

pytestmark = [pytest.mark.root, pytest.mark.slow]


def capture(bed, prof, out, *extra):
    p = bed.hk("baseline", "capture", "--profile", prof, "--out", str(out), "--quick", *extra)
    assert out.exists(), p.stderr
    return p, json.loads(out.read_text())


def compare(bed, a, b, *extra):
    return bed.hk("baseline", "compare", str(a), str(b), *extra)


@pytest.fixture(scope="module")
def before(bed, tmp_path_factory):
    d = tmp_path_factory.mktemp("bl")
    prof = bed.profile(d / "p.yaml")
    p, snap = capture(bed, prof, d / "before.json")
    return d, prof, p, snap


def test_capture_measures_every_peer(before):
    d, prof, p, snap = before
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    assert snap["baseline_format"] == 1 and snap["command"] == "baseline capture"
    assert {"schema_version", "host", "time", "profile", "version"} <= set(snap)
    tput = {(t["peer"], t["direction"]): t for t in snap["throughput"]}
    assert set(tput) == {(a, d) for a in snap_fabric(snap) for d in ("send", "receive")}
    for t in tput.values():
        assert t["error"] is None
        assert len(t["runs"]) == 2                       # the quick count: repeated for a spread
        assert all(r["gbit"] > 0.05 for r in t["runs"])
        assert sum(len(r["intervals_gbit"]) for r in t["runs"]) >= 6
    lat = {row["peer"]: row for row in snap["latency"]}
    assert set(lat) == set(snap_fabric(snap)) | {"sg", "tyo", "sh"}
    for row in lat.values():
        assert row["error"] is None and row["sent"] == 50 and row["received"] >= 48
        assert 0 < row["p50_ms"] <= row["p99_ms"] < 50
    assert lat["sg"]["expected_rtt_ms"] == 40 and lat["sg"]["over_expected"] is False
    assert snap["engine"]["status"] == "skipped"
    assert "retrans_segs" in snap["counters"]["tcp"]


def snap_fabric(snap):
    return sorted({t["peer"] for t in snap["throughput"]})


def test_compare_with_itself_is_within_noise(bed, before):
    d, _, _, snap = before
    p = compare(bed, d / "before.json", d / "before.json", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["regressions"] == []
    assert {m["verdict"] for m in doc["metrics"]} <= {"within noise", "not measured"}
    assert len([m for m in doc["metrics"] if m["kind"] == "throughput"]) == 4


def test_smaller_buffers_on_one_side_are_a_regression(bed, before):
    """tcp_rmem/tcp_wmem of the capturing namespace cut to 8 KiB: the receive direction collapses."""
    d, prof, _, _ = before
    old = {k: sh("sysctl", "-n", k, ns=bed.host).stdout.strip() for k in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem")}
    try:
        for k in old:
            sh("sysctl", "-qw", f"{k}=4096 4096 8192", ns=bed.host)
        p, snap = capture(bed, prof, d / "after.json")
    finally:
        for k, v in old.items():
            sh("sysctl", "-qw", f"{k}={v}", ns=bed.host)
    assert sh("sysctl", "-n", "net.ipv4.tcp_rmem", ns=bed.host).stdout.split() == old["net.ipv4.tcp_rmem"].split()
    c = compare(bed, d / "before.json", d / "after.json", "--json", "--png", str(d / "c.png"))
    assert c.returncode == 2, c.stdout + c.stderr
    doc = json.loads(c.stdout)
    regressed = {m["key"] for m in doc["metrics"] if m["regressed"]}
    assert {f"throughput {a} receive" for a in snap_fabric(snap)} <= regressed, doc["metrics"]
    for m in doc["metrics"]:
        if m["key"] in regressed and m["kind"] == "throughput":
            assert m["verdict"] == "worse" and m["change_pct"] < -10, m
    assert doc["chart"]["panels"] == ["throughput", "rtt", "rtt distribution"]
    # the table form: one row per metric, the regression named
    t = compare(bed, d / "before.json", d / "after.json")
    assert t.returncode == 2 and " regression(s): throughput " in " ".join(t.stdout.split())   # the summary wraps at 80 columns


def test_unreachable_peer_and_rtt_over_expected_are_one_line_each(bed, tmp_path):
    """A WAN peer nobody answers, a WAN RTT over its expected value, a fabric peer without an
    iperf3 server: one line each on stderr, exit 2, and the snapshot still written whole."""
    prof = bed.profile(tmp_path / "p.yaml", wan_rtt_ms=(40, 0.0001, 30), dead_wan=True)
    text = open(prof).read().replace(f"iperf3_port: {bed.port}", "iperf3_port: 5399")   # nothing listens
    open(prof, "w").write(text)
    p, snap = capture(bed, prof, tmp_path / "s.json", "--no-engine")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert all(x.startswith("hkgpu-tune: warning: ") for x in lines), lines
    assert len([x for x in lines if f"wan peer sh ({bed.dead}): unreachable" in x]) == 1
    assert len([x for x in lines if "wan peer tyo" in x and "over the expected 0.0001 ms" in x]) == 1
    for a in bed.fabric:   # the same failure both ways is one line
        assert len([x for x in lines if f"fabric peer {a}:" in x and "Connection refused" in x
                    and "baseline serve" in x]) == 1, lines
    assert len(lines) == 4 and "Traceback" not in p.stderr
    lat = {row["peer"]: row for row in snap["latency"]}
    assert lat["sh"]["received"] == 0 and lat["sh"]["error"]
    assert lat["sg"]["received"] >= 48 and lat["tyo"]["over_expected"] is True
    assert snap["problems"] == [x.removeprefix("hkgpu-tune: warning: ") for x in lines]
