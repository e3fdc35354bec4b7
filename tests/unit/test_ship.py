"""hkgpu_install's controller side (roles/hkgpu_install/files/hkgpu_ship.py): the toolkit the controller
runs and its installed dependencies, as wheels pip installs on a node with no package index."""
from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIP = os.path.join(REPO, "roles", "hkgpu_install", "files", "hkgpu_ship.py")
spec = importlib.util.spec_from_file_location("hkgpu_ship", SHIP)
ship = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ship)


def test_an_installed_dependency_packed_again_installs_with_no_index(tmp_path):
    dist = md.distribution("mdurl")          # pure Python, a dependency of rich
    whl = ship.repack(dist, str(tmp_path))
    assert os.path.basename(whl) == f"mdurl-{dist.version}-py3-none-any.whl"
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        record = z.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
        for line in record.splitlines():         # every file's hash as pip checks it
            name, digest, _ = line.rsplit(",", 2)
            if digest:
                want = base64.urlsafe_b64encode(hashlib.sha256(z.read(name)).digest()).rstrip(b"=").decode()
                assert digest == f"sha256={want}", name
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", "/INSTALLER", "/direct_url.json"))]
    os.makedirs(tmp_path / "again")
    again = ship.repack(dist, str(tmp_path / "again"))
    assert open(whl, "rb").read() == open(again, "rb").read()      # the same files, the same wheel
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                        "--target", str(target), whl], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import mdurl; "
                        "print(mdurl.__file__)", str(target)], capture_output=True, text=True)
    assert r.stdout.startswith(str(target)), r.stdout + r.stderr


def test_a_compiled_dependency_keeps_the_tags_of_its_wheel(tmp_path):
    dist = md.distribution("psutil")
    tags = [line.split(":", 1)[1].strip() for line in dist.read_text("WHEEL").splitlines() if line.startswith("Tag:")]
    name = os.path.basename(ship.repack(dist, str(tmp_path)))
    py, abi, plat = name[:-4].split("-")[2:]
    assert {f"{p}-{a}-{x}" for p in py.split(".") for a in abi.split(".") for x in plat.split(".")} >= set(tags)
    assert "none-any" not in name


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """The script as the role runs it, from this source tree."""
    out = tmp_path_factory.mktemp("ship")
    r = subprocess.run([sys.executable, SHIP, "--out", str(out)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": REPO}, cwd=out)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow
def test_from_the_source_tree_the_wheel_is_built_and_the_dependencies_come_along(shipped):
    doc = shipped
    assert os.path.basename(os.path.dirname(doc["wheel"])).startswith("tree-")
    with zipfile.ZipFile(doc["wheel"]) as z:
        assert "hkgpu_tune/cli/__init__.py" in z.namelist()
    packed = {n.split("-")[0].lower() for n in doc["packed"]}
    assert {"pyroute2", "psutil", "rich", "pyyaml", "nvidia_ml_py"} <= packed, packed
    assert not packed & {"ansible_core", "ansible_runner"}, packed      # the controller's extra, not the node's
    assert not os.path.exists(os.path.join(REPO, "build", "bdist.linux-x86_64"))


def test_nothing_to_ship_is_one_line_naming_the_variable(tmp_path):
    r = subprocess.run([sys.executable, "-I", "-S", SHIP, "--out", str(tmp_path)], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "hkgpu_install_wheel" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, SHIP, "--out", str(tmp_path), "--wheel", str(tmp_path / "no.whl")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr == f"hkgpu_install: hkgpu_install_wheel: {tmp_path / 'no.whl'}: no such file\n"


def test_a_dependency_not_installed_here_is_left_to_the_node(shipped, tmp_path, monkeypatch):
    real = md.distribution

    def fake(name):
        if ship._norm(name) == "pyroute2":
            raise md.PackageNotFoundError(name)
        return real(name)
    monkeypatch.setattr(ship.md, "distribution", fake)
    packed = [os.path.basename(p) for p in ship.dependencies(shipped["wheel"], str(tmp_path))]
    assert packed and not [p for p in packed if p.startswith("pyroute2")], packed


def _wheel(path, body=b"x = 1\n"):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("demo/__init__.py", body)
        z.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\n")
    return str(path)


def test_the_node_gets_one_archive_of_the_wheel_and_the_wheelhouse(tmp_path):
    """One copy per node (not one module run per wheel): the archive holds the wheel, deps/ and
    extra/, with fixed owner, mode and date; a wheelhouse changes the install stamp, none keeps it."""
    import tarfile
    whl = _wheel(tmp_path / "demo-1.0-py3-none-any.whl")
    house = tmp_path / "house"
    (house / "sub").mkdir(parents=True)
    _wheel(house / "other-2.0-py3-none-any.whl")
    (house / "sub" / "more.whl").write_bytes(b"zz")
    os.symlink("/etc/shadow", house / "planted.whl")
    plain = ship.ship(str(tmp_path / "a"), whl, deps=False)
    again = ship.ship(str(tmp_path / "b"), whl, deps=False)
    withx = ship.ship(str(tmp_path / "c"), whl, deps=False, extra=str(house))
    assert plain["sha1"] == again["sha1"] != withx["sha1"]
    assert open(plain["bundle"], "rb").read() == open(again["bundle"], "rb").read()
    with tarfile.open(withx["bundle"]) as t:
        members = {m.name: m for m in t.getmembers()}
    assert sorted(members) == ["demo-1.0-py3-none-any.whl", "extra/other-2.0-py3-none-any.whl", "extra/sub/more.whl"]
    assert {(m.uid, m.gid, m.mode, m.mtime) for m in members.values()} == {(0, 0, 0o644, 0)}
    with pytest.raises(ship.ShipError, match="hkgpu_install_wheelhouse: .*nowhere: no such directory"):
        ship.ship(str(tmp_path / "d"), whl, deps=False, extra=str(tmp_path / "nowhere"))
    old = os.path.join(tmp_path / "c", "bundle-old.tar")
    open(old, "w").close()
    os.utime(old, (1, 1))
    ship.ship(str(tmp_path / "c"), whl, deps=False)
    assert not os.path.exists(old) and os.path.exists(withx["bundle"])     # an hour old goes; a fresh one stays


def ship_args(tasks: str, role: str, variables: dict) -> list[str]:
    """The arguments a role's task passes to hkgpu_ship.py, rendered by Ansible's own loader and templating."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template   # the role's own files are trusted templates
    loader, base = DataLoader(), os.path.join(REPO, "roles", role)
    task = next(t for t in loader.load_from_file(os.path.join(base, "tasks", tasks))
                if "hkgpu_ship.py" in str(t.get("ansible.builtin.command")))
    own = dict(task.get("vars") or {})
    if os.path.exists(os.path.join(base, "vars", "main.yml")):
        own.update(loader.load_from_file(os.path.join(base, "vars", "main.yml")) or {})
    own = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in own.items()}
    t = Templar(loader=loader, variables={**own, **variables, "role_path": base,
                                          "ansible_playbook_python": sys.executable})
    argv = t.template(trust_as_template(task["ansible.builtin.command"]["argv"]))
    return argv[next(i for i, a in enumerate(argv) if a.endswith("hkgpu_ship.py")) + 1:]


@pytest.mark.parametrize("wheelhouse", ["", "/srv/wheelhouse"])
def test_the_run_stamp_and_the_install_ask_for_the_same_archive(wheelhouse):
    # the fast path's stamp packs the archive the install would copy: with other inputs (a wheelhouse
    # left out) the controller packed a second archive it never sent
    v = {"hkgpu_install_cache_dir": "/c", "hkgpu_install_wheel": "/w/hkgpu_tune-9-py3-none-any.whl",
         "hkgpu_install_wheelhouse": wheelhouse}
    install = ship_args("main.yml", "hkgpu_install", v)
    stamp = ship_args("converged.yml", "hkgpu", v)
    assert install == stamp and ("--extra" in install) == bool(wheelhouse), (install, stamp)
