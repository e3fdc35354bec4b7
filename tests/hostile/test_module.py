"""The Ansible module run as Ansible runs it (the module file, its arguments in a JSON file), against
hostile node files: a FIFO or a huge file where the node profile should be, a planted link next to a
role file. It must answer with one failure message, never hang, never write through a link."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE = os.path.join(ROOT, "collections", "ansible_collections", "hkgpu", "tune", "plugins", "modules", "hkgpu.py")
TIMEOUT = 30

pytest.importorskip("ansible", reason="the module needs ansible-core")


def module(tmp_path, check=False, **args):
    """Run the module; its JSON answer. A hang is a failure."""
    assert os.path.isfile(MODULE), f"the module is not at {MODULE}"
    a = {"profile_path": str(tmp_path / "node.yaml"), "state_dir": str(tmp_path / "state"), **args,
         "_ansible_check_mode": check}
    f = tmp_path / "args.json"
    f.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": a}))
    env = {**os.environ, "PYTHONPATH": ROOT}
    try:
        p = subprocess.run([sys.executable, MODULE, str(f)], capture_output=True, text=True, timeout=TIMEOUT,
                           env=env, cwd=str(tmp_path))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the module did not answer in {TIMEOUT} s (blocked reading the node profile?)")
    assert "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert p.stdout.strip(), f"the module printed nothing (rc {p.returncode}): {p.stderr}"
    return json.loads(p.stdout)


SYSCTL = {"sysctl": {"kernel.ostype": {"value": "Linux", "compare": "exact"}}}


def test_a_fifo_as_the_node_profile_fails_instead_of_hanging(tmp_path):
    os.mkfifo(tmp_path / "node.yaml")
    out = module(tmp_path, profile=SYSCTL, only=["sysctl"])
    assert out["failed"] and f"{tmp_path}/node.yaml: not a regular file" in out["msg"]
    assert not (tmp_path / "state").exists()


def test_a_huge_node_profile_is_refused(tmp_path):
    (tmp_path / "node.yaml").write_text("name: node\n" + "#" * (3 << 20) + "\n")
    out = module(tmp_path, profile=SYSCTL, only=["sysctl"])
    assert out["failed"] and "larger than 1048576 bytes" in out["msg"]


def test_an_injected_line_in_a_role_variable_is_refused_and_nothing_written(tmp_path):
    before = "name: node\n"
    (tmp_path / "node.yaml").write_text(before)
    bad = {"sysctl": {"kernel.ostype": "Linux\nkernel.core_pattern = |/tmp/x"}}
    out = module(tmp_path, profile=bad, only=["sysctl"])
    assert out["failed"] and "sysctl.kernel.ostype: contains the control character" in out["msg"]
    assert "nothing written" in out["msg"] and (tmp_path / "node.yaml").read_text() == before


def test_role_files_are_never_written_through_a_planted_link(tmp_path):
    """Before, a role file went through `path + '.tmp'` opened with O_CREAT and no O_NOFOLLOW:
    a link planted there made root write the content wherever the link pointed."""
    (tmp_path / "node.yaml").write_text("name: node\n")
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    unit = tmp_path / "hkgpu.service"
    os.symlink(victim, str(unit) + ".tmp")
    out = module(tmp_path, state="verified", only=["sysctl"],
                 files=[{"path": str(unit), "content": "[Unit]\n", "mode": "0644"}])
    assert not out.get("failed"), out
    assert victim.read_text() == "untouched\n" and unit.read_text() == "[Unit]\n"
    assert not unit.is_symlink() and os.stat(unit).st_mode & 0o777 == 0o644


def test_a_role_file_that_is_a_link_is_not_replaced(tmp_path):
    (tmp_path / "node.yaml").write_text("name: node\n")
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    unit = tmp_path / "hkgpu.service"
    unit.symlink_to(victim)
    out = module(tmp_path, state="verified", only=["sysctl"], files=[{"path": str(unit), "content": "[Unit]\n"}])
    assert out["failed"] and "refusing to replace it: it is a link" in out["msg"]
    assert victim.read_text() == "untouched\n" and unit.is_symlink()


def test_a_role_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    (tmp_path / "node.yaml").write_text("name: node\n")
    os.mkfifo(tmp_path / "hkgpu.service")
    out = module(tmp_path, state="verified", only=["sysctl"],
                 files=[{"path": str(tmp_path / "hkgpu.service"), "content": "[Unit]\n"}])
    assert out["failed"] and "it is not a regular file" in out["msg"]


def test_rolled_back_with_only_restores_only_those_and_keeps_the_persisted_files(tmp_path):
    """state: rolled_back narrows to `only` like `hkgpu-tune rollback --only`: the files of
    --persist go only when `persist` is named (or nothing is)."""
    from hkgpu_tune.core.profile import parse_profile_text
    from hkgpu_tune.tune.engine import Engine
    from hkgpu_tune.tune.persist import persist

    from ..unit.test_engine import PROFILE, host
    src = tmp_path / "t.yaml"
    src.write_text(PROFILE)
    root = tmp_path / "root"
    root.mkdir()
    persist(Engine(parse_profile_text(PROFILE, str(src)), only=["sysctl"], state_dir=str(tmp_path / "state"),
                   backends=host()), str(root))
    conf = root / "etc/sysctl.d/60-hkgpu-tune.conf"
    assert conf.exists()
    out = module(tmp_path, check=True, state="rolled_back", only=["sysctl"])
    assert out.get("changed") is False and out["restored"] == [], out
    out = module(tmp_path, state="rolled_back", only=["sysctl"])
    assert not out.get("failed") and out["files"] == [] and conf.exists(), out
    out = module(tmp_path, state="rolled_back", only=["persist"])
    assert not out.get("failed") and not conf.exists(), out


def test_host_dir_names_the_host_lock_the_module_takes(tmp_path):
    """host_dir (simulated hosts on one kernel) is the lock the module takes; without it, the host's."""
    other = tmp_path / "other-host"
    (tmp_path / "state").mkdir(mode=0o700)
    code = ("import sys, time\nfrom hkgpu_tune.tune.state import State\n"
            "with State(sys.argv[1], sys.argv[2]).lock():\n    print('held', flush=True); time.sleep(30)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "held"), str(other)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        out = module(tmp_path, state="rolled_back", host_dir=str(other))
        assert out.get("failed") and f"holds the lock (pid {holder.pid}) with the state directory {tmp_path / 'held'}" \
            in out["msg"], out
        out = module(tmp_path, state="rolled_back")      # the test's own host directory: free
        assert not out.get("failed"), out
    finally:
        holder.kill()
        holder.wait()
