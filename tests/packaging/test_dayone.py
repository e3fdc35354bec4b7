"""The collection as its README tells a new user to run it (issue 33, item 3): the README's
install and run commands verbatim, the example inventory inside the tarball, and one wheel per
version whichever entry point (ansible-playbook of the collection, `hkgpu-tune rack`) ships it."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from tests.helpers import REPO, missing_tool

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(missing_tool(("ansible-galaxy", "ansible-playbook"))),
                                 reason="needs ansible-core (pip install -e .[test])")]
COLL_README = os.path.join(REPO, "collections", "ansible_collections", "hkgpu", "tune", "README.md")
SHIP = os.path.join(REPO, "roles", "hkgpu_install", "files", "hkgpu_ship.py")


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    out = tmp_path_factory.mktemp("collection")
    r = subprocess.run([os.path.join(REPO, "scripts", "build-collection.sh"), str(out)], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


def readme_commands():
    """The README's fenced shell block of the install and run commands (comments stripped)."""
    text = open(COLL_README).read()
    block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert block, "the collection README has no ```sh block of commands"
    return [ln.split("  #")[0].strip() for ln in block.group(1).splitlines() if ln.strip() and not ln.startswith("#")]


def test_the_readmes_commands_run_verbatim(tarball, tmp_path):
    """In a fresh HOME with no ansible.cfg and no ANSIBLE_* variable: build (the fixture did, into
    dist/), install, copy the example inventory, and the playbook is found by its FQCN."""
    cmds = readme_commands()
    assert cmds[0].startswith("scripts/build-collection.sh dist/"), cmds
    work = tmp_path / "work"
    (work / "dist").mkdir(parents=True)
    shutil.copy(tarball, work / "dist")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(HOME=str(tmp_path / "home"), ANSIBLE_NOCOLOR="1")
    for cmd in cmds[1:]:
        if "ansible-playbook" in cmd:
            cmd += " --syntax-check"       # the run itself: tests/packaging/test_collection.py, tests/vm
        r = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-2000:])
    assert (work / "inventory" / "hosts.yml").is_file()
    r = subprocess.run(["ansible-playbook", "-i", "inventory", "hkgpu.tune.site", "--list-hosts"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "tko-a01-n01" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


def test_the_tarball_carries_the_example_inventory(tarball):
    with tarfile.open(tarball) as t:
        names = set(t.getnames())
    src = {os.path.relpath(os.path.join(d, f), REPO) for d, _, fs in os.walk(os.path.join(REPO, "inventory")) for f in fs}
    assert src and all(n in names for n in src), sorted(src - names)


def test_the_playbooks_become_root_by_default_and_say_how_to_turn_it_off():
    import yaml
    for pb in ("site", "verify", "rollback", "baseline", "monitoring"):
        plays = yaml.safe_load(open(os.path.join(REPO, "playbooks", f"{pb}.yml")))
        for play in plays:
            assert str(play.get("become")) in ("True", "{{ hkgpu_become | default(true) }}"), (pb, play.get("become"))


def ship(python, *args, env=None):
    r = subprocess.run([python, SHIP, "--no-deps", *args], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_both_entry_points_ship_the_same_wheel_key(tarball, tmp_path):
    """The collection's bundled wheel (pip-built, file dates in the zip) and the same version packed
    again from a controller's installed copy (`hkgpu-tune rack`) give one install stamp: switching
    entry points installs nothing on the nodes."""
    with tarfile.open(tarball) as t:
        (m,) = [m for m in t.getmembers() if re.search(r"roles/hkgpu_install/files/hkgpu_tune-.*\.whl$", m.name)]
        t.extract(m, tmp_path, filter="data")
    bundled = str(tmp_path / m.name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-deps", "--no-index",
                        "--disable-pip-version-check", bundled], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    a = ship(str(venv / "bin" / "python"), "--out", str(tmp_path / "a"), env=env)     # packed again
    b = ship(sys.executable, "--out", str(tmp_path / "b"), "--wheel", bundled)        # the carried one
    assert open(a["wheel"], "rb").read() != open(b["wheel"], "rb").read()   # other bytes (zip dates) ...
    assert a["sha1"] == b["sha1"]                                            # ... one stamp
    with zipfile.ZipFile(bundled) as z:
        z.extractall(tmp_path / "changed")
    init = next((tmp_path / "changed").glob("hkgpu_tune/__init__.py"))
    init.write_text(init.read_text() + "\n# changed\n")
    changed = tmp_path / os.path.basename(bundled)
    shutil.make_archive(str(changed) + ".d", "zip", tmp_path / "changed")
    os.replace(str(changed) + ".d.zip", changed)
    c = ship(sys.executable, "--out", str(tmp_path / "c"), "--wheel", str(changed))
    assert c["sha1"] != b["sha1"]                                            # other content: installed


EXTRAS = ["extras/testinfra/conftest.py", "extras/testinfra/infra_checks.py", "extras/testinfra/test_settings.py",
          "extras/grafana/hkgpu-tune.json", "extras/README.md"]


def test_the_tarball_and_the_wheel_carry_the_testinfra_checks_and_the_dashboard(tarball, wheel):
    with tarfile.open(tarball) as t:
        names = set(t.getnames())
        for n in EXTRAS:
            m = t.getmember(n)
            assert m.isfile() and m.size > 0, n          # a file, not a link out of the collection
    with zipfile.ZipFile(wheel) as z:
        wnames = set(z.namelist())
    coll = "hkgpu_tune/ansible/collections/ansible_collections/hkgpu/tune/"
    assert [n for n in EXTRAS if coll + n not in wnames] == []
    assert set(EXTRAS) <= names


def test_the_shipped_testinfra_checks_run_from_the_installed_collection(tarball, tmp_path):
    """Out of the tarball, away from the source tree: one test per setting of a profile."""
    with tarfile.open(tarball) as t:
        t.extractall(tmp_path / "c", filter="data")
    prof = tmp_path / "node.yaml"
    prof.write_text("name: t\nsysctl:\n  net.ipv4.tcp_mtu_probing: 1\n  net.ipv4.tcp_fin_timeout: 15\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                        "--rootdir", str(tmp_path / "c"), str(tmp_path / "c" / "extras" / "testinfra"),
                        "--hosts=local://", f"--hkgpu-profile={prof}"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0 and "2 tests collected" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    assert "net.ipv4.tcp_fin_timeout" in r.stdout
