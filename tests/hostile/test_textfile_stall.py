"""No other user can stall the export: a blocking flock on the textfile directory (any user who
can read it can take one) must not hang `export`, `verify --prometheus`, the verify timer or the
boot unit; and the boot unit cannot hold the boot for ever."""
import os
import subprocess
import sys
import time

import pytest

from hkgpu_tune.tune import persist

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOBODY = 65534
PROFILE = "name: stall-test\nsysctl:\n  net.ipv4.tcp_mtu_probing: 1\n"
HOLD = ("import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"   # read access is all it takes
        "os.setgid(65534); os.setuid(65534)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(300)\n")


@pytest.fixture
def held_dir(tmp_path):
    tf = tmp_path / "tf"
    tf.mkdir()
    os.chmod(tf, 0o755)
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(tf)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        yield tf
    finally:
        p.kill()
        p.wait()


def run(*args, tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text(PROFILE)
    env = {**os.environ, "PYTHONPATH": REPO, "HKGPU_TUNE_HOST_DIR": str(tmp_path / "host")}
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "hkgpu_tune", *args, "--profile", str(prof),
                        "--state-dir", str(tmp_path / "st")], capture_output=True, text=True, timeout=25, env=env)
    return r, time.monotonic() - t


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the lock holder drops to nobody")
def test_a_flock_on_the_textfile_directory_does_not_hang_export(held_dir, tmp_path):
    r, took = run("export", "--textfile-dir", str(held_dir), tmp_path=tmp_path)
    assert r.returncode in (0, 2), r.stderr
    assert (held_dir / "hkgpu-tune.prom").exists() and took < 20


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the lock holder drops to nobody")
def test_a_flock_on_the_directory_does_not_hang_verify_prometheus(held_dir, tmp_path):
    r, took = run("verify", "--prometheus", str(held_dir / "v.prom"), tmp_path=tmp_path)
    assert r.returncode in (0, 2), r.stderr
    assert (held_dir / "v.prom").exists() and took < 20


def test_the_textfile_lock_is_in_the_host_directory_no_other_user_can_open(tmp_path, monkeypatch):
    from hkgpu_tune.observe import export
    monkeypatch.setenv("HKGPU_TUNE_HOST_DIR", str(tmp_path / "host"))
    with export.one_writer():
        lock = tmp_path / "host" / export.LOCK_FILE
        assert lock.is_file()
        st = os.stat(tmp_path / "host")
        assert st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0


def test_a_second_writer_of_ours_waits_a_bounded_time_then_says_so(tmp_path, monkeypatch):
    from hkgpu_tune.core.errors import HkError
    from hkgpu_tune.observe import export
    monkeypatch.setenv("HKGPU_TUNE_HOST_DIR", str(tmp_path / "host"))
    monkeypatch.setattr(export, "LOCK_WAIT", 0.5)
    code = ("import os, time; os.environ['HKGPU_TUNE_HOST_DIR'] = %r\n"
            "from hkgpu_tune.observe import export\n"
            "with export.one_writer():\n    print('in', flush=True); time.sleep(30)\n" % str(tmp_path / "host"))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": REPO})
    try:
        assert p.stdout.readline().strip() == "in"
        t = time.monotonic()
        with pytest.raises(HkError, match=f"pid {p.pid}.*nothing written"):
            with export.one_writer():
                pass
        assert time.monotonic() - t < 5
    finally:
        p.kill()
        p.wait()


def test_the_boot_unit_has_a_start_timeout():
    """Type=oneshot has no start timeout unless one is set: a stalled start would hold the boot."""
    u = persist.boot_unit("/usr/bin/hkgpu-tune", ["link"])
    assert "Type=oneshot" in u
    vals = [ln.split("=", 1)[1] for ln in u.splitlines() if ln.startswith("TimeoutStartSec=")]
    assert vals and vals[0] not in ("0", "infinity")
