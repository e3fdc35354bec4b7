"""The hkgpu module's own logic and the rack event folding, without a rack (no root needed)."""
import importlib.util
import os

import pytest
import yaml

from simrack import REPO

from hkgpu_tune.fleet.converge import merge_sections
from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.fleet.rack import HostResult, handle_event

MODULE = os.path.join(REPO, "collections", "ansible_collections", "hkgpu", "tune", "plugins", "modules", "hkgpu.py")


def test_sections_merge_into_the_node_profile_and_keep_the_others(tmp_path):
    (tmp_path / "node.yaml").write_text(yaml.safe_dump({"name": "node", "sysctl": {"net.ipv4.tcp_mtu_probing": 1}}))
    net = {"network": {"interfaces": [{"match": {"name": "eth9"}, "mtu": 9000}]}}
    prof, text, old, only = merge_sections(net, str(tmp_path / "node.yaml"))
    doc = yaml.safe_load(text)
    assert doc["sysctl"] == {"net.ipv4.tcp_mtu_probing": 1} and doc["network"] == net["network"]
    assert prof.network.interfaces[0].mtu == 9000 and [s.key for s in prof.sysctl] == ["net.ipv4.tcp_mtu_probing"]
    # the subsystems of the passed section only (firewall and rdma: its read-only facts)
    assert set(only) == {"link", "ethtool", "qdisc", "firewall", "rdma"}


def test_an_empty_section_removes_it(tmp_path):
    (tmp_path / "node.yaml").write_text(yaml.safe_dump({"name": "node", "sysctl": {"net.ipv4.tcp_mtu_probing": 1}}))
    _, text, _, only = merge_sections({"sysctl": {}}, str(tmp_path / "node.yaml"))
    assert "sysctl" not in yaml.safe_load(text) and only == []


def test_a_bad_section_names_file_line_and_key_and_writes_nothing(tmp_path):
    bad = {"network": {"interfaces": [{"match": {"name": "eth9"}, "mtu": 90000}]}}
    with pytest.raises(ProfileError) as e:
        merge_sections(bad, str(tmp_path / "node.yaml"))
    assert f"{tmp_path}/node.yaml:" in str(e.value)
    assert "network.interfaces[0].mtu: expected an integer 68-65535, got 90000" in str(e.value)
    assert "nothing written" in str(e.value) and not (tmp_path / "node.yaml").exists()


def test_the_module_is_a_thin_shell():
    """Argument spec -> converge -> exit_json / fail_json: no merge, plan or file writing of its own."""
    spec = importlib.util.spec_from_file_location("hkgpu_module", MODULE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    funcs = sorted(n for n, v in vars(mod).items() if callable(v) and getattr(v, "__module__", "") == "hkgpu_module")
    assert funcs == ["main", "run"]
    src = open(MODULE).read()
    assert "converge(" in src and "open(" not in src and "os.replace" not in src and "Engine" not in src


def test_events_fold_into_per_host_results():
    hosts = {}
    res = [{"subsystem": "sysctl", "target": "host", "key": "net.ipv4.tcp_fin_timeout", "current": "33",
            "desired": "15", "status": "drift", "reason": "differs", "required": True}]
    handle_event(hosts, {"event": "runner_on_start", "event_data": {"host": "n1", "task": "Verify"}})
    assert hosts["n1"].state == "running" and hosts["n1"].last_task == "Verify"
    handle_event(hosts, {"event": "runner_on_failed", "event_data": {
        "host": "n1", "res": {"msg": "1 setting(s) failed", "results": res, "failures": res}}})
    handle_event(hosts, {"event": "runner_on_ok", "event_data": {"host": "n2", "res": {"changed": False}}})
    handle_event(hosts, {"event": "playbook_on_stats", "event_data": {
        "ok": {"n2": 1}, "failures": {"n1": 1}, "changed": {}, "dark": {}, "skipped": {}}})
    assert hosts["n1"].is_failed and hosts["n1"].failures == res and hosts["n1"].msg == "1 setting(s) failed"
    assert hosts["n2"] == HostResult("n2", ok=1, state="ok")


def test_host_line_names_the_check_that_failed():
    """A verify's drift: the check and each setting; a gate that failed: its message, not the settings
    its rollback left (stopped != running says nothing about why)."""
    from hkgpu_tune.fleet.rack import host_line
    drift = [{"subsystem": "sysctl", "target": "host", "key": "net.ipv4.tcp_fin_timeout", "current": "33",
              "desired": "15", "status": "drift"}]
    left = [{"subsystem": "triton", "target": "hkgpu-triton", "key": "service", "current": "stopped",
             "desired": "running", "status": "drift"}]
    hosts = {}
    handle_event(hosts, {"event": "runner_on_failed", "event_data": {"host": "n1", "res": {
        "msg": "verify: 1 setting(s) failed: ...", "results": drift, "failures": drift, "failed_check": "verify"}}})
    gate = "triton gate failed: resnet50: p99 latency 212.40 ms is over the SLO of 50 ms (rolled back)"
    handle_event(hosts, {"event": "runner_on_failed", "event_data": {"host": "n2", "res": {
        "msg": gate, "results": left, "failures": left}}})
    for r in hosts.values():
        r.failed = 1
    assert host_line(hosts["n1"]).endswith(": verify: sysctl host net.ipv4.tcp_fin_timeout: 33 != 15")
    assert host_line(hosts["n2"]).endswith(": " + gate)
