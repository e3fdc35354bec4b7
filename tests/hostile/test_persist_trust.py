"""apply --persist copies a profile into /etc, where root runs its settings and hooks at every
boot: only a profile no other user owns or can write goes there (refused before anything
changes), the default profile goes there whole (never only its name, never a file of that name
in the working directory), --only narrows the files written, and the boot unit names the
installed entry point by absolute path, not whatever is first on PATH."""
import os
import subprocess
import sys

import pytest

from hkgpu_tune.core.profile import default_profile_path, load_chosen, parse_profile_text
from hkgpu_tune.tune import persist as persist_mod
from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.errors import HkError

from ..unit.test_engine import PROFILE, host
from .test_kills import tree

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files of other owners")

HOSTILE = "name: hk-inference\nhealth:\n  on_unhealthy: [/tmp/owned-by-anyone]\nsysctl:\n  net.ipv4.tcp_mtu_probing: 1\n"


def sysctl_in(ns, key):
    return subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-n", key], capture_output=True, text=True,
                          timeout=30, check=True).stdout.strip()


@pytest.mark.parametrize("how", ["owner", "group-writable", "directory"])
def test_a_profile_another_user_controls_is_refused_before_anything_changes(net, tmp_path, how):
    d = tmp_path / "p"
    d.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(d, 0o755)
    prof = d / "mine.yaml"
    prof.write_text("name: t\nsysctl:\n  net.ipv4.tcp_mtu_probing: 2\n")
    os.chmod(prof, 0o644)
    if how == "owner":
        os.chown(prof, NOBODY, -1)
    elif how == "group-writable":
        os.chown(prof, 0, NOBODY)
        os.chmod(prof, 0o664)
    else:
        os.chown(d, NOBODY, -1)     # nobody could swap the file after it was checked
    root = tmp_path / "root"
    root.mkdir()
    before = sysctl_in(net.A, "net.ipv4.tcp_mtu_probing")
    p = net.hk("apply", "--persist", "--root", str(root), "--only", "sysctl", "-p", str(prof),
               state=tmp_path / "st")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1 and "refused" in err
    assert (str(prof) if how != "directory" else str(d)) in err, err
    assert sysctl_in(net.A, "net.ipv4.tcp_mtu_probing") == before
    assert tree(root) == {} or not any(tree(root).values()), tree(root)
    assert not (root / "etc").exists() and not (tmp_path / "st" / "state.json").exists()


def test_the_default_profile_is_persisted_whole_and_never_from_the_working_directory(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "hk-inference.yaml").write_text(HOSTILE)
    os.chown(cwd / "hk-inference.yaml", NOBODY, -1)
    etc = tmp_path / "etc-empty"
    etc.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HKGPU_TUNE_ETC_DIR", str(etc))
    monkeypatch.delenv("HKGPU_TUNE_PROFILE", raising=False)
    prof = load_chosen(None)
    assert prof.source == "default"
    root = tmp_path / "root"
    root.mkdir()
    eng = Engine(prof, only=["sysctl", "link"], state_dir=str(tmp_path / "st"), backends=host())
    persist_mod.persist(eng, str(root))
    written = (root / "etc/hkgpu-tune/profile.yaml").read_text()
    assert written == default_profile_path().read_text()
    assert "owned-by-anyone" not in written
    # what drift monitoring reads back is the whole profile, not a name
    again = parse_profile_text(written, "profile.yaml")
    assert again.sysctl and again.network.interfaces


def test_only_narrows_the_files_written(tmp_path):
    src = tmp_path / "t.yaml"
    src.write_text(PROFILE)
    root = tmp_path / "root"
    root.mkdir()
    eng = Engine(parse_profile_text(PROFILE, str(src)), only=["link"], state_dir=str(tmp_path / "st"),
                 backends=host())
    done = persist_mod.persist(eng, str(root))
    assert not (root / "etc/sysctl.d/60-hkgpu-tune.conf").exists(), done
    assert (root / "etc/hkgpu-tune/profile.yaml").read_text() == PROFILE
    eng = Engine(parse_profile_text(PROFILE, str(src)), only=["sysctl"], state_dir=str(tmp_path / "st"),
                 backends=host())
    persist_mod.persist(eng, str(root))
    assert "net.ipv4.tcp_mtu_probing = 1" in (root / "etc/sysctl.d/60-hkgpu-tune.conf").read_text()


def test_the_boot_unit_names_the_entry_point_by_absolute_path_not_path(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "hkgpu-tune").write_text("#!/bin/sh\ntouch /tmp/pwned\n")
    os.chmod(fake / "hkgpu-tune", 0o755)
    os.chown(fake / "hkgpu-tune", NOBODY, -1)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    src = tmp_path / "t.yaml"
    src.write_text(PROFILE)
    root = tmp_path / "root"
    root.mkdir()
    eng = Engine(parse_profile_text(PROFILE, str(src)), only=["ethtool", "qdisc"], state_dir=str(tmp_path / "st"),
                 backends=host())
    persist_mod.persist(eng, str(root))
    unit = (root / "etc/systemd/system/hkgpu-tune.service").read_text()
    execs = [ln.split("=", 1)[1].lstrip("-") for ln in unit.splitlines() if ln.startswith("Exec")]
    assert len(execs) == 3
    for e in execs:
        prog = e.split()[0]
        assert os.path.isabs(prog) and str(fake) not in prog, e
        assert prog in (os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "hkgpu-tune"),
                        os.path.abspath(sys.executable)), e


def test_an_entry_point_another_user_can_write_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "venv" / "bin"
    d.mkdir(parents=True)
    py = d / "python3"
    os.symlink(sys.executable, py)
    (d / "hkgpu-tune").write_text("#!/bin/sh\n")
    os.chmod(d / "hkgpu-tune", 0o777)
    monkeypatch.setattr(sys, "executable", str(py))
    monkeypatch.setattr(sys, "argv", ["-m"])
    with pytest.raises(HkError, match="writable by other users"):
        persist_mod.entry_point()
