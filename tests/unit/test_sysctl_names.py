"""A misspelt sysctl name is a profile error at its line with the name it was meant to be (exit 1,
one line on stderr, nothing written); a real name this kernel lacks stays `unsupported` (exit 2)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.core.sysctl_names import known, misspelt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def hk(*args):
    env = {k: v for k, v in os.environ.items() if k != "HKGPU_TUNE_PROFILE"}
    env.update({"HKGPU_TUNE_ETC_DIR": "/nonexistent-hkgpu-etc", "PYTHONPATH": ROOT})
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("typo, meant", [
    ("net.core.rmem_mx", "net.core.rmem_max"),
    ("net.ipv4.tcp_rmen", "net.ipv4.tcp_rmem"),
    ("vm.swapines", "vm.swappiness"),
    ("net.ipv4.conf.ens1f0np0.rp_filtr", "net.ipv4.conf.ens1f0np0.rp_filter"),
])
def test_a_misspelt_name_is_a_profile_error_at_its_line(tmp_path, typo, meant):
    with pytest.raises(ProfileError) as e:
        parse_profile_text(f"name: t\nsysctl:\n  net.core.somaxconn: 4096\n  {typo}: 1\n", "p.yaml")
    assert str(e.value) == f"p.yaml:4: sysctl.{typo}: no such sysctl {typo}; did you mean {meant}?"


@pytest.mark.parametrize("name", [
    "net.ipv4.tcp_tw_recycle",            # removed in Linux 4.12: a kernel lacks it, no typo
    "net.ipv4.conf.hk9.rp_filter",        # an interface this host does not have
    "net.netfilter.nf_conntrack_max",     # a module's setting
    "kernel.hkgpu_made_up_setting_name",  # far from every name: left to the host
])
def test_names_that_are_not_typos_parse(name):
    assert misspelt(name) is None
    assert parse_profile_text(f"name: t\nsysctl:\n  {name}: 1\n", "p.yaml").sysctl[0].key == name


def test_the_list_is_shipped_with_the_package():
    assert {"net.core.rmem_max", "net.ipv4.tcp_rmem", "net.ipv4.conf.default.rp_filter"} <= known()
    assert not [n for n in known() if ".conf.eth0." in n]   # interface names as "default" only


def test_cli_exit_1_one_line_nothing_written(tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text("name: t\nsysctl:\n  net.core.rmem_max: 212992\n  net.core.rmem_mx: 1\n")
    st = tmp_path / "state"
    for cmd in ("verify", "plan", "apply"):
        p = hk(cmd, "-p", str(prof), "--state-dir", str(st))
        assert p.returncode == 1 and p.stdout == "", (cmd, p.stdout)
        assert p.stderr == (f"hkgpu-tune: error: {prof}:4: sysctl.net.core.rmem_mx: no such sysctl "
                            "net.core.rmem_mx; did you mean net.core.rmem_max?\n"), p.stderr
    assert not st.exists()


def test_a_name_this_kernel_lacks_stays_unsupported(tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text("name: t\nsysctl:\n  net.ipv4.tcp_tw_recycle: 0\n")
    assert not os.path.exists("/proc/sys/net/ipv4/tcp_tw_recycle")
    p = hk("verify", "-p", str(prof), "--state-dir", str(tmp_path / "st"), "--json")
    assert p.returncode == 2, p.stderr
    r = json.loads(p.stdout)["results"][0]
    assert (r["key"], r["status"]) == ("net.ipv4.tcp_tw_recycle", "unsupported") and "no such sysctl" in r["reason"]
