import json
import subprocess
import sys

import pytest


def hk(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.slow
def test_bad_profile_exit_1_one_line_no_traceback(tmp_path):
    f = tmp_path / "hk.yaml"
    f.write_text("network:\n  interfaces:\n    - match: {name: eth0}\n      mtu: 9k\n")
    for cmd in ("verify", "plan", "apply", "facts"):
        p = hk(cmd, "--profile", str(f), "--state-dir", str(tmp_path / "st"))
        assert p.returncode == 1, (cmd, p.stderr)
        assert p.stderr.strip() == f"hkgpu-tune: error: {f}:4: network.interfaces[0].mtu: expected an integer 68-65535, got '9k'"
        assert "Traceback" not in p.stderr and p.stdout == ""
    assert not (tmp_path / "st").exists()  # nothing written
    p = hk("rollback", "--profile", str(f), "--state-dir", str(tmp_path / "st"))
    assert p.returncode == 0 and "rolling back from the state file alone" in p.stderr


def test_verify_json_has_results_and_failures(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("sysctl:\n  kernel.no_such_key_here: 1\n  kernel.ostype: {value: Linux, compare: exact}\n")
    p = hk("verify", "--profile", str(f), "--json")
    doc = json.loads(p.stdout)
    st = {r["key"]: r["status"] for r in doc["results"]}
    assert st == {"kernel.no_such_key_here": "unsupported", "kernel.ostype": "ok"}
    assert [x["key"] for x in doc["failures"]] == ["kernel.no_such_key_here"]
    assert p.returncode == 2


def test_verify_ok_exit_0_and_outputs(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("sysctl:\n  kernel.ostype: Linux\n")
    prom, junit = tmp_path / "m.prom", tmp_path / "j.xml"
    p = hk("verify", "--profile", str(f), "--prometheus", str(prom), "--junit", str(junit))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 ok, 0 drift" in p.stdout
    assert 'key="kernel.ostype",status="ok"} 1' in prom.read_text()
    assert 'name="kernel.ostype"' in junit.read_text()


def test_unknown_only(tmp_path):
    p = hk("verify", "--only", "sysctl,nope")
    assert p.returncode == 1 and "unknown subsystem nope" in p.stderr


def test_rollback_without_state(tmp_path):
    p = hk("rollback", "--state-dir", str(tmp_path))
    assert p.returncode == 0 and "nothing to roll back" in p.stdout


def test_apply_without_permission():
    """The errors a user without root gets, one line each: a state directory root owns is refused,
    and one it cannot create is "permission denied". As root (CI) the command runs as nobody:
    setpriv drops the user, its groups and every capability but reading and searching (so that an
    interpreter root installed under /root can still be run; writing is checked as for anyone)."""
    import os
    import shutil
    import tempfile
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    host, roots = tempfile.mkdtemp(prefix="hkgpu-nobody-"), tempfile.mkdtemp(prefix="hkgpu-rootdir-")
    os.chmod(roots, 0o755)
    try:
        pre = []
        if os.geteuid() == 0:
            if not shutil.which("setpriv"):
                pytest.skip("as root this needs setpriv (util-linux) to run the command as nobody")
            import pwd
            nobody = pwd.getpwnam("nobody")
            os.chown(host, nobody.pw_uid, nobody.pw_gid)
            pre = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
                   "--inh-caps=-all,+dac_read_search", "--ambient-caps=+dac_read_search",
                   "--bounding-set=-all,+dac_read_search"]
        env = {**os.environ, "PYTHONPATH": repo, "HKGPU_TUNE_HOST_DIR": host, "HOME": host}
        uid = pwd.getpwnam("nobody").pw_uid if pre else os.geteuid()
        cases = ((roots, f"{roots}: the state directory belongs to uid {os.stat(roots).st_uid}, not "
                  f"to the user running hkgpu-tune (uid {uid}): refused"),
                 (f"{roots}/sub", f"{roots}/sub: cannot make the state directory: permission denied"))
        if not pre:
            os.chmod(roots, 0o555)         # not root: a directory of one's own, made unwritable
            cases = cases[1:]
        for state, want in cases:
            p = subprocess.run([*pre, sys.executable, "-m", "hkgpu_tune", "apply", "--state-dir", state],
                               capture_output=True, text=True, cwd=host, env=env, timeout=120)
            assert p.returncode == 1 and want in p.stderr, p.stderr
            assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert os.listdir(roots) == []
    finally:
        shutil.rmtree(host, ignore_errors=True)
        shutil.rmtree(roots, ignore_errors=True)
