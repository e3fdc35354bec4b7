"""The textfile as node_exporter and Prometheus take it: every export form passes the real
`promtool check metrics`; one writer per textfile (a second file with the same series is refused,
two writers of the directory take turns); what node_exporter and dcgm-exporter export live is left
to them, by the profile's switch or by seeing their processes; the real node_exporter serves the
export's file with no scrape error and no duplicate."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

from hkgpu_tune.observe import export as X
from hkgpu_tune.core import report
from hkgpu_tune.observe.collect import exporters as E
from hkgpu_tune.core.errors import HkError, ProfileError
from hkgpu_tune.core.profile import parse_profile_text

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from tests.fixtures.monitor import replay_host as R  # noqa: E402

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian's prometheus package)")
EXAMPLE = os.path.join(REPO, "docs", "examples", "triton-resnet50.yaml")
NODE_ONLY = {"node_exporter": True, "dcgm_exporter": False}
BOTH = {"node_exporter": True, "dcgm_exporter": True}
NONE = {"node_exporter": False, "dcgm_exporter": False}


def promtool_ok(text: str) -> None:
    """promtool's parser and its lint (units, _total on counters, no quantile on a gauge): silent."""
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    assert p.returncode == 0 and not (p.stdout + p.stderr).strip(), p.stdout + p.stderr


def hk(*args, timeout=120):
    env = {k: v for k, v in os.environ.items() if k not in ("HKGPU_TUNE_PROFILE", "HKGPU_TUNE_TEXTFILE_DIR")}
    env.update({"HKGPU_TUNE_ETC_DIR": "/nonexistent-hkgpu-etc", "PYTHONPATH": REPO})
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout)


@pytest.fixture
def replayed(tmp_path):
    return R.host(str(tmp_path / "state"))


# ---------------------------------------------------------------- promtool, every form
@needs_promtool
@pytest.mark.parametrize("there", [NONE, NODE_ONLY, BOTH], ids=["alone", "node_exporter", "both"])
def test_every_export_form_passes_promtool(tmp_path, replayed, there, monkeypatch):
    prof, eng, src = replayed
    from hkgpu_tune.observe.collect import probe
    # --probes with replies and a dead peer (the pings themselves: test_export's namespace test)
    monkeypatch.setattr(probe, "probe_peers", lambda p, count, deadline: [
        ("198.18.0.2", "fabric", probe.stats("198.18.0.2", 5, [0.1, 0.3, 0.2, 0.2, 0.1])),
        ("hk-sg", "wan", probe.stats("198.18.0.97", 5, []))])
    for probes in (False, True):
        rep = X.build(prof, eng, sources=src, probes=probes, exporters=there)
        promtool_ok(rep.text)
        assert ("hkgpu_tune_peer_rtt_p50_seconds{" in rep.text) == probes


@needs_promtool
def test_verify_prometheus_and_health_forms_pass_promtool(tmp_path):
    """verify --prometheus of the default and the Triton example profile on this host, and the
    health families of a degraded node (GPU expected, none there)."""
    for prof in ("hk-inference", EXAMPLE):
        (tmp_path / os.path.basename(prof)).mkdir()     # a directory each: one writer per textfile
        f = tmp_path / os.path.basename(prof) / "verify.prom"
        p = hk("verify", "-p", prof, "--prometheus", str(f), "--state-dir", str(tmp_path / "st"))
        assert p.returncode in (0, 2), p.stderr
        promtool_ok(f.read_text())
    from hkgpu_tune.observe import health
    from hkgpu_tune.observe.collect import render
    rep = health.check(parse_profile_text("name: t\nhealth: {gpus_expected: 8}\n", "t.yaml"),
                       gpu_error="NVML library not found")
    promtool_ok("\n".join(render(health.to_families(rep))) + "\n")


def test_gpu_counts_and_flags_are_separate_families(replayed):
    prof, eng, src = replayed
    text = X.build(prof, eng, sources=src, exporters=NONE).text
    rows = [ln for ln in text.splitlines() if ln.startswith("hkgpu_tune_gpu_remapped_rows{")]
    assert rows and all('cause="correctable"' in ln or 'cause="uncorrectable"' in ln for ln in rows)
    assert "hkgpu_tune_gpu_remap_pending{" in text and "hkgpu_tune_gpu_remap_failed{" in text
    assert 'state="pending"' not in text and 'quantile="' not in text


# ---------------------------------------------------------------- deferring to the exporters
def families(text: str) -> set[str]:
    return {ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE ")}


def test_what_the_exporters_have_is_left_to_them(replayed):
    prof, eng, src = replayed
    alone = families(X.build(prof, eng, sources=src, exporters=NONE).text)
    node = families(X.build(prof, eng, sources=src, exporters=NODE_ONLY).text)
    both_text = X.build(prof, eng, sources=src, exporters=BOTH).text
    both = families(both_text)
    assert E.DUPLICATES["node_exporter"] <= alone and E.DUPLICATES["dcgm_exporter"] <= alone
    assert not node & E.DUPLICATES["node_exporter"] and E.DUPLICATES["dcgm_exporter"] <= node
    assert not both & (E.DUPLICATES["node_exporter"] | E.DUPLICATES["dcgm_exporter"])
    # what they lack stays: settings, health, per-queue drops, ECC, throttle, a pending remap, PCIe
    for name in ("hkgpu_tune_setting_status", "hkgpu_tune_health_status", "hkgpu_tune_nic_queue_dropped_total",
                 "hkgpu_tune_gpu_ecc_errors_total", "hkgpu_tune_gpu_throttle", "hkgpu_tune_gpu_remap_pending",
                 "hkgpu_tune_gpu_pcie_link_width", "hkgpu_tune_kernel_events"):
        assert name in both, name
    assert 'hkgpu_tune_exporter_present{exporter="dcgm_exporter"} 1' in both_text
    # the health verdict still reads the GPU collector's data: the XIDs of the replayed host count
    assert 'hkgpu_tune_health_check{check="xid"} 1' in both_text


def fake_proc(root, *comms):
    for i, c in enumerate(comms, start=100):
        os.makedirs(root / str(i))
        (root / str(i) / "comm").write_text(c + "\n")
    (root / "self").mkdir()
    return str(root)


def test_auto_finds_the_exporters_processes(tmp_path):
    cfg = E.ExportConfig()
    assert E.present(cfg, fake_proc(tmp_path / "a", "sshd", "prometheus-node")) == NODE_ONLY
    assert E.present(cfg, fake_proc(tmp_path / "b", "node_exporter", "dcgm-exporter")) == BOTH
    assert E.present(cfg, fake_proc(tmp_path / "c", "bash")) == NONE
    # the profile's true/false wins over what runs
    pinned = E.ExportConfig(node_exporter=False, dcgm_exporter=True)
    assert E.present(pinned, fake_proc(tmp_path / "d", "node_exporter")) == {"node_exporter": False,
                                                                           "dcgm_exporter": True}


def test_auto_sees_a_live_process(tmp_path):
    """A process named dcgm-exporter in this host's /proc (none runs here before it starts)."""
    assert "dcgm_exporter" not in E.running()
    exe = tmp_path / "dcgm-exporter"
    shutil.copy(shutil.which("sleep"), exe)
    p = subprocess.Popen([str(exe), "30"])
    try:
        # the name in /proc is the program's once exec has happened (before that it is python's)
        deadline = time.monotonic() + 10
        while not os.path.exists(f"/proc/{p.pid}/comm") or open(f"/proc/{p.pid}/comm").read().strip() != "dcgm-exporter":
            assert time.monotonic() < deadline, "the stand-in never exec'd"
            time.sleep(0.01)
        assert "dcgm_exporter" in E.running()
        assert E.present(E.ExportConfig())["dcgm_exporter"] is True
    finally:
        p.kill()
        p.wait()


def test_the_profile_switch_and_its_errors(tmp_path, replayed):
    prof = parse_profile_text("name: t\nexport:\n  node_exporter: true\n  dcgm_exporter: false\n"
                              "  collectors: [gpu, kmsg]\n", "t.yaml")
    cfg = E.config_of(prof)
    assert (cfg.node_exporter, cfg.dcgm_exporter, cfg.collectors) == (True, False, ("gpu", "kmsg"))
    with pytest.raises(ProfileError, match=r"t.yaml:3: export.dcgm_exporter: expected auto, true or false"):
        parse_profile_text("name: t\nexport:\n  dcgm_exporter: sometimes\n", "t.yaml")
    with pytest.raises(ProfileError, match=r"t.yaml:3: export.collectors\[1\]: .*did you mean 'gpu'"):
        parse_profile_text("name: t\nexport:\n  collectors: [nic, gpus]\n", "t.yaml")
    _, eng, src = replayed
    collected = X.build(prof, eng, sources=src)
    assert [c.collector for c in collected.collectors] == ["verify", "gpu", "kmsg", "health"]


def test_cli_collectors_option(tmp_path):
    d = tmp_path / "tf"
    d.mkdir()
    p = hk("export", "--textfile-dir", str(d), "--collectors", "tcp", "--state-dir", str(tmp_path / "st"), "--json")
    assert p.returncode in (0, 2), p.stderr
    import json
    doc = json.loads(p.stdout)
    assert [c["collector"] for c in doc["collectors"]] == ["verify", "tcp", "health"]
    bad = hk("export", "--textfile-dir", str(d), "--collectors", "tcp,nvlink")
    assert bad.returncode == 1 and "expected comma-separated collectors" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- one writer per textfile
def test_verify_prometheus_beside_the_timers_file_is_refused(tmp_path):
    d = tmp_path / "node-exporter"
    d.mkdir()
    p = hk("export", "--textfile-dir", str(d), "--state-dir", str(tmp_path / "st"))
    assert p.returncode in (0, 2), p.stderr
    before = (d / "hkgpu-tune.prom").read_bytes()
    v = hk("verify", "--prometheus", str(d / "hkgpu.prom"), "--state-dir", str(tmp_path / "st"))
    assert v.returncode == 1, v.stdout
    assert v.stderr.count("\n") == 1 and "hkgpu-tune.prom already has hkgpu_tune_" in v.stderr, v.stderr
    assert sorted(os.listdir(d)) == ["hkgpu-tune.prom"] and (d / "hkgpu-tune.prom").read_bytes() == before
    # somewhere else it is written; the same file again is no clash with itself
    ok = tmp_path / "verify.prom"
    for _ in range(2):
        v = hk("verify", "--prometheus", str(ok), "--state-dir", str(tmp_path / "st"))
        assert v.returncode in (0, 2) and ok.exists(), v.stderr


def test_export_refuses_a_stray_file_with_its_series(tmp_path, replayed):
    prof, eng, src = replayed
    (tmp_path / "hkgpu.prom").write_text("# TYPE hkgpu_tune_failures gauge\nhkgpu_tune_failures 0\n")
    (tmp_path / "other.prom").write_text("# TYPE other_metric gauge\nother_metric 1\n")
    with pytest.raises(HkError, match=r"hkgpu\.prom already has hkgpu_tune_failures; node_exporter would drop"):
        X.export(prof, str(tmp_path), engine=eng, sources=src)
    assert not (tmp_path / "hkgpu-tune.prom").exists()
    os.unlink(tmp_path / "hkgpu.prom")
    X.export(prof, str(tmp_path), engine=eng, sources=src)   # another writer's own series are no clash
    assert (tmp_path / "hkgpu-tune.prom").exists()


def test_a_second_writer_waits_for_the_first(tmp_path, host_dir):
    """Two of our writers (the timer and an operator) take turns on the lock file in the host
    directory (no longer a flock on the textfile directory, which any reader could hold:
    tests/hostile/test_textfile_stall.py)."""
    from hkgpu_tune.core import lockfile
    from hkgpu_tune.observe import export
    from hkgpu_tune.tune.host import owned_problem
    d = tmp_path / "tf"
    d.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "HKGPU_TUNE_PROFILE"}
    env.update({"HKGPU_TUNE_ETC_DIR": "/nonexistent-hkgpu-etc", "PYTHONPATH": REPO,
                "HKGPU_TUNE_HOST_DIR": str(host_dir)})
    with lockfile.hold(str(host_dir / export.LOCK_FILE), "textfile lock file", "1\n", owned_problem):
        p = subprocess.Popen([sys.executable, "-m", "hkgpu_tune", "export", "--textfile-dir", str(d),
                              "--state-dir", str(tmp_path / "st")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
        try:
            end = time.monotonic() + 3
            while time.monotonic() < end:     # held by the first writer: nothing is written
                assert p.poll() is None, p.communicate()
                assert not (d / "hkgpu-tune.prom").exists()
                time.sleep(0.1)
        except BaseException:
            p.kill()
            raise
    out, err = p.communicate(timeout=120)   # the first is done: the second writes
    assert p.returncode in (0, 2), err
    assert (d / "hkgpu-tune.prom").exists()


# ---------------------------------------------------------------- the real node_exporter
NODE_EXPORTER = shutil.which("prometheus-node-exporter")


@pytest.mark.skipif(NODE_EXPORTER is None, reason="needs Debian's prometheus-node-exporter")
def test_node_exporter_serves_the_export_without_duplicates(tmp_path):
    from hkgpu_tune.serve.running.client import free_ports
    d = tmp_path / "tf"
    d.mkdir()
    port = free_ports(1)[0]
    ne = subprocess.Popen([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}",
                           f"--collector.textfile.directory={d}", "--collector.disable-defaults",
                           "--collector.textfile", "--collector.netdev", "--collector.netstat"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # node_exporter runs: `auto` sees it and leaves the NIC and TCP counters to it
        p = hk("export", "--textfile-dir", str(d), "--state-dir", str(tmp_path / "st"))
        assert p.returncode in (0, 2), p.stderr
        text = (d / "hkgpu-tune.prom").read_text()
        assert 'hkgpu_tune_exporter_present{exporter="node_exporter"} 1' in text
        assert "hkgpu_tune_tcp_retransmitted_segments_total" not in text
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    scraped = r.read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline and ne.poll() is None, "node_exporter did not answer"
                time.sleep(0.2)
        assert "\nnode_textfile_scrape_error 0\n" in scraped
        assert 'hkgpu_tune_exporter_present{exporter="node_exporter"} 1' in scraped
        assert "node_netstat_Tcp_RetransSegs " in scraped   # the live one the rules use
    finally:
        ne.terminate()
        ne.wait(timeout=10)
