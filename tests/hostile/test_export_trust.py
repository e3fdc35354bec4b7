"""The export writes where node_exporter reads, as root: never through a link to the textfile
directory, never under a directory another user could swap; and its profile_sha256 is the hash
of the profile the run read, wherever it came from (never the shipped default's by name)."""
import hashlib
import os
import subprocess
import sys

import pytest

from prometheus_client.parser import text_string_to_metric_families

NOBODY = 65534
PROFILE = "name: exp-test\nsysctl:\n  net.ipv4.tcp_mtu_probing: 1\n"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files of other owners")


def export(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", "export", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd, env={**os.environ, "PYTHONPATH": os.getcwd()})


@pytest.fixture
def prof(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(PROFILE)
    return str(p)


def test_a_link_to_the_textfile_directory_is_refused(tmp_path, prof):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "tf"
    os.symlink(real, link)
    r = export("--textfile-dir", str(link), "--profile", prof, "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 1 and "symbolic link" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert os.listdir(real) == []


def test_a_textfile_directory_under_a_directory_another_user_owns_is_refused(tmp_path, prof):
    os.chmod(tmp_path, 0o755)
    parent = tmp_path / "theirs"
    parent.mkdir()
    (parent / "tf").mkdir()
    os.chown(parent, NOBODY, -1)
    r = export("--textfile-dir", str(parent / "tf"), "--profile", prof, "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 1 and str(parent) in r.stderr and "refused" in r.stderr, r.stderr
    assert os.listdir(parent / "tf") == []


def test_profile_sha256_is_of_the_profile_read_even_under_the_shipped_name(tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "hk-inference.yaml").write_text(PROFILE)   # the shipped default's file name, other bytes
    tf = tmp_path / "tf"
    tf.mkdir()
    r = export("--textfile-dir", str(tf), "--profile", "./hk-inference.yaml", "--state-dir", str(tmp_path / "st"),
               cwd=cwd)
    assert r.returncode in (0, 2), r.stderr
    fams = text_string_to_metric_families((tf / "hkgpu-tune.prom").read_text())
    info = next(s for f in fams if f.name == "hkgpu_tune_info" for s in f.samples)
    assert info.labels["profile_sha256"] == hashlib.sha256(PROFILE.encode()).hexdigest()


PROMETHEUS_UID = 102   # a system account (1..SYS_UID_MAX), as Debian's prometheus-node-exporter makes it


def debian_layout(tmp_path, parent_uid=PROMETHEUS_UID, dir_uid=0):
    """tmp/prometheus (the account's, 0755) / node-exporter (root's, 0755): Debian's layout."""
    os.chmod(tmp_path, 0o755)
    top = tmp_path / "prometheus"
    tf = top / "node-exporter"
    tf.mkdir(parents=True)
    os.chmod(top, 0o755)
    os.chmod(tf, 0o755)
    os.chown(top, parent_uid, parent_uid)
    os.chown(tf, dir_uid, dir_uid)
    return top, tf


def test_debians_layout_a_system_account_above_a_root_owned_directory_is_written(tmp_path, prof):
    top, tf = debian_layout(tmp_path)
    r = export("--textfile-dir", str(tf), "--profile", prof, "--state-dir", str(tmp_path / "st"))
    assert r.returncode in (0, 2), r.stderr
    st = os.lstat(tf / "hkgpu-tune.prom")
    assert st.st_uid == 0 and oct(st.st_mode & 0o777) == "0o644"
    assert "hkgpu_tune_info" in (tf / "hkgpu-tune.prom").read_text()


def test_the_system_accounts_own_directory_is_refused_as_the_textfile_directory(tmp_path, prof):
    top, tf = debian_layout(tmp_path, dir_uid=PROMETHEUS_UID)
    r = export("--textfile-dir", str(tf), "--profile", prof, "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 1 and f"owned by uid {PROMETHEUS_UID}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert os.listdir(tf) == []


def test_a_login_users_directory_above_is_refused(tmp_path, prof):
    top, tf = debian_layout(tmp_path, parent_uid=1000)
    r = export("--textfile-dir", str(tf), "--profile", prof, "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 1 and str(top) in r.stderr and "refused" in r.stderr, r.stderr
    assert os.listdir(tf) == []


def test_a_link_above_the_textfile_directory_is_refused(tmp_path, prof):
    top, tf = debian_layout(tmp_path)
    os.symlink(top, tmp_path / "via")
    r = export("--textfile-dir", str(tmp_path / "via" / "node-exporter"), "--profile", prof,
               "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 1 and "symbolic link" in r.stderr, r.stderr
    assert os.listdir(tf) == []


def test_the_system_account_swapping_the_directory_cannot_move_roots_write(tmp_path):
    """The write goes through the descriptor opened at the start: once the account renames the
    directory away and puts its own in place, the file still lands in the root-owned directory,
    never in the account's."""
    from hkgpu_tune.core import safedir
    top, tf = debian_layout(tmp_path)
    fd = safedir.open_dir(str(tf), "textfile directory")
    try:
        os.rename(tf, top / "moved")            # what the owner of `top` may do
        (top / "node-exporter").mkdir()
        os.chown(top / "node-exporter", PROMETHEUS_UID, PROMETHEUS_UID)
        safedir.write_at(fd, "hkgpu-tune.prom", "up 1\n", str(tf))
    finally:
        os.close(fd)
    assert os.listdir(top / "node-exporter") == []
    assert (top / "moved" / "hkgpu-tune.prom").read_text() == "up 1\n"
