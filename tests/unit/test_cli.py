import json
import subprocess
import sys

import pytest


def hk(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True, cwd=cwd)


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


@pytest.mark.skipif(__import__("os").geteuid() == 0, reason="checks the error a non-root user gets")
def test_apply_without_permission(tmp_path):
    p = hk("apply", "--state-dir", "/var/lib/hkgpu-tune")
    assert p.returncode == 1 and "permission denied" in p.stderr
