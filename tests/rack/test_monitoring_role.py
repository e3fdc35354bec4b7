"""The hkgpu_monitoring role on a Prometheus host (this machine, connection local, into a temp dir),
with the example Hong Kong inventory: per-rack targets, the repo's rules, a config promtool passes;
a second run changes nothing; a bad threshold is refused by promtool and the old file stays."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from simrack import REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not shutil.which("ansible-playbook"), reason="needs ansible-playbook (pip install -e .[test])"),
    pytest.mark.skipif(not shutil.which("promtool"), reason="needs promtool (Debian's prometheus package)"),
]
RULES = os.path.join(REPO, "monitoring", "prometheus", "rules")


def play(tmp, *extra):
    inv = tmp / "prom.yml"
    inv.write_text(yaml.safe_dump({"prometheus": {"hosts": {"promhost": {
        "ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}}}}))
    argv = ["ansible-playbook", "-i", os.path.join(REPO, "inventory", "hk"), "-i", str(inv),
            os.path.join(REPO, "playbooks", "monitoring.yml"),
            "-e", "hkgpu_monitoring_install=false", "-e", "hkgpu_monitoring_reload=none",
            "-e", "hkgpu_monitoring_alertmanager_install=false",
            "-e", f"hkgpu_monitoring_alertmanager_config_file={tmp / 'alertmanager.yml'}",
            "-e", f"hkgpu_monitoring_config_file={tmp / 'prometheus.yml'}",
            "-e", f"hkgpu_monitoring_dir={tmp / 'hkgpu'}", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO,
                          env={**os.environ, "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
                               "ANSIBLE_NOCOLOR": "1"})


def recap(out: str) -> dict:
    line = next(x for x in out.splitlines() if x.startswith("promhost") and "ok=" in x)
    return {k: int(v) for k, v in (kv.split("=") for kv in line.split(":", 1)[1].split())}


def inventory_nodes():
    with open(os.path.join(REPO, "inventory", "hk", "hosts.yml")) as f:
        doc = yaml.safe_load(f)
    out = {}
    for site, s in doc["all"]["children"].items():
        for rack, r in s["children"].items():
            for host, hv in r["hosts"].items():
                out[host] = (site, rack, hv["ansible_host"])
    return out


def test_role_renders_checks_and_keeps_a_good_file(tmp_path):
    targets = tmp_path / "hkgpu" / "targets"
    targets.mkdir(parents=True)
    (targets / "node-rack_gone.yml").write_text("[]\n")      # a rack no longer in the inventory

    r = play(tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert not (targets / "node-rack_gone.yml").exists()

    # every inventory node, once per job, in its rack's file with its site, rack and name
    want = inventory_nodes()
    assert len(want) == 11
    for job, port in (("node", 9100), ("triton", 8002)):
        seen = {}
        for f in sorted(targets.glob(f"{job}-*.yml")):
            rack = f.name[len(job) + 1:-4]
            for group in yaml.safe_load(f.read_text()):
                (t,) = group["targets"]
                assert group["labels"]["rack"] == rack
                seen[group["labels"]["node"]] = (group["labels"]["site"], rack, t)
        assert seen == {h: (s, rk, f"{a}:{port}") for h, (s, rk, a) in want.items()}, job

    # the repo's rules, and thresholds equal to the shipped file's
    rules = tmp_path / "hkgpu" / "rules"
    for f in os.listdir(RULES):
        if f != "hkgpu-thresholds.yml":
            assert (rules / f).read_text() == open(os.path.join(RULES, f)).read(), f

    def consts(path):
        with open(path) as fh:
            return {x["record"]: float(x["expr"][len("vector("):-1]) for x in yaml.safe_load(fh)["groups"][0]["rules"]}
    assert consts(rules / "hkgpu-thresholds.yml") == consts(os.path.join(RULES, "hkgpu-thresholds.yml"))
    c = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    assert c.returncode == 0 and "SUCCESS: 5 rule files found" in c.stdout, c.stdout + c.stderr

    # again: nothing changes
    r = play(tmp_path)
    assert r.returncode == 0, r.stdout[-3000:]
    assert recap(r.stdout)["changed"] == 0, r.stdout[-3000:]

    # an SLO that is not a number: promtool refuses the rendered file, the play fails, the old file stays
    before = (rules / "hkgpu-thresholds.yml").read_text()
    r = play(tmp_path, "-e", '{"hkgpu_monitoring_thresholds": {"slo_triton_p99_seconds": "15ms"}}')
    assert r.returncode != 0
    assert "failed to validate" in r.stdout and 'unexpected duration \\"15ms\\"' in r.stdout, r.stdout[-3000:]
    assert (rules / "hkgpu-thresholds.yml").read_text() == before


def test_triton_targets_follow_each_nodes_metrics_address(tmp_path):
    """The scrape target is where the node's Triton binds its metrics (hkgpu_triton_metrics): its
    address (the node's own for a wildcard) and port; a loopback bind is left out, not scraped."""
    extra = tmp_path / "metrics.yml"
    extra.write_text(yaml.safe_dump({"all": {"hosts": {
        "tko-a01-n01": {"hkgpu_triton_metrics": {"port": 9002, "address": "198.18.7.1"}},
        "tko-a01-n02": {"hkgpu_triton_metrics": {"port": 8002, "address": "127.0.0.1"}},
        "tko-a01-n03": {"hkgpu_triton_metrics": {"port": 8012, "address": "0.0.0.0"}}}}}))
    r = play(tmp_path, "-i", str(extra))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    f = tmp_path / "hkgpu" / "targets" / "triton-rack_tko_a01.yml"
    text = f.read_text()
    got = {g["labels"]["node"]: g["targets"][0] for g in yaml.safe_load(text)}
    assert got == {"tko-a01-n01": "198.18.7.1:9002", "tko-a01-n03": "10.41.1.13:8012",
                   "tko-a01-n04": "10.41.1.14:8002"}, got
    assert "tko-a01-n02: Triton's metrics bind 127.0.0.1 (loopback)" in text


def test_triton_targets_one_per_service(tmp_path):
    """A node with several Triton services (hkgpu_triton_services): one target per service, labelled
    with its unit, at that service's metrics port (the node's hkgpu_triton_metrics where it names none);
    a service whose metrics bind loopback is left out with a comment naming it."""
    extra = tmp_path / "metrics.yml"
    extra.write_text(yaml.safe_dump({"all": {"hosts": {
        "tko-a01-n01": {"hkgpu_triton_metrics": {"port": 9002, "address": "0.0.0.0"},
                        "hkgpu_triton_services": [
                            {"unit": "hkgpu-triton-gpu0"},
                            {"unit": "hkgpu-triton-gpu1", "metrics": {"port": 8012, "address": "0.0.0.0"}},
                            {"unit": "hkgpu-triton-gpu2", "metrics": {"port": 8022, "address": "127.0.0.1"}},
                            # its own metrics without an address: the library binds loopback
                            {"unit": "hkgpu-triton-gpu3", "metrics": {"port": 8032}}]}}}}))
    r = play(tmp_path, "-i", str(extra))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    text = (tmp_path / "hkgpu" / "targets" / "triton-rack_tko_a01.yml").read_text()
    got = sorted((g["labels"]["node"], g["labels"].get("service"), g["targets"][0]) for g in yaml.safe_load(text))
    assert got == [("tko-a01-n01", "hkgpu-triton-gpu0", "10.41.1.11:9002"),
                   ("tko-a01-n01", "hkgpu-triton-gpu1", "10.41.1.11:8012"),
                   ("tko-a01-n02", None, "10.41.1.12:8002"), ("tko-a01-n03", None, "10.41.1.13:8002"),
                   ("tko-a01-n04", None, "10.41.1.14:8002")], got
    assert "tko-a01-n01 hkgpu-triton-gpu2: Triton's metrics bind 127.0.0.1 (loopback)" in text
    assert "tko-a01-n01 hkgpu-triton-gpu3: Triton's metrics bind 127.0.0.1 (loopback)" in text


def test_alertmanagers_and_dcgm_targets(tmp_path):
    """prometheus.yml sends alerts to hkgpu_monitoring_alertmanagers (default: the one beside it); the
    dcgm job scrapes dcgm-exporter on exactly the nodes whose host variable says it runs, at their port;
    the role's Alertmanager config is written where asked, amtool-checked, and an operator's own kept."""
    extra = tmp_path / "dcgm.yml"
    extra.write_text(yaml.safe_dump({"all": {"hosts": {
        "tko-a01-n01": {"hkgpu_dcgm_exporter": True},
        "tko-a01-n03": {"hkgpu_dcgm_exporter": True, "hkgpu_dcgm_exporter_port": 9410},
        "tko-a01-n04": {"hkgpu_dcgm_exporter": False},
        "tsw-b01-n02": {"hkgpu_dcgm_exporter": True}}}}))
    r = play(tmp_path, "-i", str(extra), "-e", "hkgpu_monitoring_alertmanager_write_config=true",
             "-e", "hkgpu_monitoring_alertmanager_webhook_url=http://198.18.9.9:5001/hook")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    cfg = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    assert cfg["alerting"]["alertmanagers"] == [{"static_configs": [{"targets": ["127.0.0.1:9093"]}]}]
    assert [j["job_name"] for j in cfg["scrape_configs"]] == ["node", "triton", "dcgm"]
    got = {}
    for f in sorted((tmp_path / "hkgpu" / "targets").glob("dcgm-*.yml")):
        for g in yaml.safe_load(f.read_text()) or []:
            got[g["labels"]["node"]] = (f.name, g["targets"][0], g["labels"]["site"])
    assert got == {"tko-a01-n01": ("dcgm-rack_tko_a01.yml", "10.41.1.11:9400", "hk_tko"),
                   "tko-a01-n03": ("dcgm-rack_tko_a01.yml", "10.41.1.13:9410", "hk_tko"),
                   "tsw-b01-n02": ("dcgm-rack_tsw_b01.yml", "10.42.1.12:9400", "hk_tsuen_wan")}, got
    am = tmp_path / "alertmanager.yml"
    doc = yaml.safe_load(am.read_text())
    assert doc["route"]["receiver"] == "hkgpu"
    assert doc["receivers"] == [{"name": "hkgpu", "webhook_configs": [{"url": "http://198.18.9.9:5001/hook"}]}]
    if shutil.which("amtool"):
        c = subprocess.run(["amtool", "check-config", str(am)], capture_output=True, text=True, timeout=60)
        assert c.returncode == 0, c.stdout + c.stderr

    # an operator's own file is kept unless asked; other Alertmanagers replace the default
    am.write_text("route: {receiver: ops}\nreceivers: [{name: ops}]\n")
    r = play(tmp_path, "-i", str(extra), "-e", '{"hkgpu_monitoring_alertmanagers": ["198.18.9.1:9093", "198.18.9.2:9093"]}')
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert am.read_text() == "route: {receiver: ops}\nreceivers: [{name: ops}]\n"
    cfg = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    assert cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["198.18.9.1:9093", "198.18.9.2:9093"]
    c = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    assert c.returncode == 0, c.stdout + c.stderr

    # no Alertmanager: no alerting section, still a valid config
    r = play(tmp_path, "-e", '{"hkgpu_monitoring_alertmanagers": []}')
    assert r.returncode == 0, r.stdout[-3000:]
    assert "alerting" not in yaml.safe_load((tmp_path / "prometheus.yml").read_text())
