"""health in-process: the profile section, NIC error rises across runs, lost GPUs as the real NVML
backend reports them, and the families for the textfile (through the collectors' own renderer)."""
import copy
import json
import os
import shutil
import subprocess

import pytest

from hkgpu_tune.observe import collect
from hkgpu_tune.observe import health, health_config
from hkgpu_tune.backends.nvml import ReplayNvml
from hkgpu_tune.core.errors import UnsupportedError
from hkgpu_tune.core.profile import parse_profile_text

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "health")


def two_gpu():
    with open(os.path.join(FIX, "two-gpu.json")) as f:
        return json.load(f)


def prof(text="health: {}\n"):
    return parse_profile_text(text, "p.yaml")


def test_section_parses_with_defaults_and_values():
    p = prof("health:\n  gpus_expected: 8\n  xids: [79, 48, 79]\n  temperature_max_c: 87.5\n"
             "  pcie_gen: false\n  nic_errors: {devices: [eth1, eth2], max_increase: 10}\n"
             "  on_unhealthy: [/usr/local/bin/drain, --reason, gpu]\n  hook_timeout_s: 5\n  hold_down_s: 600\n")
    c = health.config_of(p)
    assert (c.gpus_expected, c.xids, c.temperature_max_c, c.pcie_gen, c.pcie_width) == (8, (48, 79), 87.5, False, True)
    assert (c.nic_devices, c.nic_errors_max_increase) == (("eth1", "eth2"), 10)
    assert c.on_unhealthy == ("/usr/local/bin/drain", "--reason", "gpu") and c.on_healthy is None
    assert (c.hook_timeout_s, c.hold_down_s, c.ecc_uncorrected_max) == (5.0, 600.0, 0)
    d = health.config_of(prof("name: x\n"))
    assert d == health.HealthConfig() and d.xids == health_config.DEFAULT_XIDS


def test_nic_errors_rising_between_runs(tmp_path):
    p = prof("health:\n  xids: []\n  nic_errors: {devices: [eth1, eth9], max_increase: 2}\n")
    st = str(tmp_path / "st")
    nv = ReplayNvml(two_gpu())
    r = health.run(p, state_dir=st, nvml=nv, nic_counters={"eth1": {"rx_errors": 10, "tx_errors": 5}})
    got = {c.target: (c.status, c.value) for c in r.checks if c.name == "nic_errors"}
    assert got == {"eth1": ("ok", 0), "eth9": ("error", None)} and r.status == "error"
    r = health.run(p, state_dir=st, nvml=nv, nic_counters={"eth1": {"rx_errors": 11, "tx_errors": 6}})
    c = next(c for c in r.checks if c.target == "eth1")
    assert (c.status, c.value, c.threshold) == ("ok", 2, 2)
    r = health.run(p, state_dir=st, nvml=nv, nic_counters={"eth1": {"rx_errors": 14, "tx_errors": 6}})
    c = next(c for c in r.checks if c.target == "eth1")
    assert (c.status, c.value) == ("failing", 3) and r.status == "degraded"
    r = health.run(p, state_dir=st, nvml=nv, nic_counters={"eth1": {"rx_errors": 0, "tx_errors": 0}})
    c = next(c for c in r.checks if c.target == "eth1")
    assert c.status == "ok" and "reset" in c.reason      # driver reload: counters start again


def test_nic_errors_read_from_sys(tmp_path):
    p = prof("health:\n  xids: []\n  nic_errors: {devices: [lo]}\n")
    r = health.run(p, state_dir=str(tmp_path / "st"), nvml=ReplayNvml(two_gpu()))
    c = next(c for c in r.checks if c.name == "nic_errors")
    assert c.status == "ok" and c.target == "lo"
    saved = json.loads((tmp_path / "st" / "health.json").read_text())["nic"]
    with open("/sys/class/net/lo/statistics/rx_errors") as f1, open("/sys/class/net/lo/statistics/tx_errors") as f2:
        assert saved == {"lo": int(f1.read()) + int(f2.read())}


class LostNvml:
    """The real backend's answer when nvmlDeviceGetHandleByIndex returns NVML_ERROR_GPU_IS_LOST."""

    def __init__(self, replay, lost):
        self.r, self.lost = replay, lost

    def count(self):
        return self.r.count()

    def gpu(self, i, keys):
        if i == self.lost:
            raise UnsupportedError(f"GPU {i}: GPU is lost")
        return self.r.gpu(i, keys)


def test_lost_gpu_as_the_real_backend_raises_it():
    r = health.check(prof("health: {xids: []}\n"), nvml=LostNvml(ReplayNvml(two_gpu()), 1))
    assert r.status == "degraded" and r.failing_names() == ["gpu_lost"] and "GPU is lost" in r.failing[0].reason


def test_no_nvml_is_healthy_unless_gpus_are_expected():
    nv = ReplayNvml.missing()
    r = health.check(prof("health: {xids: []}\n"), nvml=nv)
    assert r.status == "healthy" and [c.status for c in r.checks] == ["skipped"]
    r = health.check(prof("health: {xids: [], gpus_expected: 1}\n"), nvml=nv)
    assert r.status == "degraded" and r.failing_names() == ["gpu_count"]
    r = health.check(prof("gpu: {persistence: true}\nhealth: {xids: []}\n"), nvml=nv)   # a GPU node by its profile
    assert r.status == "degraded" and r.failing_names() == ["gpu_count"] and "libnvidia-ml" in r.failing[0].reason


def test_families_and_textfile():
    doc = two_gpu()
    doc["gpus"][1]["nvml_raw"]["nvmlDeviceGetRemappedRows"] = [0, 3, 1, 0]
    r = health.check(prof("health: {xids: [79]}\n"), nvml=ReplayNvml(doc), kmsg_events=[])
    fams = health.to_families(r)
    assert [f.name for f in fams] == ["hkgpu_tune_health_status", "hkgpu_tune_health_check"]
    assert fams[0].samples == [({}, 1.0)]
    checks = dict((s[0]["check"], s[1]) for s in fams[1].samples)
    assert checks["remapped_rows"] == 1.0 and checks["ecc_uncorrected"] == 0.0 and checks["xid"] == 0.0
    text = "\n".join(collect.render(fams)) + "\n"
    assert "hkgpu_tune_health_status 1\n" in text and 'hkgpu_tune_health_check{check="remapped_rows"} 1\n' in text
    promtool = shutil.which("promtool")
    if promtool:   # Prometheus's own parser (Debian's prometheus package)
        out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


def test_from_collectors_uses_the_export_runs_readings():
    doc = two_gpu()
    doc["gpus"][0]["nvml_raw"]["nvmlDeviceGetTotalEccErrors"] = {
        "corrected": {"volatile": 0, "aggregate": 0}, "uncorrected": {"volatile": 5, "aggregate": 5}}
    p = prof("health: {gpus_expected: 2}\n")
    src = collect.Sources(nvml=ReplayNvml(doc),
                          kmsg_lines=["4,9,100,-;NVRM: Xid (PCI:0000:18:00): 94, pid=1, name=x, Contained: SM"])
    res = collect.collect(p, ["gpu", "kmsg"], sources=src)
    h = health.from_collectors(p, res)
    assert h.up and h.collector == "health" and h.data["status"] == "degraded"
    assert sorted(h.data["failing"]) == ["ecc_uncorrected:gpu0", "xid"]
    text = collect.to_textfile(res + [h])
    assert 'hkgpu_tune_health_check{check="xid"} 1' in text and "hkgpu_tune_health_status 1" in text
    # a gpu collector that failed: its error, not a crash
    bad = [collect.Result("gpu", False, [], {}, "NVML did not start: GPU is lost", 0.0)]
    h = health.from_collectors(p, bad + [r for r in res if r.collector == "kmsg"])
    assert h.up and "gpu_lost" in h.data["failing"] and "gpu_count" in h.data["failing"]


def test_hook_env_carries_status_and_failing_checks(tmp_path):
    out = tmp_path / "env.json"
    hook = tmp_path / "h.py"
    hook.write_text("import json, os, sys\njson.dump({k: v for k, v in os.environ.items() if k.startswith('HKGPU_HEALTH')},"
                    f" open({str(out)!r}, 'w'))\n")
    import sys
    p = prof(f"health:\n  xids: []\n  on_unhealthy: [{sys.executable}, {hook}]\n")
    doc = two_gpu()
    doc["gpus"][1]["nvml_raw"]["nvmlDeviceGetTemperature"] = 99
    r = health.run(p, state_dir=str(tmp_path / "st"), nvml=ReplayNvml(doc))
    assert r.action["transition"] == "unhealthy"
    env = json.loads(out.read_text())
    assert env["HKGPU_HEALTH_STATUS"] == "degraded" and env["HKGPU_HEALTH_TRANSITION"] == "unhealthy"
    assert env["HKGPU_HEALTH_FAILING"] == "temperature:gpu1"
    [c] = json.loads(env["HKGPU_HEALTH_FAILING_JSON"])
    assert (c["name"], c["value"], c["threshold"]) == ("temperature", 99, 85.0)


def test_export_textfile_carries_health(tmp_path):
    """The export run (verify + collectors) writes the health families from its own readings:
    the replayed 8-GPU host has XID 48 on GPU 4 in its kernel log."""
    import sys
    from prometheus_client.parser import text_string_to_metric_families
    from hkgpu_tune.observe import export as X
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from tests.fixtures.monitor import replay_host as R
    prof, eng, src = R.host(str(tmp_path / "state"))
    rep = X.export(prof, str(tmp_path), engine=eng, sources=src)
    smp = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(open(tmp_path / "hkgpu-tune.prom").read()) for s in fam.samples}
    assert smp[("hkgpu_tune_health_status", ())] == 1
    assert smp[("hkgpu_tune_health_check", (("check", "xid"),))] == 1
    assert smp[("hkgpu_tune_health_check", (("check", "ecc_uncorrected"),))] == 0
    assert smp[("hkgpu_tune_collector_up", (("collector", "health"),))] == 1
    h = next(c for c in rep.collectors if c.collector == "health")
    assert h.data["failing"] == ["xid"] and h.data["gpus"] == 8
