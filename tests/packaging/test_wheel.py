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
    assert "hkgpu_tune/ansible/ansible.cfg" in names and "hkgpu_tune/ansible/inventory/hk/hosts.yml" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert any(r.startswith("ansible-runner") and "extra ==" not in r for r in requires), requires
    assert any(r.startswith("ansible-core") and "extra ==" not in r for r in requires), requires


def test_rack_without_ansible_runner_is_one_line(monkeypatch, tmp_path):
    from hkgpu_tune.core.errors import HkError
    from hkgpu_tune.fleet.rack import run_playbook
    monkeypatch.setitem(sys.modules, "ansible_runner", None)     # import fails as if not installed
    with pytest.raises(HkError) as e:
        run_playbook("verify", str(tmp_path))
    assert "\n" not in str(e.value) and "pip install 'ansible-runner" in str(e.value)


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh venv (no system site-packages) with the wheel and its dependencies."""
    d = tmp_path_factory.mktemp("venv")
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(d)], check=True, capture_output=True, timeout=120)
    r = subprocess.run([str(d / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", wheel],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"venv + pip install: {time.monotonic() - t0:.1f} s")
    return d


def cli(venv, cwd, *argv):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ANSIBLE_CONFIG", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"      # nothing of the test's environment
    r = subprocess.run([str(venv / "bin" / "hkgpu-tune"), *argv], capture_output=True, text=True, cwd=cwd,
                       env=env, timeout=600)
    assert r.stdout.strip(), f"rc {r.returncode}: {r.stderr[-3000:]}"
    return r.returncode, json.loads(r.stdout), r.stderr


@pytest.mark.root
@pytest.mark.slow
def test_rack_apply_verify_rollback_from_the_wheel(venv, wheel, rack, tmp_path):
    away = tmp_path / "elsewhere"
    away.mkdir()
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import hkgpu_tune; print(hkgpu_tune.__file__)"],
                           capture_output=True, text=True, cwd=away, check=True).stdout
    assert where.startswith(str(venv)), where
    inv, hosts = rack["inventory"], rack["hosts"]
    # the node install takes this same wheel (no source tree to build one from)
    extra = ["-e", f"hkgpu_install_wheel_dir={os.path.dirname(wheel)}"]

    rc, doc, err = cli(venv, away, "rack", "apply", "-i", inv, "--json", *extra)
    assert rc == 0, (err[-2000:], doc)
    assert doc["playbook"].startswith(str(venv)), doc["playbook"]     # the wheel's playbooks, not the tree's
    assert sorted(doc["hosts"]) == hosts
    for h, r in doc["hosts"].items():
        assert r["changed"] > 0 and not r["failed"] and not r["unreachable"], (h, r["msg"])
    for h in hosts:      # really changed on each host, read with the system's tools
        s = simrack.snapshot(h)
        assert "mtu 9000" in s["link"] and s["net.ipv4.tcp_fin_timeout"] == "15", (h, s)

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
