"""ansible-lint, production profile, over roles/, playbooks/ and the collection hkgpu.tune; every
call of the project's module and roles by its FQCN (hkgpu.tune.*), so the collection works alone."""
import glob
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
