"""The wheel on its own: what it carries, and `hkgpu-tune rack apply|verify|rollback` from a fresh
venv that holds only the wheel and its dependencies (from the package index), run from a
directory away from the source tree, against a simulated rack over real SSH."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile

import pytest

import simrack
from tests.helpers import REPO
from hkgpu_tune.core.version import __version__ as VERSION

COLL = "hkgpu_tune/ansible/collections/ansible_collections/hkgpu/tune/"
SETTINGS_PER_HOST = 16   # tests/rack/group_vars/rack_sim1.yml: 7 sysctls, mtu, rx+tx, gro/gso/tso, qdisc x3


def test_the_wheel_carries_every_role_playbook_the_module_and_the_inventory(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    roles = sorted(d for d in os.listdir(os.path.join(REPO, "roles")) if os.path.isdir(os.path.join(REPO, "roles", d)))
    playbooks = sorted(p for p in os.listdir(os.path.join(REPO, "playbooks")) if p.endswith(".yml"))
    assert roles and playbooks
    for role in roles:
        for root, _, files in os.walk(os.path.join(REPO, "roles", role)):
            for f in files:
                if "__pycache__" not in root:
                    rel = os.path.relpath(os.path.join(root, f), REPO)
                    assert COLL + rel in names, rel
    for p in playbooks:
        assert f"{COLL}playbooks/{p}" in names, p
    for f in ("plugins/modules/hkgpu.py", "galaxy.yml", "meta/runtime.yml"):
        assert COLL + f in names, f
    assert any(n.endswith(".dist-info/LICENSE") for n in names) and COLL + "LICENSE" in names
    assert "hkgpu_tune/ansible/ansible.cfg" in names and "hkgpu_tune/ansible/inventory/hk/hosts.yml" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    # ansible is the controller's (hkgpu-tune[rack]), never installed on a node
    for name in ("ansible-runner", "ansible-core"):
        mine = [r for r in requires if r.startswith(name)]
        assert all("extra ==" in r for r in mine) and any(r.endswith('extra == "rack"') for r in mine), requires


def test_rack_without_ansible_runner_is_one_line(monkeypatch, tmp_path):
    from hkgpu_tune.core.errors import HkError
    from hkgpu_tune.fleet.rack import run_playbook
    monkeypatch.setitem(sys.modules, "ansible_runner", None)     # import fails as if not installed
    with pytest.raises(HkError) as e:
        run_playbook("verify", str(tmp_path))
    assert "\n" not in str(e.value) and "pip install 'hkgpu-tune[rack]'" in str(e.value)


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh venv (no system site-packages) with the wheel and its dependencies."""
    d = tmp_path_factory.mktemp("venv")
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(d)], check=True, capture_output=True, timeout=120)
    r = subprocess.run([str(d / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", f"{wheel}[rack]"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"venv + pip install: {time.monotonic() - t0:.1f} s")
    return d


def cli(venv, cwd, *argv):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ANSIBLE_CONFIG", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"      # nothing of the test's environment
    env["XDG_CACHE_HOME"] = str(cwd / ".cache")        # the controller's wheel cache (hkgpu_install's default)
    r = subprocess.run([str(venv / "bin" / "hkgpu-tune"), *argv], capture_output=True, text=True, cwd=cwd,
                       env=env, timeout=600)
    assert r.stdout.strip(), f"rc {r.returncode}: {r.stderr[-3000:]}"
    return r.returncode, json.loads(r.stdout), r.stderr


def node_files(python: str) -> dict:
    """hkgpu_tune's installed files and their checksums, as that Python's environment holds them."""
    code = ("import hashlib, json, importlib.metadata as m; d = m.distribution('hkgpu-tune'); "
            "print(json.dumps({str(f): hashlib.sha1(f.locate().read_bytes()).hexdigest() for f in d.files "
            "if str(f).startswith('hkgpu_tune/') and '__pycache__' not in str(f)}))")
    r = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, check=True)
    files = json.loads(r.stdout)
    assert len(files) > 50, files
    return files


@pytest.mark.root
@pytest.mark.slow
def test_rack_apply_verify_rollback_from_the_wheel(venv, wheel, rack, tmp_path):
    away = tmp_path / "elsewhere"
    away.mkdir()
    where = subprocess.run([str(venv / "bin" / "python"), "-I", "-c", "import hkgpu_tune; print(hkgpu_tune.__file__)"],
                           capture_output=True, text=True, cwd=away, check=True).stdout
    assert where.startswith(str(venv)), where
    inv, hosts = rack["inventory"], rack["hosts"]

    # check mode on fresh nodes: the install is reported, nothing fails, nothing is written
    rc, doc, err = cli(venv, away, "rack", "apply", "-i", inv, "--check", "--json")
    assert rc == 2, (err[-2000:], doc)      # --check with changes pending: 2, as `plan`
    for h, r in doc["hosts"].items():
        assert r["changed"] > 0 and not r["failed"] and not r["unreachable"], (h, r)
    for h in hosts:
        assert simrack.snapshot(h) == rack["originals"][h], h
        assert not os.path.exists(os.path.join(rack["dir"], h, "opt", "hkgpu-tune", "bin")), h

    # no extra variables: the controller ships the hkgpu_tune it runs (this venv's) and its dependencies
    rc, doc, err = cli(venv, away, "rack", "apply", "-i", inv, "--json")
    assert rc == 0, (err[-2000:], doc)
    assert doc["playbook"].startswith(str(venv)), doc["playbook"]     # the wheel's playbooks, not the tree's
    assert sorted(doc["hosts"]) == hosts
    for h, r in doc["hosts"].items():
        assert r["changed"] > 0 and not r["failed"] and not r["unreachable"], (h, r["msg"])
    for h in hosts:      # really changed on each host, read with the system's tools
        s = simrack.snapshot(h)
        assert "mtu 9000" in s["link"] and s["net.ipv4.tcp_fin_timeout"] == "15", (h, s)
        # and the man page, section 8, of the version installed, where the inventory says
        page = os.path.join(rack["dir"], h, "man", "man8", "hkgpu-tune.8")
        with open(page) as f:
            head = f.read(300)
        assert head.startswith(".TH HKGPU\\-TUNE 8 ") and f'"hkgpu-tune {VERSION}"' in head, (h, head)
    # each node's venv holds the same files as the controller's hkgpu_tune, the dependencies its
    # python3 lacked, and no ansible
    node = os.path.join(rack["dir"], hosts[0], "opt", "hkgpu-tune", "bin", "python")
    assert node_files(node) == node_files(str(venv / "bin" / "python"))
    probe = "import importlib.util as u; print([m for m in ('psutil', 'pyroute2', 'ansible', 'ansible_runner') " \
            "if u.find_spec(m)])"
    assert subprocess.run(["/usr/bin/python3", "-c", "import importlib.util as u; print(u.find_spec('psutil'))"],
                          capture_output=True, text=True).stdout.strip() == "None"    # shipped, not there before
    assert subprocess.run([node, "-c", probe], capture_output=True, text=True, cwd=away).stdout.strip() == \
        "['psutil', 'pyroute2']"

    rc, doc, err = cli(venv, away, "rack", "verify", "-i", inv, "--json")
    assert rc == 0, (err[-2000:], doc)
    for h in hosts:
        r = doc["hosts"][h]
        assert len(r["results"]) == SETTINGS_PER_HOST, (h, r["results"])
        assert {x["status"] for x in r["results"]} == {"ok"} and not r["failures"], (h, r["failures"])

    drifted = hosts[1]
    simrack.nsexec(drifted, "sysctl", "-qw", "net.ipv4.tcp_fin_timeout=33")
    rc, doc, err = cli(venv, away, "rack", "verify", "-i", inv, "--json")
    assert rc == 2, (err[-2000:], doc)
    assert [h for h, r in doc["hosts"].items() if r["failed"]] == [drifted]
    assert [(f["key"], f["current"]) for f in doc["hosts"][drifted]["failures"]] == \
        [("net.ipv4.tcp_fin_timeout", "33")]

    rc, doc, err = cli(venv, away, "rack", "rollback", "-i", inv, "--json")
    assert rc == 0, (err[-2000:], doc)
    for h in hosts:
        assert simrack.snapshot(h) == rack["originals"][h], h
