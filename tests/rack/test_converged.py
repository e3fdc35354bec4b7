"""The fast path of a re-run (role hkgpu's converged.yml, first in site.yml) on the simulated rack.

A converged node costs one light check and is left alone; anything the roles would change must
still run them: drift of a setting, an edited or deleted role-owned file, a changed profile, a
changed variable, new code (the collection in the site tree), --tags, and check mode tells the
truth. The playbooks run from a copy of the tree (tests/rack/pullsite.py) so a test can change
its code. Settings and files are read with sysctl, ip and cat, not with the tool.
"""
from __future__ import annotations

import os
import subprocess

import pytest

import pullsite
import simrack

from hkgpu_tune.fleet.rack import run_playbook
from tests.helpers import missing_tool

pytestmark = [pytest.mark.slow, pytest.mark.root]
CHECK = "Compare the node's converge stamp, its files and its verify"
APPLY = "Apply the network and kernel settings"
KEY = "net.ipv4.tcp_fin_timeout"
TIMER_LINK = "/etc/systemd/system/timers.target.wants/hkgpu-tune-verify.timer"


@pytest.fixture(scope="module")
def site(tmp_path_factory, monkeypatch_module):
    why = missing_tool(("/usr/sbin/sshd", "ssh", "ip", "ethtool", "ansible-playbook", "git"))
    if why:
        pytest.skip(why)
    run = str(tmp_path_factory.mktemp("hkconv"))
    monkeypatch_module.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    inv = simrack.up(2, run=run)
    try:
        names = simrack.host_names(2)
        s = pullsite.make(run, inv, canaries=names[:1])
        s["hosts"] = names
        # run_playbook takes ansible.cfg, the playbooks and the collection from the site's copy
        monkeypatch_module.setenv("HKGPU_TUNE_ANSIBLE_DIR", s["work"])
        first = converge(s)
        assert first.rc == 0, {h: r.msg for h, r in first.hosts.items()}
        yield s
    finally:
        simrack.down(run, quiet=True)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def converge(site, ran=None, extra=None, **kw):
    """site.yml on the rack; ran (a dict) gets host -> the names of the tasks that ran there."""
    def event(ev):
        d = ev.get("event_data") or {}
        if ran is not None and ev.get("event") in ("runner_on_ok", "runner_on_failed") and d.get("host"):
            ran.setdefault(d["host"], []).append(d.get("task"))
    return run_playbook("apply", site["inventory"], skip_tags=",".join(pullsite.SKIP_TAGS), on_event=event,
                        extravars=extra or {}, timeout=900, **kw)


def sysctl(host, key=KEY):
    return simrack.nsexec(host, "sysctl", "-n", key).stdout.strip()


def host_vars(site, host, text):
    path = os.path.join(os.path.dirname(site["inventory"]), "host_vars", f"{host}.yml")
    old = open(path).read() if os.path.exists(path) else ""
    with open(path, "w") as f:
        f.write(old + text)
    return path, old


def test_a_converged_rack_runs_one_check_per_node(site):
    ran = {}
    run = converge(site, ran)
    assert run.rc == 0 and {h: r.changed for h, r in run.hosts.items()} == {h: 0 for h in site["hosts"]}
    for h in site["hosts"]:
        roles = [t for t in ran[h] if not t.startswith("Fingerprint")]
        assert roles == [CHECK], (h, ran[h])
    # and the node is as the profile says, read with its own tools
    assert sysctl(site["hosts"][1]) == "15"
    assert "mtu 9000" in simrack.nsexec(site["hosts"][1], "ip", "-o", "link", "show", "eth0").stdout


def test_drift_of_a_setting_runs_the_roles_on_that_node_only(site):
    a, b = site["hosts"]
    simrack.nsexec(b, "sysctl", "-qw", f"{KEY}=33")
    ran = {}
    run = converge(site, ran)
    assert run.rc == 0, {h: r.msg for h, r in run.hosts.items()}
    assert APPLY in ran[b] and APPLY not in ran[a], ran
    assert run.hosts[b].changed >= 1 and run.hosts[a].changed == 0
    assert sysctl(b) == "15"
    ran = {}
    converge(site, ran)
    assert APPLY not in ran[b], ran[b]          # converged again: the record was written


def test_check_mode_reports_drift_and_writes_nothing(site):
    a, b = site["hosts"]
    simrack.nsexec(a, "sysctl", "-qw", f"{KEY}=34")
    try:
        run = converge(site, check=True)
        assert run.rc == 0, {h: r.msg for h, r in run.hosts.items()}
        assert run.hosts[a].changed >= 1 and run.hosts[b].changed == 0
        assert any(KEY in d["diff"] for d in run.hosts[a].diffs), run.hosts[a].diffs
        assert sysctl(a) == "34"
    finally:
        converge(site)
    assert sysctl(a) == "15"


def test_a_deleted_role_file_runs_the_roles(site):
    a = site["hosts"][0]
    simrack.nsexec(a, "rm", TIMER_LINK)
    ran = {}
    run = converge(site, ran)
    assert run.rc == 0 and run.hosts[a].changed >= 1, ran[a]
    assert "hkgpu-tune-verify.timer" in simrack.nsexec(a, "readlink", TIMER_LINK).stdout


def test_a_hand_edited_node_profile_runs_the_roles(site):
    """A setting added to the node profile by hand still verifies (it is applied nowhere yet but
    verify reads the file): the profile's checksum catches it and the roles write it back."""
    b = site["hosts"][1]
    prof = simrack.nsexec(b, "cat", "/etc/hkgpu-tune/node.yaml").stdout
    simrack.nsexec(b, "sh", "-c", "printf '# edited by hand\\n' >> /etc/hkgpu-tune/node.yaml")
    ran = {}
    run = converge(site, ran)
    assert run.rc == 0 and APPLY in ran[b], ran[b]
    assert simrack.nsexec(b, "cat", "/etc/hkgpu-tune/node.yaml").stdout == prof


def test_a_changed_profile_value_is_applied(site):
    b = site["hosts"][1]
    path, old = host_vars(site, b, "hkgpu_network_sysctl: {net.ipv4.tcp_fin_timeout: 16}\n")
    try:
        ran = {}
        run = converge(site, ran)
        assert run.rc == 0 and APPLY in ran[b] and run.hosts[b].changed >= 1, (ran, run.hosts[b].msg)
        assert sysctl(b) == "16"
    finally:
        with open(path, "w") as f:
            f.write(old)
        os.path.getsize(path) or os.unlink(path)
    run = converge(site)
    assert run.rc == 0 and sysctl(b) == "15"


def test_a_changed_variable_outside_the_profile_is_applied(site):
    """hkgpu_verify_interval is no profile setting: it goes into the verify timer."""
    a = site["hosts"][0]
    timer = "/etc/systemd/system/hkgpu-tune-verify.timer"
    run = converge(site, extra={"hkgpu_verify_interval": "7min"})
    assert run.rc == 0 and run.hosts[a].changed >= 1
    assert "OnUnitActiveSec=7min" in simrack.nsexec(a, "cat", timer).stdout
    run = converge(site)
    assert run.rc == 0 and "OnUnitActiveSec=7min" not in simrack.nsexec(a, "cat", timer).stdout


def test_new_code_runs_the_roles(site):
    """A new version of the collection (here one task's name) runs every role on every node."""
    tasks = os.path.join(site["work"], "roles", "hkgpu_network", "tasks", "main.yml")
    text = open(tasks).read()
    with open(tasks, "w") as f:
        f.write(text.replace(f"- name: {APPLY}", f"- name: {APPLY} (v2)"))
    try:
        ran = {}
        run = converge(site, ran)
        assert run.rc == 0
        for h in site["hosts"]:
            assert f"{APPLY} (v2)" in ran[h], ran[h]
    finally:
        with open(tasks, "w") as f:
            f.write(text)


def test_force_runs_every_role_and_tags_never_take_the_fast_path_of_a_full_run(site):
    ran = {}
    run = converge(site, ran, extra={"hkgpu_force_converge": True})
    assert run.rc == 0 and all(APPLY in ran[h] and CHECK not in ran[h] for h in site["hosts"]), ran
    assert {h: r.changed for h, r in run.hosts.items()} == {h: 0 for h in site["hosts"]}
    # a run limited by tags records its own stamp: the next full run converges in full once
    b = site["hosts"][1]
    simrack.nsexec(b, "ethtool", "-K", "eth0", "gro", "off")
    run = converge(site, tags="ethtool")
    assert run.rc == 0 and run.hosts[b].changed == 1
    ran = {}
    converge(site, ran)
    assert APPLY in ran[b], ran[b]
    ran = {}
    converge(site, ran)
    assert APPLY not in ran[b], ran[b]
    assert "generic-receive-offload: on" in subprocess.run(
        ["ip", "netns", "exec", b, "ethtool", "-k", "eth0"], capture_output=True, text=True).stdout
