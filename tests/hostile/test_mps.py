"""MPS directories as an adversary sets them up: outside the allowed places, planted in advance by
another user, a link to somewhere else, open to everyone. The tool never chowns what it did not make."""
import os
import subprocess
import sys

import pytest

from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.profile import parse_profile_text
from tests.gpu_unit.conftest import FakeMps, backends

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: directories owned by another user")


def engine(tmp_path, mps=None):
    text = f"mps:\n  pipe_dir: {tmp_path}/pipe\n  log_dir: {tmp_path}/log\n  user: root\n"
    mps = mps or FakeMps(running=False)
    return Engine(parse_profile_text(text, "test.yaml"), only=["mps"], state_dir=str(tmp_path / "state"),
                  backends=backends(None, mps=mps)), mps


def owner_mode(path):
    st = os.lstat(path)
    return st.st_uid, st.st_mode & 0o7777


def by_key(results):
    return {r.key: r for r in results}


@pytest.mark.parametrize("where", ["/etc/nvidia-mps", "/", "/run", "/root/mps", "/usr/lib/x", "/tmp/../etc/x",
                                   "/run//mps", "/run/mps/"])
def test_directories_outside_the_allowed_places_are_refused_by_the_cli(tmp_path, where):
    f = tmp_path / "p.yaml"
    f.write_text(f"mps:\n  enabled: true\n  pipe_dir: '{where}'\n")
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "plan", "--profile", str(f), "--state-dir",
                        str(tmp_path / "state")], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "Traceback" not in p.stderr and p.returncode == 1, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and f"{f}:3: mps.pipe_dir:" in p.stderr, p.stderr
    assert not (tmp_path / "state").exists()


def test_a_planted_directory_of_another_user_is_not_taken_over(tmp_path):
    """Another user made the pipe directory first: before, apply chowned it to the MPS user and
    started the daemon with its pipes in a directory that user still controls."""
    (tmp_path / "pipe").mkdir(mode=0o755)
    os.chown(tmp_path / "pipe", NOBODY, NOBODY)
    eng, mps = engine(tmp_path)
    r = by_key(eng.verify())["pipe_dir"]
    assert r.status == "error" and r.write is None and "not taken over" in r.reason
    rep = eng.apply()
    assert owner_mode(tmp_path / "pipe") == (NOBODY, 0o755)
    assert mps.starts == [] and rep.error, "no daemon on a directory it does not own"


def test_a_link_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    os.chown(target, NOBODY, NOBODY)
    (tmp_path / "pipe").symlink_to(target)
    eng, mps = engine(tmp_path)
    assert by_key(eng.verify())["pipe_dir"].status == "error"
    eng.apply()
    assert owner_mode(target) == (NOBODY, 0o700) and os.path.islink(tmp_path / "pipe")
    assert mps.starts == []


def test_a_directory_open_to_everyone_is_refused(tmp_path):
    (tmp_path / "pipe").mkdir()
    os.chmod(tmp_path / "pipe", 0o777)
    eng, mps = engine(tmp_path)
    assert by_key(eng.verify())["pipe_dir"].status == "error"
    eng.apply()
    assert owner_mode(tmp_path / "pipe") == (0, 0o777) and mps.starts == []


def test_a_parent_writable_by_others_is_refused(tmp_path):
    """ensure_dir walks from the allowed root: a parent anyone can write could swap the directory."""
    from hkgpu_tune.backends.mps import ensure_dir
    from hkgpu_tune.core.errors import ApplyError
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(ApplyError, match="writable by others: refused as a parent"):
        ensure_dir(f"{tmp_path}/open/pipe", 0o755, "root")
    assert not (tmp_path / "open" / "pipe").exists()


def test_made_by_the_tool_is_made_and_given_to_the_user_and_a_mode_fix_is_undone(tmp_path):
    (tmp_path / "log").mkdir(mode=0o700)     # ours already (root), only its mode differs
    eng, mps = engine(tmp_path)
    rep = eng.apply()
    assert not rep.error, rep.error
    assert owner_mode(tmp_path / "pipe") == (0, 0o755) and owner_mode(tmp_path / "log") == (0, 0o750)
    assert mps.starts and mps.running
    _, errs = eng.rollback()
    assert not errs
    assert owner_mode(tmp_path / "log") == (0, 0o700)    # the old mode back; the made pipe dir stays
    assert (tmp_path / "pipe").is_dir()


def test_pipe_and_log_dir_must_differ():
    with pytest.raises(ProfileError, match="test.yaml:3: mps.log_dir: pipe_dir /run/m and log_dir /run/m must be separate"):
        parse_profile_text("mps:\n  pipe_dir: /run/m\n  log_dir: /run/m\n", "test.yaml")
