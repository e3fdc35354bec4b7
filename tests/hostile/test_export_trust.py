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
