"""No original is ever lost. A file an admin changed after `apply --persist` is kept by rollback,
and its pre-tool backup with it: the next `apply --persist` never overwrites a backup, and a
rollback that kept a file is not a quiet success (exit 2, a line that says so)."""
import json
import subprocess
import sys

from hkgpu_tune.tune.persist import persist

from .test_persist_safety import setup


def rollback_cli(state, *more):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", "rollback", "--state-dir", str(state), *more],
                          capture_output=True, text=True, timeout=60)


def test_a_kept_file_keeps_its_original_across_the_next_persist(tmp_path):
    root, eng = setup(tmp_path)
    prof = root / "etc/hkgpu-tune/profile.yaml"
    persist(eng, str(root))
    assert prof.read_text() != "name: older\n"
    prof.write_text("name: the admin's edit\n")       # changed after apply --persist

    p = rollback_cli(tmp_path / "st", "--json")
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    line = next(ln for ln in json.loads(p.stdout)["files"] if ln.startswith(f"kept {prof}"))
    backup = line.rsplit(" stays at ", 1)[1]
    assert open(backup).read() == "name: older\n"    # the pre-tool original is still there
    assert prof.read_text() == "name: the admin's edit\n"
    p = rollback_cli(tmp_path / "st")               # as a person reads it
    assert p.returncode == 0 and "nothing to roll back" in p.stdout, p.stdout + p.stderr

    persist(eng, str(root))                          # the next apply --persist
    assert open(backup).read() == "name: older\n", "a backup was overwritten"
    entries = json.load(open(tmp_path / "st/state.json"))["entries"]
    new = next(e for e in entries if e["target"] == str(prof) and e["key"] == "file")
    assert new["original"]["backup"] != backup

    p = rollback_cli(tmp_path / "st")                # back to what was there before this apply
    assert p.returncode == 0, p.stdout + p.stderr
    assert prof.read_text() == "name: the admin's edit\n"
    assert open(backup).read() == "name: older\n"


def test_converge_rolled_back_with_a_kept_file_fails(tmp_path):
    import pytest
    from hkgpu_tune.fleet.converge import ConvergeFailed, converge
    root, eng = setup(tmp_path)
    persist(eng, str(root))
    conf = root / "etc/sysctl.d/60-hkgpu-tune.conf"
    conf.write_text("# the operator's own now\n")
    with pytest.raises(ConvergeFailed, match="kept .*60-hkgpu-tune.conf"):
        converge(None, False, state="rolled_back", state_dir=str(tmp_path / "st"), host_dir=str(tmp_path / "host"))
    assert conf.read_text() == "# the operator's own now\n"


def test_a_kept_file_says_so_to_a_person_and_exits_2(tmp_path):
    root, eng = setup(tmp_path)
    persist(eng, str(root))
    conf = root / "etc/sysctl.d/60-hkgpu-tune.conf"
    conf.write_text("# the operator's own now\n")
    p = rollback_cli(tmp_path / "st")
    assert p.returncode == 2 and "path(s) kept as they are" in p.stderr, p.stdout + p.stderr
    assert "kept" in p.stdout and "Traceback" not in p.stderr
