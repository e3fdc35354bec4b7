"""Alerts that cannot fire: where node_exporter or dcgm-exporter runs, `hkgpu-tune export` leaves out
the families they export under their own names (collect/exporters.py DUPLICATES). This walks every
rule and every family the export can drop: each alert that reads one (directly or through recording
rules) must fire from the export's series alone and from the exporter's series alone, in promtool's
unit tests of the shipped rule files; every dcgm-exporter name a rule reads is one of its default
counters."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from hkgpu_tune.observe.collect.exporters import DUPLICATES

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
RULES = os.path.abspath(os.path.join(ROOT, "monitoring", "prometheus", "rules"))
DASHBOARD = os.path.join(ROOT, "monitoring", "grafana", "hkgpu-tune.json")
DEFAULT_COUNTERS = os.path.join(ROOT, "tests", "fixtures", "monitor", "dcgm-default-counters.txt")
PROMTOOL = shutil.which("promtool")
NAME = re.compile(r"\b((?:hkgpu_tune|node|nv|DCGM_FI)_[A-Za-z0-9_]+|hkgpu:[a-z0-9_:]+)")

TARGET = 'site="hk_tko",rack="rack_tko_a01",node="tko-a01-n01"'
NODE = f'job="node",instance="10.41.1.11:9100",{TARGET}'
TRITON = f'job="triton",instance="10.41.1.11:8002",{TARGET}'
# labels as dcgm-exporter writes them (tests/fixtures/monitor/dcgm-exporter-a30-mig.metrics)
DCGM = (f'gpu="0",UUID="GPU-265c9814-6156-355b-e589-ff2064894f16",device="nvidia0",modelName="NVIDIA A30",'
        f'Hostname="tko-a01-n01",job="dcgm",instance="10.41.1.11:9400",{TARGET}')
PENDING = (f'nv_inference_pending_request_count{{model="m",{TRITON}}}', "20x40")

# (alert, source) -> input series that must make the alert fire within 40 minutes; source is
# "export" (hkgpu-tune's textfile, scraped from node_exporter) or the exporter that then owns them
FIRING = {
    ("HkgpuGpuXidCritical", "export"): [(f'hkgpu_tune_xid_events{{gpu="0",xid="79",{NODE}}}', "1x40")],
    ("HkgpuGpuXidCritical", "dcgm_exporter"): [(f"DCGM_FI_DEV_XID_ERRORS{{{DCGM}}}", "79x40")],
    ("HkgpuGpuXid", "export"): [(f'hkgpu_tune_xid_events{{gpu="0",xid="13",{NODE}}}', "2x40")],
    ("HkgpuGpuXid", "dcgm_exporter"): [(f"DCGM_FI_DEV_XID_ERRORS{{{DCGM}}}", "13x40")],
    ("HkgpuGpuRemapFailed", "export"): [(f'hkgpu_tune_gpu_remap_failed{{gpu="0",uuid="GPU-a",{NODE}}}', "1x40")],
    ("HkgpuGpuRemapFailed", "dcgm_exporter"): [(f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{DCGM}}}", "1x40")],
    ("HkgpuTritonUnderBatching", "export"): [
        PENDING, (f'hkgpu_tune_gpu_utilization_ratio{{gpu="0",uuid="GPU-a",{NODE}}}', "0.1x40")],
    ("HkgpuTritonUnderBatching", "dcgm_exporter"): [PENDING, (f"DCGM_FI_DEV_GPU_UTIL{{{DCGM}}}", "10x40")],
    ("HkgpuNicDrops", "export"): [
        (f'hkgpu_tune_nic_dropped_total{{device="ens1f0",direction="rx",{NODE}}}', "0+300x40")],
    ("HkgpuNicDrops", "node_exporter"): [(f'node_network_receive_drop_total{{device="ens1f0",{NODE}}}', "0+300x40")],
    ("HkgpuTcpRetransmits", "export"): [
        (f"hkgpu_tune_tcp_retransmitted_segments_total{{{NODE}}}", "0+100x40"),
        (f"hkgpu_tune_tcp_sent_segments_total{{{NODE}}}", "0+1000x40")],
    ("HkgpuTcpRetransmits", "node_exporter"): [
        (f"node_netstat_Tcp_RetransSegs{{{NODE}}}", "0+100x40"), (f"node_netstat_Tcp_OutSegs{{{NODE}}}", "0+1000x40")],
}


def rule_files():
    return sorted(os.path.join(RULES, f) for f in os.listdir(RULES) if f.endswith(".yml"))


def rules():
    out = []
    for path in rule_files():
        with open(path) as f:
            out += [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
    return out


def expander(rs):
    """names -> every series name they read, through the recording rules rs."""
    recorded = {r["record"]: set(NAME.findall(r["expr"])) for r in rs if "record" in r}

    def expand(names, seen=()):
        out = set()
        for n in names:
            if n in recorded and n not in seen:
                out |= expand(recorded[n], seen + (n,))
            else:
                out.add(n)
        return out
    return expand


def reads(rs) -> dict[str, set]:
    """alert -> every series name it reads, through recording rules."""
    expand = expander(rs)
    return {r["alert"]: expand(NAME.findall(r["expr"])) for r in rs if "alert" in r}


def cases():
    """(alert, exporter, dropped families it reads) for each alert that reads a family the export drops."""
    out = []
    for alert, names in sorted(reads(rules()).items()):
        for exporter, fams in sorted(DUPLICATES.items()):
            if names & fams:
                out.append((alert, exporter, sorted(names & fams)))
    return out


def test_the_walk_finds_the_alerts_on_dropped_series():
    found = {(a, x) for a, x, _ in cases()}
    # the XID alerts are the ones that read only the export's series before
    assert {("HkgpuGpuXidCritical", "dcgm_exporter"), ("HkgpuGpuXid", "dcgm_exporter"),
            ("HkgpuNicDrops", "node_exporter"), ("HkgpuTritonUnderBatching", "dcgm_exporter")} <= found
    missing = [f"{a} reads {fams}, which the export leaves to {x}: no firing case from {x}'s series"
               for a, x, fams in cases() if (a, x) not in FIRING or (a, "export") not in FIRING]
    assert not missing, "\n".join(missing)
    stale = {a for a, _ in FIRING} - {a for a, _ in found}
    assert not stale, f"cases for alerts that read no dropped family: {stale}"


def test_exporter_cases_use_none_of_the_dropped_families():
    for (alert, source), series in FIRING.items():
        names = {s.split("{", 1)[0] for s, _ in series}
        if source == "export":
            assert names & set().union(*DUPLICATES.values()), (alert, names)
        else:
            assert not names & DUPLICATES[source], (alert, source, names & DUPLICATES[source])


def test_rules_read_only_default_dcgm_counters():
    with open(DEFAULT_COUNTERS) as f:
        default = {x.strip() for x in f if x.strip()}
    used = {n for names in reads(rules()).values() for n in names if n.startswith("DCGM_")}
    assert {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_ROW_REMAP_FAILURE"} <= used
    assert used <= default, f"not among dcgm-exporter's default counters: {sorted(used - default)}"


@pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian's prometheus package)")
@pytest.mark.parametrize("alert,exporter", sorted({(a, x) for a, x, _ in cases()}))
def test_alert_fires_from_either_source(tmp_path, alert, exporter):
    tests = []
    for source in ("export", exporter):
        firing = f'count(ALERTS{{alertname="{alert}",alertstate="firing",node="tko-a01-n01"}}) > bool 0'
        tests.append({"interval": "1m", "name": f"{alert} from {source}",
                      "input_series": [{"series": s, "values": v} for s, v in FIRING[(alert, source)]],
                      "promql_expr_test": [{"expr": firing, "eval_time": "35m",
                                            "exp_samples": [{"labels": "{}", "value": 1}]}]})
    # and quiet with nothing at all: the case above is what makes it fire
    tests.append({"interval": "1m", "name": f"{alert} quiet", "input_series": [],
                  "alert_rule_test": [{"eval_time": "35m", "alertname": alert, "exp_alerts": []}]})
    f = tmp_path / "t.yml"
    f.write_text(yaml.safe_dump({"rule_files": rule_files(), "evaluation_interval": "1m", "tests": tests},
                                sort_keys=False))
    p = subprocess.run([PROMTOOL, "test", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


# ---------------------------------------------------------------- the dashboard
EXPORTER_PREFIX = {"node_exporter": "node_", "dcgm_exporter": "DCGM_FI_"}


def panels() -> dict[str, str]:
    """title -> the panel's queries (collapsed rows keep their panels inside)."""
    with open(DASHBOARD) as f:
        d = json.load(f)
    out = {}
    for p in d["panels"]:
        for sub in [p] + p.get("panels", []):
            if sub.get("targets"):
                out[sub["title"]] = " or ".join(t["expr"] for t in sub["targets"])
    return out


def test_every_panel_on_a_dropped_family_reads_the_exporter_too():
    """A panel that reads only the export's series of a family goes blank where the exporter runs."""
    expand = expander(rules())
    blank, checked = [], set()
    for title, expr in panels().items():
        names = expand(set(NAME.findall(expr)))
        for exporter, fams in DUPLICATES.items():
            if names & fams:
                checked.add(title)
                if not any(n.startswith(EXPORTER_PREFIX[exporter]) for n in names):
                    blank.append(f"{title!r} reads {sorted(names & fams)}, which the export leaves to {exporter}")
    assert not blank, "\n".join(blank)
    assert {"XID events", "GPU utilisation", "NIC drops/s"} <= checked, checked


@pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian's prometheus package)")
def test_the_xid_panel_has_a_row_per_gpu_and_xid_from_either_source(tmp_path):
    """The export's count since boot on one node; dcgm-exporter's last XID (the gauge's value, 0:
    none) on another: a row labelled with the XID for each GPU that had one, none for the GPU at 0."""
    expr = panels()["XID events"].replace("$node", ".+")
    n2 = 'site="hk_tko",rack="rack_tko_a01",node="tko-a01-n02"'
    dcgm = 'UUID="GPU-{u}",device="nvidia{g}",modelName="NVIDIA H200",Hostname="tko-a01-n02",' \
           f'job="dcgm",instance="10.41.1.12:9400",{n2}'
    series = [(f'hkgpu_tune_xid_events{{gpu="1",xid="13",{NODE}}}', "2x10"),
              (f'DCGM_FI_DEV_XID_ERRORS{{gpu="0",{dcgm.format(u="a", g=0)}}}', "79x10"),
              (f'DCGM_FI_DEV_XID_ERRORS{{gpu="1",{dcgm.format(u="b", g=1)}}}', "0x10")]
    want = [{"labels": f'hkgpu_tune_xid_events{{gpu="1",xid="13",{NODE}}}', "value": 2},
            {"labels": f'hkgpu:dcgm_xid:last{{gpu="0",xid="79",uuid="GPU-a",{dcgm.format(u="a", g=0)}}}',
             "value": 1}]
    test = {"interval": "1m", "name": "XID panel",
            "input_series": [{"series": s, "values": v} for s, v in series],
            "promql_expr_test": [{"expr": expr, "eval_time": "5m", "exp_samples": want}]}
    f = tmp_path / "t.yml"
    f.write_text(yaml.safe_dump({"rule_files": rule_files(), "evaluation_interval": "1m", "tests": [test]},
                                sort_keys=False))
    p = subprocess.run([PROMTOOL, "test", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout
