"""Pull mode on the simulated rack: each node converges itself from a git repository of the site
(playbooks, roles, inventory) with ansible-pull, as its hkgpu-tune-pull.service runs it.

systemd is not PID 1 here: the test runs the service's ExecStart inside the host's namespace (with
a clean environment, as systemd would) and checks the units with systemd-analyze verify. Node n1 is
the canary, n2 a follower, n3 a follower that is off during the roll-out. Settings are read with
sysctl and ip, and the tags with git, not with the tool.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

import pullsite
import simrack
from pullsite import git, publish, pull, unit

from tests.helpers import missing_tool

pytestmark = [pytest.mark.slow, pytest.mark.root]
N1 = N2 = N3 = ""   # the rack's host names (simrack names them after the rack number it claims)


@pytest.fixture(scope="module")
def site(tmp_path_factory, monkeypatch_module):
    why = missing_tool(("/usr/sbin/sshd", "ssh", "ip", "ethtool", "ansible-playbook", "ansible-pull", "git"))
    if why:
        pytest.skip(why)
    run = str(tmp_path_factory.mktemp("hkpull"))
    monkeypatch_module.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    # a rack of its own (simrack claims a rack number: its names and subnet; other racks are left alone)
    global N1, N2, N3
    inv = simrack.up(3, run=run)
    try:
        N1, N2, N3 = simrack.host_names(3)
        s = pullsite.make(run, inv, canaries=(N1,))
        s["hosts"] = [N1, N2, N3]
        yield s
    finally:
        simrack.down(run, quiet=True)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def sysctl(host, key="net.ipv4.tcp_fin_timeout"):
    return subprocess.run(["ip", "netns", "exec", host, "sysctl", "-n", key], capture_output=True, text=True,
                          check=True).stdout.strip()


def metrics(site, host) -> str:
    return open(os.path.join(site["run"], host, "textfile", "hkgpu-pull.prom")).read()


def passed_tags(site):
    return set(git(site["bare"], "tag", "-l", "passed/*").split())


def test_one_push_installs_the_pull_units_and_they_verify(site):
    r = pullsite.push_converge(site)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    for h in site["hosts"]:
        svc, timer = unit(h, "hkgpu-tune-pull.service"), unit(h, "hkgpu-tune-pull.timer")
        assert ("--canary" in svc) == (h == N1), h
        assert "OnUnitActiveSec=15min" in timer and "RandomizedDelaySec=5min" in timer
        assert os.readlink(f"/etc/netns/{h}/systemd/system/timers.target.wants/hkgpu-tune-pull.timer").endswith(
            "/hkgpu-tune-pull.timer")
    if shutil.which("systemd-analyze"):
        d = f"/etc/netns/{site['hosts'][0]}/systemd/system"
        p = subprocess.run(["systemd-analyze", "verify", "--man=no", "--generators=no", f"{d}/hkgpu-tune-pull.service",
                            f"{d}/hkgpu-tune-pull.timer"], capture_output=True, text=True, timeout=120)
        remarks = [ln for ln in (p.stdout + p.stderr).splitlines() if "hkgpu-tune-pull" in ln]
        assert p.returncode == 0 and not remarks, p.stdout + p.stderr


def test_a_follower_waits_for_the_canary_then_takes_the_passed_version(site):
    v1 = git(site["work"], "rev-parse", "HEAD")
    r = pull(N2)               # nothing has passed yet: nothing converged, said so
    assert r.returncode == 1 and "has passed a canary yet" in r.stderr
    assert 'hkgpu_pull_success{stage="select"} 0' in metrics(site, N2)
    r = pull(N1)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert passed_tags(site) == {f"passed/{v1}"}
    assert git(site["bare"], "cat-file", "-t", f"passed/{v1}") == "tag"      # annotated: who and when
    m = metrics(site, N1)
    assert f'hkgpu_pull_info{{version="{v1}",role="canary"}} 1' in m and 'hkgpu_pull_success{stage="done"} 1' in m
    r = pull(N2)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert f'version="{v1}",role="follower"' in metrics(site, N2)


def test_a_new_version_reaches_the_nodes_without_a_push_canary_first(site):
    before = sysctl(N2)
    v2 = publish(site, fin_timeout=21, message="fin_timeout 21")
    r = pull(N2)               # the canary has not run: the follower stays on v1
    assert r.returncode == 0 and sysctl(N2) == before == "15"
    r = pull(N1)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert sysctl(N1) == "21" and f"passed/{v2}" in passed_tags(site)
    r = pull(N2)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert sysctl(N2) == "21"
    assert f'version="{v2}"' in metrics(site, N2)
    assert sysctl(N3) == "15"  # off during the roll-out


def test_a_version_failing_on_the_canary_reaches_no_other_node(site):
    v2 = git(site["work"], "rev-parse", "HEAD")
    v3 = publish(site, fin_timeout=33, mtu=90000, message="bad mtu")
    r = pull(N1)
    assert r.returncode != 0
    assert "expected an integer 68-65535, got 90000" in r.stdout + r.stderr
    assert f"passed/{v3}" not in passed_tags(site)
    m = metrics(site, N1)
    assert 'hkgpu_pull_success{stage="converge"} 0' in m and f'version="{v3}"' in m
    assert sysctl(N1) == "21"  # the bad profile failed before anything changed
    r = pull(N2)
    assert r.returncode == 0 and sysctl(N2) == "21"
    assert f'version="{v2}"' in metrics(site, N2)


def test_a_node_that_was_off_converges_the_newest_passed_version(site):
    v2 = git(site["work"], "rev-parse", "HEAD~1")
    r = pull(N3)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert sysctl(N3) == "21"
    m = metrics(site, N3)
    assert f'version="{v2}",role="follower"' in m and 'hkgpu_pull_success{stage="done"} 1' in m
