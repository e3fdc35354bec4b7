"""hkgpu-tune export: one textfile (verify + collectors), checked with prometheus_client's parser
(and promtool where installed); bad directories; a collector that fails."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hkgpu_tune.observe import export as X
from hkgpu_tune.observe.collect import Sources

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from tests.fixtures.monitor import replay_host as R  # noqa: E402

# every name of notes' metric contract that the replayed host (no probes) must carry
NAMES = """hkgpu_tune_setting_status hkgpu_tune_failures hkgpu_tune_last_run_timestamp_seconds
hkgpu_tune_run_duration_seconds hkgpu_tune_info hkgpu_tune_collector_up hkgpu_tune_collector_duration_seconds
hkgpu_tune_nic_dropped_total hkgpu_tune_nic_errors_total hkgpu_tune_nic_queue_dropped_total
hkgpu_tune_tcp_retransmitted_segments_total hkgpu_tune_tcp_sent_segments_total
hkgpu_tune_gpu_utilization_ratio hkgpu_tune_gpu_memory_used_bytes hkgpu_tune_gpu_memory_total_bytes
hkgpu_tune_gpu_temperature_celsius hkgpu_tune_gpu_power_watts hkgpu_tune_gpu_throttle
hkgpu_tune_gpu_ecc_errors_total hkgpu_tune_gpu_remapped_rows hkgpu_tune_gpu_remap_pending
hkgpu_tune_gpu_remap_failed hkgpu_tune_gpu_pcie_link_gen hkgpu_tune_exporter_present
hkgpu_tune_gpu_pcie_link_width hkgpu_tune_xid_events hkgpu_tune_kernel_events
hkgpu_tune_health_status hkgpu_tune_health_check""".split()


def samples(text):
    """(name, labels) -> value, through prometheus_client's own parser; duplicates fail."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def names(smp):
    return {n for n, _ in smp}


@pytest.fixture
def replayed(tmp_path):
    return R.host(str(tmp_path / "state"))


def test_replayed_host_textfile(tmp_path, replayed):
    prof, eng, src = replayed
    rep = X.export(prof, str(tmp_path), engine=eng, sources=src)
    text = open(tmp_path / "hkgpu-tune.prom").read()
    assert text == rep.text and rep.path == str(tmp_path / "hkgpu-tune.prom")
    smp = samples(text)
    # prometheus_client strips _total from a counter family's name; its sample keeps it
    missing = [n for n in NAMES if n not in names(smp)]
    assert not missing
    assert len(smp) == rep.series and rep.series < 2000
    assert all(v == 1 for (n, lab), v in smp.items() if n == "hkgpu_tune_collector_up")
    assert smp[("hkgpu_tune_failures", ())] == 1           # wmem_max below the profile (replayed drift)
    assert smp[("hkgpu_tune_nic_queue_dropped_total", (("device", "ens9f0np0"), ("queue", "tx-63")))] == 126
    assert smp[("hkgpu_tune_xid_events", (("gpu", "4"), ("xid", "48")))] == 2
    assert smp[("hkgpu_tune_gpu_memory_total_bytes", (("gpu", "7"), ("uuid", "GPU-00000000-0000-0000-0000-000000000007")))] == 80 * 1024 ** 3
    qd = [lab for (n, lab), v in smp.items() if n == "hkgpu_tune_setting_status" and dict(lab)["subsystem"] == "qdisc"
          and dict(lab)["status"] == "ok" and v == 1]
    assert len(qd) == 2 * (R.QUEUES + 1)                   # root and every queue of both ports


def test_a_failing_collector_is_down_and_the_rest_still_exported(tmp_path, replayed):
    prof, eng, src = replayed

    class Broken(R.ReplayNic):
        def ethtool_stats(self, dev):
            raise OSError("ethtool: Operation not supported")

    src.nic = Broken()
    rep = X.export(prof, str(tmp_path), engine=eng, sources=src)
    smp = samples(open(tmp_path / "hkgpu-tune.prom").read())
    assert smp[("hkgpu_tune_collector_up", (("collector", "nic"),))] == 0
    assert smp[("hkgpu_tune_collector_up", (("collector", "gpu"),))] == 1
    assert "hkgpu_tune_nic_dropped_total" not in names(smp)
    assert {"hkgpu_tune_gpu_power_watts", "hkgpu_tune_setting_status", "hkgpu_tune_tcp_sent_segments_total"} <= names(smp)
    assert rep.down == ["nic"] and "Operation not supported" in rep.collectors[1].error


def test_verify_failing_is_a_down_collector_not_a_crash(tmp_path, replayed):
    from hkgpu_tune.core.errors import HkError
    prof, eng, src = replayed

    def boom():
        raise HkError("state directory unreadable")
    eng.verify = boom
    smp = samples(X.export(prof, str(tmp_path), engine=eng, sources=src).text)
    assert smp[("hkgpu_tune_collector_up", (("collector", "verify"),))] == 0
    assert "hkgpu_tune_setting_status" not in names(smp) and "hkgpu_tune_gpu_throttle" in names(smp)


NO_PROMTOOL = "needs promtool (Debian's prometheus, scripts/apt-packages.txt)"


def promtool_says(text: str) -> str:
    """What `promtool check metrics` has to say (it also lints names: units, _total on counters)."""
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    return f"rc {p.returncode}: {p.stdout}{p.stderr}" if p.returncode or (p.stdout + p.stderr).strip() else ""


@pytest.mark.skipif(not shutil.which("promtool"), reason=NO_PROMTOOL)
def test_promtool_accepts_the_textfile(tmp_path, replayed):
    prof, eng, src = replayed
    rep = X.export(prof, str(tmp_path), engine=eng, sources=src)
    assert promtool_says(rep.text) == ""          # nothing to say is the bar


@pytest.mark.skipif(not shutil.which("promtool") or not shutil.which("ping"), reason=NO_PROMTOOL + " and ping")
def test_promtool_accepts_the_textfile_with_probes(tmp_path):
    """`export --probes` as a whole process: RTT quantiles, jitter, loss, the profile's expectations
    and the MTU probe, towards peers on loopback (one answers, one WAN peer with thresholds)."""
    prof = tmp_path / "p.yaml"
    prof.write_text("name: probes-lint\nnetwork:\n  interfaces:\n    - match: {name: lo}\n      mtu: 1500\n"
                    "  fabric_peers: [127.0.0.1]\n"
                    "  wan_peers:\n    - {address: 127.0.0.2, name: hk-sg, rtt_ms: 40, jitter_ms: 8}\n"
                    "  probe: {gateway: false}\n")
    d = tmp_path / "tf"
    d.mkdir()
    r = cli("--probes", "--textfile-dir", str(d), "--profile", str(prof), "--state-dir", str(tmp_path / "st"))
    assert r.returncode in (0, 2), r.stderr
    text = (d / "hkgpu-tune.prom").read_text()
    smp = samples(text)
    # the probe families are there (else the lint proves nothing about them)
    for n in ("hkgpu_tune_peer_rtt_p50_seconds", "hkgpu_tune_peer_rtt_p99_seconds", "hkgpu_tune_peer_jitter_seconds",
              "hkgpu_tune_peer_loss_ratio",
              "hkgpu_tune_peer_rtt_expected_seconds", "hkgpu_tune_peer_jitter_threshold_seconds"):
        assert n in names(smp), n
    fab = (("kind", "fabric"), ("peer", "127.0.0.1"))
    assert 0 < smp[("hkgpu_tune_peer_rtt_p99_seconds", fab)] < 0.1
    assert promtool_says(text) == ""


# ---- the command as a whole process

PROFILE = "name: exp-test\nsysctl:\n  net.ipv4.tcp_mtu_probing: 1\n"


def cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", "export", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=60, **kw)


@pytest.fixture
def prof_file(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(PROFILE)
    return str(p)


def test_cli_writes_the_file_and_reports_json(tmp_path, prof_file):
    d = tmp_path / "tf"
    d.mkdir()
    r = cli("--textfile-dir", str(d), "--profile", prof_file, "--json", "--state-dir", str(tmp_path / "st"))
    assert r.returncode in (0, 2), r.stderr
    doc = json.loads(r.stdout)
    assert doc["command"] == "export" and doc["path"] == str(d / "hkgpu-tune.prom")
    assert {c["collector"] for c in doc["collectors"]} == {"verify", "nic", "tcp", "gpu", "kmsg", "health"}
    smp = samples((d / "hkgpu-tune.prom").read_text())
    info = [dict(lab) for (n, lab), v in smp.items() if n == "hkgpu_tune_info"][0]
    assert info["profile"] == "exp-test"
    assert info["profile_sha256"] == hashlib.sha256(PROFILE.encode()).hexdigest()
    assert os.listdir(d) == ["hkgpu-tune.prom"]          # no temporary file left
    assert r.returncode == (2 if doc["failures"] or any(not c["up"] for c in doc["collectors"]) else 0)


def test_env_names_the_directory(tmp_path, prof_file):
    d = tmp_path / "envdir"
    d.mkdir()
    r = cli("--profile", prof_file, env={**os.environ, "HKGPU_TUNE_TEXTFILE_DIR": str(d)})
    assert r.returncode in (0, 2), r.stderr
    assert (d / "hkgpu-tune.prom").exists()


def one_error_line(r):
    err = r.stderr.strip().splitlines()
    return r.returncode == 1 and len(err) == 1 and err[0].startswith("hkgpu-tune: error: ") and "Traceback" not in r.stderr


def test_missing_directory_is_one_error(tmp_path, prof_file):
    r = cli("--textfile-dir", str(tmp_path / "nope"), "--profile", prof_file)
    assert one_error_line(r) and "does not exist" in r.stderr and str(tmp_path / "nope") in r.stderr


def test_a_file_instead_of_a_directory_is_one_error(tmp_path, prof_file):
    f = tmp_path / "file"
    f.write_text("x")
    r = cli("--textfile-dir", str(f), "--profile", prof_file)
    assert one_error_line(r) and "not a directory" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare (a read-only bind mount in a mount namespace of its own)")
def test_unwritable_directory_is_one_error_and_the_previous_file_stays(tmp_path, prof_file):
    d = tmp_path / "ro"
    d.mkdir()
    (d / "hkgpu-tune.prom").write_text("hkgpu_tune_failures 7\n")
    cmd = (f"mount --bind -o ro {d} {d} && exec {sys.executable} -m hkgpu_tune export "
           f"--textfile-dir {d} --profile {prof_file}")
    r = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert one_error_line(r) and "not writable" in r.stderr
    assert (d / "hkgpu-tune.prom").read_text() == "hkgpu_tune_failures 7\n" and os.listdir(d) == ["hkgpu-tune.prom"]


def test_a_link_at_the_file_name_is_refused_and_left_alone(tmp_path, prof_file):
    d = tmp_path / "tf"
    d.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    os.symlink(target, d / "hkgpu-tune.prom")
    r = cli("--textfile-dir", str(d), "--profile", prof_file)
    assert one_error_line(r) and "link" in r.stderr
    assert target.read_text() == "keep\n" and os.path.islink(d / "hkgpu-tune.prom")


@pytest.mark.root
def test_probes_between_namespaces_in_the_textfile(tmp_path):
    """--probes: RTT, jitter and loss to a fabric peer and a dead WAN peer, and the MTU probe,
    from a namespace of the test's own (198.18.x.x), removed afterwards."""
    if not shutil.which("ping") or not shutil.which("ip"):
        pytest.skip("needs ping and iproute2")
    from tests.collect.conftest import Pair
    p = Pair()
    try:
        prof = tmp_path / "p.yaml"
        prof.write_text(f"""name: probes
network:
  interfaces:
    - match: {{name: {p.a}}}
      mtu: 1500
  fabric_peers: [{p.ipb}, 198.19.254.1]
  wan_peers:
    - {{address: 198.18.{p.net}.97, name: hk-sg, rtt_ms: 40, jitter_ms: 8}}
  probe: {{gateway: false}}
""")
        d = tmp_path / "tf"
        d.mkdir()
        r = subprocess.run(["ip", "netns", "exec", p.A, sys.executable, "-m", "hkgpu_tune", "export", "--probes",
                            "--textfile-dir", str(d), "--profile", str(prof), "--state-dir", str(tmp_path / "st")],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
        assert r.returncode in (0, 2), r.stderr
        text = (d / "hkgpu-tune.prom").read_text()
    finally:
        p.remove()
    smp = samples(text)
    if shutil.which("promtool"):   # the --probes form through the real promtool: nothing to say
        assert promtool_says(text) == ""
    fab = (("kind", "fabric"), ("peer", p.ipb))
    assert 0 < smp[("hkgpu_tune_peer_rtt_p99_seconds", fab)] < 0.1
    assert smp[("hkgpu_tune_peer_loss_ratio", fab)] == 0.0 and ("hkgpu_tune_peer_jitter_seconds", fab) in smp
    wan = (("kind", "wan"), ("peer", "hk-sg"))
    assert smp[("hkgpu_tune_peer_loss_ratio", wan)] == 1.0 and ("hkgpu_tune_peer_rtt_p50_seconds", wan) not in smp
    assert smp[("hkgpu_tune_peer_rtt_expected_seconds", wan)] == 0.04
    assert smp[("hkgpu_tune_peer_jitter_threshold_seconds", wan)] == 0.008
    assert ("hkgpu_tune_peer_jitter_threshold_seconds", fab) not in smp
    assert smp[("hkgpu_tune_mtu_probe_ok", (("device", p.a), ("peer", p.ipb)))] == 1
    # no route from the namespace: found before any ping, and still a 0 the alert sees
    assert smp[("hkgpu_tune_mtu_probe_ok", (("device", "-"), ("peer", "198.19.254.1")))] == 0
    assert smp[("hkgpu_tune_collector_up", (("collector", "probe"),))] == 1


@pytest.mark.parametrize("arg", [None, "hk-latency"])
def test_info_hashes_the_shipped_profile_file_not_its_name(tmp_path, arg):
    """The default profile is loaded by name: its sha256 is the shipped file's, whatever the cwd."""
    from hkgpu_tune.core.profile import PROFILE_DIR, DEFAULT_PROFILE
    d = tmp_path / "tf"
    d.mkdir()
    r = cli("--textfile-dir", str(d), "--state-dir", str(tmp_path / "st"), *(["--profile", arg] if arg else []))
    assert r.returncode in (0, 2), r.stderr
    info = [dict(lab) for (n, lab), v in samples((d / "hkgpu-tune.prom").read_text()).items() if n == "hkgpu_tune_info"][0]
    with open(os.path.join(PROFILE_DIR, f"{arg or DEFAULT_PROFILE}.yaml"), "rb") as f:
        assert info["profile_sha256"] == hashlib.sha256(f.read()).hexdigest()


@pytest.mark.root
def test_a_peer_both_fabric_and_wan_has_one_mtu_series_and_its_failure_shows(tmp_path):
    """The same address as a fabric peer (probed at the jumbo MTU: fails, the peer's end is 1500)
    and a WAN peer (1472 bytes: passes): one hkgpu_tune_mtu_probe_ok{device,peer}, and it is 0."""
    if not shutil.which("ping") or not shutil.which("ip"):
        pytest.skip("needs ping and iproute2")
    from tests.collect.conftest import Pair, sh
    p = Pair()
    try:
        sh("ip", "-n", p.A, "link", "set", p.a, "mtu", "9000")
        prof = tmp_path / "p.yaml"
        prof.write_text(f"""name: both
network:
  interfaces:
    - match: {{name: {p.a}}}
      mtu: 9000
  fabric_peers: [{p.ipb}]
  wan_peers:
    - {{address: {p.ipb}, name: same-box}}
  probe: {{gateway: false}}
""")
        d = tmp_path / "tf"
        d.mkdir()
        r = subprocess.run(["ip", "netns", "exec", p.A, sys.executable, "-m", "hkgpu_tune", "export", "--probes",
                            "--textfile-dir", str(d), "--profile", str(prof), "--state-dir", str(tmp_path / "st")],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
        assert r.returncode in (0, 2), r.stderr
        text = (d / "hkgpu-tune.prom").read_text()
    finally:
        p.remove()
    mtu = [ln for ln in text.splitlines() if ln.startswith("hkgpu_tune_mtu_probe_ok{")]
    assert mtu == [f'hkgpu_tune_mtu_probe_ok{{device="{p.a}",peer="{p.ipb}"}} 0'], mtu
    samples(text)   # no duplicate series anywhere


H200 = os.path.join(REPO, "tests", "fixtures", "gpu", "h200-health.json")


def test_cli_replays_nvml_and_the_kernel_log_as_health_does(tmp_path, prof_file):
    """HKGPU_TUNE_NVML_REPLAY and HKGPU_TUNE_KMSG_REPLAY, the switches `health` has, reach export's
    collectors; a replay that cannot be read is one line (NVML) or a down collector (the kernel log)."""
    d = tmp_path / "tf"
    d.mkdir()
    (tmp_path / "kmsg.txt").write_text("[   12.5] NVRM: Xid (PCI:0000:00:06): 79, pid=1, name=x, GPU has fallen off the bus\n")
    env = {**os.environ, "HKGPU_TUNE_NVML_REPLAY": H200, "HKGPU_TUNE_KMSG_REPLAY": str(tmp_path / "kmsg.txt")}
    r = cli("--textfile-dir", str(d), "--profile", prof_file, "--state-dir", str(tmp_path / "st"), env=env)
    assert r.returncode in (0, 2), r.stderr
    smp = samples((d / "hkgpu-tune.prom").read_text())
    assert [lab for n, lab in smp if n == "hkgpu_tune_gpu_temperature_celsius"]   # the recorded H200
    assert smp[("hkgpu_tune_xid_events", (("gpu", "0"), ("xid", "79")))] == 1
    assert smp[("hkgpu_tune_health_check", (("check", "xid"),))] == 1

    bad = cli("--textfile-dir", str(d), "--profile", prof_file, env={**env, "HKGPU_TUNE_NVML_REPLAY": str(tmp_path / "no.json")})
    assert one_error_line(bad) and "HKGPU_TUNE_NVML_REPLAY" in bad.stderr
    r = cli("--textfile-dir", str(d), "--profile", prof_file, "--json", "--state-dir", str(tmp_path / "st"),
            env={**env, "HKGPU_TUNE_KMSG_REPLAY": str(tmp_path / "no.txt")})
    kmsg = [c for c in json.loads(r.stdout)["collectors"] if c["collector"] == "kmsg"][0]
    assert r.returncode == 2 and not kmsg["up"] and "HKGPU_TUNE_KMSG_REPLAY" in kmsg["error"]
