"""The Ansible collection hkgpu.tune: scripts/build-collection.sh makes a tarball that installs with
`ansible-galaxy collection install FILE -p DIR` (no Galaxy), ansible-doc shows the module with its
requirements, author and attributes, and the installed collection's playbooks converge, verify
and roll back a simulated host over real SSH (no source tree on any path)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib

import pytest
import yaml

import simrack
from tests.helpers import REPO, missing_tool

pytestmark = pytest.mark.skipif(bool(missing_tool(("ansible-galaxy", "ansible-doc", "ansible-playbook"))),
                                reason="needs ansible-core (pip install -e .[test])")
GALAXY_YML = os.path.join(REPO, "collections", "ansible_collections", "hkgpu", "tune", "galaxy.yml")


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    out = tmp_path_factory.mktemp("collection")
    r = subprocess.run([os.path.join(REPO, "scripts", "build-collection.sh"), str(out)], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr[-3000:]
    path = r.stdout.strip().splitlines()[-1]
    assert os.path.dirname(path) == str(out) and os.path.exists(path), r.stdout
    return path


@pytest.fixture(scope="module")
def installed(tarball, tmp_path_factory):
    """The tarball installed into a collections path of its own, and an ansible.cfg naming only it."""
    d = tmp_path_factory.mktemp("collections")
    r = subprocess.run(["ansible-galaxy", "collection", "install", tarball, "-p", str(d)], capture_output=True,
                       text=True, timeout=120, cwd=d, env={k: v for k, v in os.environ.items() if k != "ANSIBLE_CONFIG"})
    assert r.returncode == 0 and "hkgpu.tune:" in r.stdout and "installed successfully" in r.stdout, \
        r.stdout[-2000:] + r.stderr[-2000:]
    cfg = d / "ansible.cfg"
    cfg.write_text(f"[defaults]\ncollections_path = {d}\nroles_path = {d}/no-roles\ngathering = explicit\n"
                   "retry_files_enabled = False\n[ssh_connection]\npipelining = True\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(cfg), ANSIBLE_NOCOLOR="1")
    version = tomllib.load(open(os.path.join(REPO, "pyproject.toml"), "rb"))["project"]["version"]
    return {"dir": d, "coll": d / "ansible_collections" / "hkgpu" / "tune", "env": env, "version": version}


def test_the_tarball_holds_every_role_and_playbook_and_no_links(tarball):
    with tarfile.open(tarball) as t:
        members = t.getmembers()
        manifest = json.load(t.extractfile("MANIFEST.json"))
    names = {m.name for m in members}
    assert not [m.name for m in members if m.issym() or m.islnk()]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    for role in os.listdir(os.path.join(REPO, "roles")):
        if os.path.isdir(os.path.join(REPO, "roles", role)):
            assert f"roles/{role}/meta/main.yml" in names, role
    for p in os.listdir(os.path.join(REPO, "playbooks")):
        if p.endswith(".yml"):
            assert f"playbooks/{p}" in names, p
    assert "plugins/modules/hkgpu.py" in names and "meta/runtime.yml" in names and "LICENSE" in names
    # the toolkit's wheel, which hkgpu_install ships to the nodes: the collection's own version
    wheels = [n for n in names if n.startswith("roles/hkgpu_install/files/hkgpu_tune-") and n.endswith(".whl")]
    version = tomllib.load(open(os.path.join(REPO, "pyproject.toml"), "rb"))["project"]["version"]
    assert wheels == [f"roles/hkgpu_install/files/hkgpu_tune-{version}-py3-none-any.whl"], wheels
    info = manifest["collection_info"]
    assert (info["namespace"], info["name"], info["version"]) == ("hkgpu", "tune", version)


def test_the_build_refuses_a_version_other_than_the_packages(tmp_path):
    """One version for the wheel and the collection: a galaxy.yml that differs stops the build."""
    repo = tmp_path / "repo"
    coll = repo / "collections" / "ansible_collections" / "hkgpu" / "tune"
    coll.mkdir(parents=True)
    (repo / "scripts").mkdir()
    doc = yaml.safe_load(open(GALAXY_YML))
    doc["version"] = "9.9.9"
    (coll / "galaxy.yml").write_text(yaml.safe_dump(doc))
    (repo / "pyproject.toml").write_text(open(os.path.join(REPO, "pyproject.toml")).read())
    script = repo / "scripts" / "build-collection.sh"
    script.write_text(open(os.path.join(REPO, "scripts", "build-collection.sh")).read())
    r = subprocess.run(["bash", str(script), str(tmp_path / "out")], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode != 0 and "version 9.9.9 differs from pyproject.toml's" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_ansible_doc_shows_requirements_author_and_attributes(installed, tmp_path):
    r = subprocess.run(["ansible-doc", "--json", "-t", "module", "hkgpu.tune.hkgpu"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, env=installed["env"])
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)["hkgpu.tune.hkgpu"]["doc"]
    assert doc["filename"].startswith(str(installed["coll"])), doc["filename"]   # the installed copy
    assert any("hkgpu_tune" in x for x in doc["requirements"]) and doc["author"]
    assert doc["attributes"]["check_mode"]["support"] == "full"
    assert doc["attributes"]["diff_mode"]["support"] == "full"
    text = subprocess.run(["ansible-doc", "-t", "module", "hkgpu.tune.hkgpu"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=installed["env"]).stdout
    assert "REQUIREMENTS" in text and "check_mode" in text and "diff_mode" in text and "AUTHOR" in text


@pytest.mark.skipif(not shutil.which("ansible-lint"), reason="ansible-lint is not installed (pip install -e .[test])")
def test_the_installed_collection_passes_ansible_lint_production(installed):
    # as a user checks it where ansible-galaxy put it (not published: no repository URL)
    r = subprocess.run(["ansible-lint", "--offline", "--profile", "production", "--nocolor",
                        "--skip-list", "galaxy[no-repository]"], capture_output=True, text=True,
                       cwd=installed["coll"], timeout=600,
                       env={**installed["env"], "ANSIBLE_COLLECTIONS_PATH": str(installed["dir"])})
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in r.stderr + r.stdout


def recap(out: str) -> dict:
    rows = re.findall(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", out, re.M)
    assert rows, out[-3000:]
    return {h: dict(zip(("ok", "changed", "unreachable", "failed"), map(int, n))) for h, *n in rows}


@pytest.mark.root
@pytest.mark.slow
def test_the_installed_collections_playbooks_run_on_a_simulated_host(installed, rack, tmp_path):
    host = rack["hosts"][0]
    cache = tmp_path / "cache"       # the controller's wheel cache (hkgpu_install's default place)

    def play(name, *extra):      # no extra variables
        return subprocess.run(["ansible-playbook", "-i", rack["inventory"], "-l", host, f"hkgpu.tune.{name}", *extra],
                              capture_output=True, text=True, timeout=600, cwd=tmp_path,
                              env={**installed["env"], "XDG_CACHE_HOME": str(cache)})

    syntax = play("site", "--syntax-check")
    assert syntax.returncode == 0 and str(installed["coll"] / "playbooks" / "site.yml") in syntax.stdout, \
        syntax.stdout + syntax.stderr
    r = play("site")
    rc = recap(r.stdout)
    assert r.returncode == 0 and rc[host]["failed"] == 0 and rc[host]["changed"] > 0, r.stdout[-3000:]
    s = simrack.snapshot(host)
    assert "mtu 9000" in s["link"] and s["net.ipv4.tcp_fin_timeout"] == "15", s
    # the node got the collection's own wheel (nothing built on the controller), dependencies beside it
    # (the cache holds the dependencies and the one archive a node gets: no tree-* build)
    names = sorted(p.name for p in (cache / "hkgpu-tune" / "wheels").iterdir())
    assert len(names) == 2 and names[0].startswith("bundle-") and names[0].endswith(".tar") \
        and names[1] == "deps", names
    node = os.path.join(rack["dir"], host, "opt", "hkgpu-tune", "wheels")
    assert sorted(os.listdir(node)) == ["deps", f"hkgpu_tune-{installed['version']}-py3-none-any.whl"]
    other = rack["hosts"][1]
    assert simrack.snapshot(other) == rack["originals"][other]          # -l: the other host untouched
    r = play("verify")
    assert r.returncode == 0 and recap(r.stdout)[host]["failed"] == 0, r.stdout[-3000:]
    simrack.nsexec(host, "sysctl", "-qw", "net.ipv4.tcp_fin_timeout=33")
    r = play("verify")
    assert r.returncode != 0 and re.search(r"net\.ipv4\.tcp_fin_timeout\b.*\b33\b", r.stdout), r.stdout[-3000:]
    r = play("rollback")
    assert r.returncode == 0 and recap(r.stdout)[host]["failed"] == 0, r.stdout[-3000:]
    assert simrack.snapshot(host) == rack["originals"][host]
