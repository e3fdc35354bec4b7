"""ansible-lint, production profile, over roles/, playbooks/ and the collection hkgpu.tune; every
call of the project's module and roles by its FQCN (hkgpu.tune.*), so the collection works alone."""
import glob
import json
import os
import shutil
import subprocess

import pytest
import yaml

from simrack import REPO

COLLECTION = os.path.join("collections", "ansible_collections", "hkgpu", "tune")


@pytest.mark.skipif(not shutil.which("ansible-lint"), reason="ansible-lint is not installed (pip install -e .[test])")
def test_ansible_lint_production():
    # the collection is built from this tree, not published to Galaxy: it has no repository URL
    r = subprocess.run(["ansible-lint", "--offline", "--profile", "production", "--nocolor",
                        "--skip-list", "galaxy[no-repository]", "roles/", "playbooks/", COLLECTION + "/"],
                       capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={**os.environ, "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg")})
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in r.stderr + r.stdout


def _short_names(node, where, out):
    """Every place a task, role list or role dependency names the module or a role without FQCN."""
    if isinstance(node, list):
        for x in node:
            _short_names(x, where, out)
    elif isinstance(node, dict):
        if "hkgpu" in node:
            out.append(f"{where}: module called as 'hkgpu' (use hkgpu.tune.hkgpu)")
        v = node.get("role")
        if isinstance(v, str) and v.startswith("hkgpu") and not v.startswith("hkgpu.tune."):
            out.append(f"{where}: role {v!r} (use hkgpu.tune.{v})")
        for k in ("ansible.builtin.import_role", "ansible.builtin.include_role", "import_role", "include_role"):
            v = (node.get(k) or {}).get("name") if isinstance(node.get(k), dict) else None
            if isinstance(v, str) and v.startswith("hkgpu") and not v.startswith("hkgpu.tune."):
                out.append(f"{where}: role {v!r} (use hkgpu.tune.{v})")
        for k, v in node.items():
            if k not in ("vars",):
                _short_names(v, where, out)


def test_every_module_and_role_reference_is_fqcn():
    files = sorted(glob.glob(os.path.join(REPO, "playbooks", "*.yml"))
                   + glob.glob(os.path.join(REPO, "roles", "*", "tasks", "*.yml"))
                   + glob.glob(os.path.join(REPO, "roles", "*", "handlers", "*.yml"))
                   + glob.glob(os.path.join(REPO, "roles", "*", "meta", "main.yml")))
    assert len(files) > 10
    bad = []
    for f in files:
        _short_names(yaml.safe_load(open(f)), os.path.relpath(f, REPO), bad)
    assert not bad, "\n".join(bad)
    assert not os.path.exists(os.path.join(REPO, "roles", "hkgpu", "library")), \
        "one module: collections/.../plugins/modules/hkgpu.py"


def test_every_role_has_an_argument_spec_of_its_defaults_and_a_readme():
    """meta/argument_specs.yml names every public variable of defaults/main.yml (ansible checks them when
    the role starts and ansible-doc -t role shows them); the role's README lists them too."""
    roles = sorted(r for r in os.listdir(os.path.join(REPO, "roles")) if os.path.isdir(os.path.join(REPO, "roles", r)))
    assert len(roles) >= 8
    for role in roles:
        d = os.path.join(REPO, "roles", role)
        spec = yaml.safe_load(open(os.path.join(d, "meta", "argument_specs.yml")))["argument_specs"]["main"]
        defaults_file = os.path.join(d, "defaults", "main.yml")
        defaults = (yaml.safe_load(open(defaults_file)) or {}) if os.path.exists(defaults_file) else {}
        assert sorted(spec["options"]) == sorted(defaults), role
        readme = open(os.path.join(d, "README.md")).read()
        for name, opt in spec["options"].items():
            assert opt.get("description") and opt["description"] != name, (role, name)
            assert f"`{name}`" in readme, (role, name)


@pytest.mark.skipif(not shutil.which("ansible-doc"), reason="ansible-doc is not installed (pip install -e .[test])")
def test_ansible_doc_shows_each_roles_variables(tmp_path):
    r = subprocess.run(["ansible-doc", "--json", "-t", "role", "-l"], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120, env={**os.environ, "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg")})
    assert r.returncode == 0, r.stderr[-2000:]
    listed = json.loads(r.stdout)
    for role in ("hkgpu_install", "hkgpu_network", "hkgpu_verify"):
        assert f"hkgpu.tune.{role}" in listed, sorted(listed)
    r = subprocess.run(["ansible-doc", "--json", "-t", "role", "hkgpu.tune.hkgpu_install"], capture_output=True,
                       text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg")})
    doc = json.loads(r.stdout)["hkgpu.tune.hkgpu_install"]["entry_points"]["main"]
    assert "hkgpu_install_wheel" in doc["options"] and doc["options"]["hkgpu_install_wheel"]["type"] == "str"
