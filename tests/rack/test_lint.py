"""ansible-lint, production profile, over roles/ and playbooks/."""
import os
import shutil
import subprocess

import pytest

from simrack import REPO


@pytest.mark.skipif(not shutil.which("ansible-lint"), reason="ansible-lint is not installed (pip install -e .[test])")
def test_ansible_lint_production():
    r = subprocess.run(["ansible-lint", "--offline", "--profile", "production", "--nocolor", "roles/", "playbooks/"],
                       capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={**os.environ, "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg")})
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in r.stderr + r.stdout
