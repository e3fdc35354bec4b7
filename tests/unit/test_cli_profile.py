"""Which profile a command uses: --profile > $HKGPU_TUNE_PROFILE > node.yaml > profile.yaml > the
shipped hk-inference; each level shown in the table's first line and in the JSON envelope. The
/etc directory is HKGPU_TUNE_ETC_DIR here (the same code path as /etc/hkgpu-tune)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hkgpu_tune.tune import persist
from hkgpu_tune.core.profile import NODE_FILE, PERSIST_FILE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def hk(*args, env=None):
    e = {k: v for k, v in os.environ.items() if k not in ("HKGPU_TUNE_PROFILE", "HKGPU_TUNE_ETC_DIR")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True,
                          env=e, cwd=ROOT, timeout=120)


def prof(path, name):
    path.write_text(f"name: {name}\nsysctl:\n  kernel.ostype: Linux\n")
    os.chmod(path, 0o644)
    return str(path)


@pytest.fixture
def levels(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir(mode=0o755)
    os.chmod(etc, 0o755)
    return {"etc": etc, "env": {"HKGPU_TUNE_ETC_DIR": str(etc)},
            "cli": prof(tmp_path / "cli.yaml", "cli"), "var": prof(tmp_path / "env.yaml", "var")}


def used(p) -> tuple[str, str]:
    assert p.returncode in (0, 2), p.stderr
    doc = json.loads(p.stdout)
    return doc["profile"], doc["profile_source"]


def test_the_paths_are_those_the_roles_and_persist_write():
    roles = open(os.path.join(ROOT, "roles", "hkgpu", "defaults", "main.yml")).read()
    assert f"hkgpu_profile_path: /etc/hkgpu-tune/{NODE_FILE}" in roles
    assert persist.PROFILE_FILE == f"etc/hkgpu-tune/{PERSIST_FILE}"


@pytest.mark.slow
def test_each_level_in_order(levels):
    env, etc = levels["env"], levels["etc"]
    # nothing on the node: the shipped default
    assert used(hk("verify", "--json", "--only", "sysctl", env=env)) == ("hk-inference", "default")
    # apply --persist wrote profile.yaml
    persisted = prof(etc / PERSIST_FILE, "persisted")
    assert used(hk("verify", "--json", env=env)) == (persisted, "persist")
    # the roles wrote node.yaml: it wins over profile.yaml
    node = prof(etc / NODE_FILE, "node")
    assert used(hk("verify", "--json", env=env)) == (node, "node")
    # $HKGPU_TUNE_PROFILE wins over both
    assert used(hk("verify", "--json", env={**env, "HKGPU_TUNE_PROFILE": levels["var"]})) == \
        (levels["var"], "HKGPU_TUNE_PROFILE")
    # a shipped name in the variable
    assert used(hk("verify", "--json", "--only", "sysctl", env={**env, "HKGPU_TUNE_PROFILE": "hk-latency"})) == \
        ("hk-latency", "HKGPU_TUNE_PROFILE")
    # --profile wins over everything
    assert used(hk("verify", "--json", "-p", levels["cli"], env={**env, "HKGPU_TUNE_PROFILE": levels["var"]})) == \
        (levels["cli"], "--profile")


@pytest.mark.parametrize("cmd", [["verify"], ["plan"], ["apply", "--dry-run"], ["facts"]])
def test_table_says_which_profile(levels, cmd):
    node = prof(levels["etc"] / NODE_FILE, "node")
    p = hk(*cmd, env=levels["env"])
    assert p.returncode in (0, 2), p.stderr
    # the first line; in a pipe a long path goes on to the next one (80 columns, wrapped at words)
    # (the wrap point depends on the length of pytest's temporary path, so join before comparing)
    want = f"{cmd[0]}: profile {node} (node profile)"
    lines = p.stdout.splitlines()
    end = next(i for i in range(len(lines)) if len(" ".join(lines[:i + 1])) >= len(want))
    assert " ".join(lines[:end + 1]) == want


def test_empty_variable_is_an_error(levels):
    p = hk("verify", env={**levels["env"], "HKGPU_TUNE_PROFILE": ""})
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr == "hkgpu-tune: error: HKGPU_TUNE_PROFILE is set but empty: unset it or name a profile\n"


def test_dangling_node_link_is_an_error_not_a_fall_through(levels):
    prof(levels["etc"] / PERSIST_FILE, "persisted")
    os.symlink(levels["etc"] / "gone.yaml", levels["etc"] / NODE_FILE)
    p = hk("verify", env=levels["env"])
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr == f"hkgpu-tune: error: {levels['etc'] / NODE_FILE}: no such profile file\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="the ownership check applies when running as root")
@pytest.mark.parametrize("case", ["owner", "file-mode", "group-mode", "dir-mode", "dir-owner"])
def test_root_refuses_a_node_profile_others_control(levels, case):
    etc = levels["etc"]
    node = etc / NODE_FILE
    prof(node, "node")
    if case == "owner":
        os.chown(node, 65534, 0)
        want = f"{node}: refused: the file is owned by uid 65534, not root"
    elif case == "file-mode":
        os.chmod(node, 0o646)
        want = f"{node}: refused: the file is writable by other users (mode 0646"
    elif case == "group-mode":
        os.chown(node, 0, 65534)
        os.chmod(node, 0o664)
        want = f"{node}: refused: the file is writable by other users (mode 0664"
    elif case == "dir-mode":
        os.chmod(etc, 0o777)
        want = f"{etc}: refused: the directory is writable by other users (mode 0777"
    else:
        os.chown(etc, 65534, 65534)
        want = f"{etc}: refused: the directory is owned by uid 65534, not root"
    for cmd in (["verify"], ["verify", "--json"], ["apply", "--dry-run"], ["profiles", "show"]):
        p = hk(*cmd, env=levels["env"])
        assert p.returncode == 1 and p.stdout == "", (cmd, p.stdout)
        lines = p.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"hkgpu-tune: error: {want}"), (cmd, p.stderr)
    # root's own file with group root writable is fine; an explicit --profile is the operator's choice
    if case == "group-mode":
        os.chown(node, 0, 0)
        assert hk("verify", env=levels["env"]).returncode == 0


def test_profiles_list_marks_the_one_in_use(levels):
    env = levels["env"]
    doc = json.loads(hk("profiles", "list", "--json", env=env).stdout)
    assert doc["command"] == "profiles list"
    rows = {r["name"]: r for r in doc["profiles"]}
    assert {"hk-inference", "hk-latency"} <= set(rows)
    assert [n for n, r in rows.items() if r["in_use"]] == ["hk-inference"]
    node = prof(levels["etc"] / NODE_FILE, "node")
    doc = json.loads(hk("profiles", "list", "--json", env=env).stdout)
    rows = {r["name"]: r for r in doc["profiles"]}
    assert [n for n, r in rows.items() if r["in_use"]] == [node] and rows[node]["source"] == "node"
    doc = json.loads(hk("profiles", "list", "--json", env={**env, "HKGPU_TUNE_PROFILE": "hk-latency"}).stdout)
    assert [r["name"] for r in doc["profiles"] if r["in_use"]] == ["hk-latency"]
    table = hk("profiles", "list", env={**env, "COLUMNS": "80"}).stdout
    assert f"* {node}" in table and "  hk-latency" in table


def test_profiles_show(levels):
    p = hk("profiles", "show", "hk-latency")
    shipped = os.path.join(ROOT, "hkgpu_tune", "profiles", "hk-latency.yaml")
    assert p.returncode == 0
    assert p.stdout.splitlines()[0] == f"# hk-latency (--profile): {shipped}"
    assert p.stdout.split("\n", 1)[1] == open(shipped).read()
    doc = json.loads(hk("profiles", "show", "--json", env=levels["env"]).stdout)
    assert (doc["profile"], doc["profile_source"]) == ("hk-inference", "default")
    assert doc["sections"] == ["affinity", "gpu", "network", "sysctl"]
    bad = levels["etc"] / "bad.yaml"
    bad.write_text("sysctl:\n  kernel.ostype: [1, {a: 2}]\n")
    p = hk("profiles", "show", str(bad))
    assert p.returncode == 1 and p.stderr.startswith(f"hkgpu-tune: error: {bad}:2: sysctl.kernel.ostype")
    p = hk("profiles", "show", "hk-nope")
    assert p.returncode == 1 and "no shipped profile of that name" in p.stderr


def test_only_a_subsystem_the_profile_lacks_is_an_error(levels):
    """Was: `verify --only gpu` on a profile without gpu: printed '0 ok, 0 drift' and exited 0."""
    for cmd in (["verify"], ["verify", "--json"], ["plan"], ["apply", "--dry-run"], ["facts"]):
        p = hk(*cmd, "-p", levels["cli"], "--only", "gpu")
        assert p.returncode == 1 and p.stdout == "", (cmd, p.stdout)
        assert p.stderr == (f"hkgpu-tune: error: --only gpu: the profile {levels['cli']} has no gpu: section "
                            "(it has: sysctl)\n"), cmd
    p = hk("verify", "-p", levels["cli"], "--only", "sysctl,link")
    assert p.returncode == 1 and "--only link: the profile" in p.stderr and "no network: section" in p.stderr
    # what the profile has still runs
    assert hk("verify", "-p", levels["cli"], "--only", "sysctl").returncode == 0
