"""The hkgpu_pull role's script writes its metrics (hkgpu-pull.prom) as root into the node_exporter
textfile directory, which may sit under a directory a system account owns. Another user must never
steer that write: a textfile directory they own (they could swap the temporary file for a link
before root set its mode by path), or one reached through a link they planted, is refused, nothing
is written, and the run says so in one line (no traceback), its exit status that of the converge."""
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "roles", "hkgpu_pull", "templates", "hkgpu-tune-pull.py.j2")
NOBODY = 65534   # not a system account (uid above SYS_UID_MAX)

pytestmark = pytest.mark.root


def load():
    loader = importlib.machinery.SourceFileLoader("hkgpu_tune_pull", SCRIPT)
    spec = importlib.util.spec_from_loader("hkgpu_tune_pull", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def metrics(d):
    a = types.SimpleNamespace(textfile_dir=str(d), canary=False)
    load().metrics(a, 0, "abc123", True, "done", 0.0)


def test_metrics_land_in_a_root_directory(tmp_path):
    d = tmp_path / "textfile"
    d.mkdir(mode=0o755)
    metrics(d)
    f = d / "hkgpu-pull.prom"
    assert 'hkgpu_pull_success{stage="done"} 1' in f.read_text()
    assert os.stat(f).st_mode & 0o777 == 0o644 and os.listdir(d) == ["hkgpu-pull.prom"]


def test_a_textfile_directory_another_user_owns_is_refused(tmp_path):
    d = tmp_path / "textfile"
    d.mkdir(mode=0o755)
    os.chown(d, NOBODY, NOBODY)
    with pytest.raises(Exception, match="owned by uid 65534"):
        metrics(d)
    assert os.listdir(d) == []


def test_a_textfile_directory_behind_a_planted_link_is_refused(tmp_path):
    """The other user owns the directory above and points `node-exporter` at a root directory."""
    victim = tmp_path / "etc-like"
    victim.mkdir(mode=0o755)
    theirs = tmp_path / "prometheus"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    os.symlink(victim, theirs / "node-exporter")
    with pytest.raises(Exception, match="refused"):
        metrics(theirs / "node-exporter")
    assert os.listdir(victim) == []


def test_a_refused_metrics_write_is_one_line_and_keeps_the_exit_status(tmp_path):
    d = tmp_path / "textfile"
    d.mkdir(mode=0o755)
    os.chown(d, NOBODY, NOBODY)
    argv = [sys.executable, SCRIPT, "--repo", str(tmp_path / "no-repo"), "--branch", "main", "--name", "n1",
            "--playbook", "site.yml", "--inventory", "hosts.yml", "--dir", str(tmp_path / "pull"),
            "--textfile-dir", str(d), "--ansible-pull", "/bin/false"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "hkgpu-tune-pull: metrics: " in p.stderr and "owned by uid 65534" in p.stderr, p.stderr
    assert "FAILED at fetch" in p.stdout and os.listdir(d) == []


def test_a_half_made_refs_repository_does_not_stop_every_later_pull(tmp_path):
    """A first run killed while `git init` made pull/refs.git (an empty directory left): every
    later run failed its fetch and the node never pulled again. The next run completes it."""
    src = tmp_path / "site"
    src.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "main", str(src)], check=True, timeout=30)
    subprocess.run([*git, "-C", str(src), "commit", "-q", "--allow-empty", "-m", "site"], check=True, timeout=30)
    (tmp_path / "pull" / "refs.git").mkdir(parents=True)   # what the killed run left
    d = tmp_path / "textfile"
    d.mkdir(mode=0o755)
    argv = [sys.executable, SCRIPT, "--repo", str(src), "--branch", "main", "--name", "n1", "--canary",
            "--playbook", "site.yml", "--inventory", "hosts.yml", "--dir", str(tmp_path / "pull"),
            "--textfile-dir", str(d), "--ansible-pull", "/bin/true"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 0 and "converged" in p.stdout, p.stdout + p.stderr
    assert 'hkgpu_pull_success{stage="done"} 1' in (d / "hkgpu-pull.prom").read_text()
