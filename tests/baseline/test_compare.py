"""compare on snapshots built from recorded iperf3 and ping output; the statistics; bad input."""
import json
import subprocess
import sys

import pytest

from hkgpu_tune.baseline import compare as cmpmod
from hkgpu_tune.baseline import iperf, settings, stats
from hkgpu_tune.observe.collect import probe

from .snapshots import recorded, snapshot, write


def hk(*args):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True)


# ---------------------------------------------------------------- statistics
def test_verdict_uses_the_spread():
    tight_b, tight_a = [10.0, 10.1, 9.9, 10.0], [9.0, 9.1, 8.9, 9.0]
    assert stats.verdict(tight_b, tight_a, "higher")[0] == "worse"
    # the same means with a wide spread: the change is inside the noise band
    wide_b, wide_a = [6.0, 14.0, 8.0, 12.0], [5.0, 13.0, 7.0, 11.0]
    v, band = stats.verdict(wide_b, wide_a, "higher")
    assert v == "within noise" and band > 1.0
    assert stats.verdict(tight_b, [11.0, 11.1, 10.9, 11.0], "higher")[0] == "better"
    assert stats.verdict(tight_b, tight_a, "lower")[0] == "better"
    # one sample each: no spread, no band; the threshold alone decides
    assert stats.verdict([5.0], [6.0], "lower") == ("worse", None)
    assert stats.verdict([5.0], [5.0], "lower") == ("within noise", None)


def test_noise_band_shrinks_with_more_samples():
    few = stats.noise_band([10.0, 12.0], [10.0, 12.0])
    many = stats.noise_band([10.0, 12.0] * 10, [10.0, 12.0] * 10)
    assert few > 5 * many > 0      # t(2 df) = 4.3 against 2.0 and sqrt(10) less standard error


def test_threshold_pct_and_abs():
    t = settings.Threshold(pct=20, abs=0.2)
    assert not t.passed(0.05, 0.09)      # +80% but 0.04 ms: a LAN wobble
    assert not t.passed(40.0, 44.0)      # +10%
    assert t.passed(40.0, 52.0)
    assert settings.Threshold(abs=0.01).passed(0.0, 0.02)
    assert not settings.Threshold(pct=10).passed(0.0, 0.0)


def test_chunks():
    assert [len(c) for c in stats.chunks(list(range(60)))] == [12] * 5
    assert [len(c) for c in stats.chunks(list(range(12)))] == [6, 6]
    assert stats.chunks([1.0, 2.0]) == [[1.0, 2.0]] and stats.chunks([]) == []


# ---------------------------------------------------------------- recorded tool output
def test_iperf3_recorded_json():
    s = iperf.parse(recorded("iperf3-send.json"))
    assert s.error is None and 1 < s.gbit < 100 and isinstance(s.retransmits, int)
    assert len(s.intervals_gbit) == 5 and all(x > 0 for x in s.intervals_gbit)
    r = iperf.parse(recorded("iperf3-reverse.json"))
    assert r.error is None and len(r.intervals_gbit) == 5
    assert iperf.parse(recorded("iperf3-refused.json")).error == "iperf3: unable to connect to server: Connection refused"
    assert iperf.parse("iperf3: error - nope").error.startswith("iperf3 gave no JSON")
    assert iperf.parse('{"end": {}}').error == "iperf3: no end.sum_received.bits_per_second in its JSON"
    assert iperf.parse("[1]").error == "iperf3 gave JSON that is not an object"


def test_ping_statistics_from_recorded_output():
    s = probe.parse("198.18.40.2", recorded("ping-60.txt"), 60)
    assert s.sent == 60 and len(s.rtts_ms) == 60
    m = cmpmod.metrics(cmpmod.Snapshot("x", snapshot()))
    p50 = m["rtt p50 fabric 198.18.0.2"]
    assert len(p50.samples) == 5 and p50.value == s.p50_ms       # five chunks of twelve, the whole run's p50
    assert min(p50.samples) <= p50.value <= max(p50.samples)
    dead = probe.parse("198.18.40.9", recorded("ping-unreachable.txt"), 20)
    assert dead.received == 0 and dead.sent == 12 and dead.loss_ratio == 1.0


# ---------------------------------------------------------------- compare
def test_same_snapshot_is_within_noise(tmp_path):
    a = write(tmp_path / "a.json", snapshot())
    p = hk("baseline", "compare", a, a, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["command"] == "baseline compare" and doc["regressions"] == []
    assert all(m["verdict"] == "within noise" for m in doc["metrics"])


def test_halved_throughput_regresses_small_change_does_not(tmp_path):
    a = write(tmp_path / "a.json", snapshot())
    for scale, code in ((0.5, 2), (0.97, 0), (1.5, 0)):
        b = write(tmp_path / "b.json", snapshot(tput_scale=scale, time="2026-12-03T01:00:00Z"))
        p = hk("baseline", "compare", a, b, "--json")
        assert p.returncode == code, (scale, p.stdout, p.stderr)
        rows = {m["key"]: m for m in json.loads(p.stdout)["metrics"]}
        send = rows["throughput 198.18.0.2 send"]
        want = {0.5: "worse", 0.97: "within noise", 1.5: "better"}[scale]
        assert send["verdict"] == want and send["regressed"] == (scale == 0.5)
        assert send["change_pct"] == pytest.approx((scale - 1) * 100)
        assert send["n_before"] == 15           # 3 runs x 5 iperf3 intervals


def test_wan_rtt_up_30_percent_regresses(tmp_path):
    a = write(tmp_path / "a.json", snapshot(rtt_scale=1000))     # 0.04 ms -> 40 ms: a WAN path
    b = write(tmp_path / "b.json", snapshot(rtt_scale=1300))
    doc = json.loads(hk("baseline", "compare", a, b, "--json").stdout)
    rows = {m["key"]: m for m in doc["metrics"]}
    assert rows["rtt p50 wan sg"]["regressed"] and rows["rtt p50 fabric 198.18.0.2"]["regressed"]
    # on the LAN scale the same +30% is a few microseconds: under the 0.2 ms floor
    a = write(tmp_path / "a.json", snapshot())
    b = write(tmp_path / "b.json", snapshot(rtt_scale=1.3))
    doc = json.loads(hk("baseline", "compare", a, b, "--json").stdout)
    assert not [m for m in doc["metrics"] if m["regressed"]]


def test_peer_failing_after_is_a_regression(tmp_path):
    before = snapshot()
    after = snapshot()
    for t in after["throughput"]:
        t["runs"], t["error"] = [], "iperf3: unable to connect to server: No route to host"
    a, b = write(tmp_path / "a.json", before), write(tmp_path / "b.json", after)
    p = hk("baseline", "compare", a, b)
    assert p.returncode == 2 and "No route to host" in " ".join(p.stdout.split())   # a table cell may wrap at 80 columns
    assert " ".join(p.stdout.split()).endswith("2 regression(s): throughput 198.18.0.2 send, throughput 198.18.0.2 receive")
    doc = json.loads(hk("baseline", "compare", a, b, "--json").stdout)
    rows = {m["key"]: m for m in doc["metrics"]}
    for d in ("send", "receive"):
        r = rows[f"throughput 198.18.0.2 {d}"]
        assert r["verdict"] == "failed after" and r["regressed"] and "No route to host" in r["reason"]
    assert doc["regressions"] == ["throughput 198.18.0.2 send", "throughput 198.18.0.2 receive"]
    # a peer the after profile no longer has is not a failure
    after = snapshot(throughput=False)
    b = write(tmp_path / "b.json", after)
    doc = json.loads(hk("baseline", "compare", a, b, "--json").stdout)
    assert {m["verdict"] for m in doc["metrics"] if m["kind"] == "throughput"} == {"only before"}


def test_other_host_is_an_error_unless_allowed(tmp_path):
    a = write(tmp_path / "a.json", snapshot(host="node1"))
    b = write(tmp_path / "b.json", snapshot(host="node2"))
    p = hk("baseline", "compare", a, b)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr == (f"hkgpu-tune: error: {b}: host: 'node2', but {a} is from 'node1' (a baseline compares "
                        "one node with itself; --allow-other-host compares two nodes)\n")
    p = hk("baseline", "compare", a, b, "--allow-other-host", "--json")
    assert p.returncode == 0 and "hkgpu-tune: warning:" in p.stderr
    assert json.loads(p.stdout)["warnings"]


@pytest.mark.parametrize("doc, msg", [
    (snapshot(fmt=2), "baseline_format: snapshot format 2, this hkgpu-tune reads format 1"),
    ({"command": "verify"}, "not a baseline snapshot (command: 'verify')"),
    ({**snapshot(), "latency": {}}, "latency: expected a list, got dict"),
    ({**snapshot(), "latency": [{"peer": "x", "kind": "wan", "rtts_ms": ["1"]}]}, "latency[0].rtts_ms: expected a list of numbers"),
])
def test_bad_snapshot_is_one_line(tmp_path, doc, msg):
    good = write(tmp_path / "good.json", snapshot())
    bad = write(tmp_path / "bad.json", doc)
    p = hk("baseline", "compare", good, bad)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr == f"hkgpu-tune: error: {bad}: {msg}\n"


def test_unreadable_snapshots(tmp_path):
    good = write(tmp_path / "good.json", snapshot())
    (tmp_path / "t.json").write_text("{not json")
    for path, msg in ((tmp_path / "none.json", "cannot read the snapshot: No such file or directory"),
                      (tmp_path, "not a regular file"),
                      (tmp_path / "t.json", "not a JSON snapshot")):
        p = hk("baseline", "compare", str(path), good)
        assert p.returncode == 1 and p.stderr.startswith(f"hkgpu-tune: error: {path}: {msg}"), p.stderr
        assert len(p.stderr.splitlines()) == 1


def test_thresholds_from_the_profile(tmp_path):
    a = write(tmp_path / "a.json", snapshot())
    b = write(tmp_path / "b.json", snapshot(tput_scale=0.8))
    assert hk("baseline", "compare", a, b).returncode == 2
    prof = tmp_path / "p.yaml"
    prof.write_text("baseline:\n  thresholds:\n    throughput: {pct: 25}\n")
    assert hk("baseline", "compare", a, b, "--profile", str(prof)).returncode == 0
    prof.write_text("baseline:\n  thresholds:\n    throughputs: {pct: 25}\n")
    p = hk("baseline", "compare", a, b, "--profile", str(prof))
    assert p.returncode == 1 and f"{prof}:3: baseline.thresholds.throughputs: unknown key; did you mean 'throughput'?" in p.stderr


def test_kernel_events_since_boot_and_a_reboot_between(tmp_path):
    before, after = snapshot(), snapshot()
    after["kernel"]["events"] = [{"kind": "xid", "device": "0000:3b:00", "xid": 79, "line": "NVRM: Xid 79", "time": 1.0},
                                 {"kind": "xid", "device": "0000:3b:00", "xid": 79, "line": "NVRM: Xid 79", "time": 2.0}]
    a, b = write(tmp_path / "a.json", before), write(tmp_path / "b.json", after)
    doc = json.loads(hk("baseline", "compare", a, b, "--json").stdout)
    xid = {m["key"]: m for m in doc["metrics"]}["kernel xid events"]
    assert (xid["before"], xid["after"], xid["regressed"], xid["reason"]) == (0, 2, True, "")
    before["boot_id"], after["boot_id"] = "b1", "b2"
    a, b = write(tmp_path / "a.json", before), write(tmp_path / "b.json", after)
    doc = json.loads(hk("baseline", "compare", a, b, "--json").stdout)
    xid = {m["key"]: m for m in doc["metrics"]}["kernel xid events"]
    assert xid["regressed"] and xid["reason"] == "rebooted in between: each count is since its own boot"


def _set(doc, path, value):
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return doc


@pytest.mark.parametrize("path, value, key", [
    (("counters", "nic", "eth1", "rx_dropped"), "many", "counters.nic.eth1.rx_dropped: expected a number, got str"),
    (("kernel", "events"), 5, "kernel.events: expected a list"),
    (("engine",), {"status": "ok", "img_s": "fast"}, "engine.img_s: expected a list of numbers"),
    (("throughput", 0, "runs"), "x", "throughput[0].runs: expected a list"),
    (("throughput", 0), "x", "throughput[0]: expected a mapping"),
    (("throughput", 0, "runs", 0, "gbit"), [1], "throughput[0].runs[0].gbit: expected a number, got list"),
    (("latency", 0, "p50_ms"), "1", "latency[0].p50_ms: expected a number, got str"),
    (("throughput", 0, "runs", 0, "intervals_gbit"), {"a": 1}, "throughput[0].runs[0].intervals_gbit: expected a list of numbers"),
])
def test_wrong_shapes_inside_a_snapshot_are_one_line(tmp_path, path, value, key):
    good = write(tmp_path / "good.json", snapshot())
    bad = write(tmp_path / "bad.json", _set(snapshot(), path, value))
    for args in ((good, bad), (bad, good)):
        p = hk("baseline", "compare", *args)
        assert p.returncode == 1 and p.stdout == "", p.stderr
        assert p.stderr == f"hkgpu-tune: error: {bad}: {key}\n"


def test_compare_without_a_profile_judges_by_the_thresholds_the_baseline_recorded(tmp_path):
    """rack baseline compares on the controller, with no node profile: a node whose profile widened
    the throughput threshold to 60 % when its baseline was taken must not get the 10 % default (a
    50 % drop is then no regression); the candidate snapshot's own thresholds never excuse it (a
    `pct: 1e9` in it hides nothing), and a bad or non-finite figure in either is an error."""
    b, a = snapshot("n1"), snapshot("n1", tput_scale=0.5)
    write(tmp_path / "b.json", b)
    write(tmp_path / "a.json", a)
    regs = lambda: [r.key for r in cmpmod.compare(cmpmod.load(str(tmp_path / "b.json")),
                                                   cmpmod.load(str(tmp_path / "a.json"))).regressions]
    drop = ["throughput 198.18.0.2 send", "throughput 198.18.0.2 receive"]
    assert regs() == drop
    a["thresholds"] = {"throughput": {"pct": 1e9, "abs": None}}
    write(tmp_path / "a.json", a)
    with pytest.raises(cmpmod.SnapshotError, match="thresholds.throughput.pct: 1e\\+09 is out of range"):
        regs()
    a["thresholds"] = {"throughput": {"pct": 99, "abs": None}}
    write(tmp_path / "a.json", a)
    assert regs() == drop                       # the candidate's own thresholds do not count
    b["thresholds"] = {"throughput": {"pct": 60, "abs": None}, "a_kind_from_a_newer_release": {"pct": 1}}
    write(tmp_path / "b.json", b)
    assert regs() == []
    for bad, where in (({"throughput": {"pct": "ten"}}, "thresholds.throughput.pct"),
                       ({"throughput": {"pct": float("nan")}}, "thresholds.throughput.pct"),
                       ({"throughput": {"abs": float("inf")}}, "thresholds.throughput.abs"),
                       ({"throughput": [10]}, "thresholds.throughput"), ([1], "thresholds")):
        for doc, name in ((a, "a.json"), (b, "b.json")):
            saved = doc.get("thresholds")
            doc["thresholds"] = bad
            write(tmp_path / name, doc)
            with pytest.raises(cmpmod.SnapshotError, match=f"{name}: {where}"):
                regs()
            doc["thresholds"] = saved
            write(tmp_path / name, doc)


def test_a_non_finite_figure_is_an_error_naming_file_and_key(tmp_path):
    b, a = snapshot("n1"), snapshot("n1")
    a["engine"] = {"status": "ok", "tool": "t", "model": "m", "batch": 1, "img_s": [100.0, float("nan")],
                   "latency_ms": [1.0, 1.0]}
    write(tmp_path / "b.json", b)
    write(tmp_path / "a.json", a)
    p = hk("baseline", "compare", str(tmp_path / "b.json"), str(tmp_path / "a.json"))
    assert p.returncode == 1 and "a.json: engine.img_s: NaN or infinity" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_refused_connection_is_tried_again_before_it_counts(monkeypatch):
    """A persistent iperf3 -s reopens its listener after each test: a client that connects then is
    refused (CI saw it once: "unable to connect to server: Connection refused" with the server up).
    The client tries again; a server that stays away is still one error, after the tries."""
    import subprocess
    answers = [recorded("iperf3-refused.json"), recorded("iperf3-send.json")]
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, answers[min(len(calls), len(answers)) - 1], "")
    monkeypatch.setattr(iperf.subprocess, "run", run)
    monkeypatch.setattr(iperf.time, "sleep", lambda s: None)
    monkeypatch.setattr(iperf, "exe", lambda: "/usr/bin/iperf3")
    r = iperf.client("198.18.0.2")
    assert r.error is None and r.gbit > 0 and len(calls) == 2
    answers[1] = answers[0]   # never there
    calls.clear()
    r = iperf.client("198.18.0.2", busy_retries=3)
    assert r.error == "iperf3: unable to connect to server: Connection refused" and len(calls) == 4
