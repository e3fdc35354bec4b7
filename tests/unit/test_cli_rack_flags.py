"""`hkgpu-tune rack`'s connection flags (issue 33): --become/--no-become, --user, the vault
password from a file or asked for, and --check's exit status 2 while changes are pending. A real
ansible-playbook run (local connection) of a playbook that reports what ansible got."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("ansible_runner", reason="rack needs ansible-runner (pip install -e .[test])")
if not shutil.which("ansible-playbook", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]):
    pytest.skip("ansible-playbook is not installed", allow_module_level=True)

# real ansible-playbook runs (several per test): over 5 s on a quiet machine, not the fast tier
pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PASSWORD = "correct horse"
PLAYBOOK = """\
- hosts: all
  gather_facts: false
  become: "{{ hkgpu_become | default(true) }}"
  tasks:
    - name: a file that check mode would change
      ansible.builtin.copy:
        content: "{{ secret | default('none') }}\\n"
        dest: "{{ target_file }}"
    - name: what ansible got
      ansible.builtin.debug:
        msg: "become={{ hkgpu_become | default('unset') }} user={{ ansible_user | default(lookup('ansible.builtin.config', 'DEFAULT_REMOTE_USER')) }}"
"""


@pytest.fixture
def rack(tmp_path):
    base = tmp_path / "ansible"
    books = base / "collections" / "ansible_collections" / "hkgpu" / "tune" / "playbooks"
    books.mkdir(parents=True)
    (base / "ansible.cfg").write_text("[defaults]\n")
    (books / "site.yml").write_text(PLAYBOOK)
    (tmp_path / "pass").write_text(PASSWORD + "\n")
    vault = subprocess.run(["ansible-vault", "encrypt_string", "--vault-password-file", str(tmp_path / "pass"),
                            "s3cret", "--name", "secret"], capture_output=True, text=True, check=True,
                           env={**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]})
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "node1.yml").write_text(vault.stdout)
    (tmp_path / "hosts").write_text(f"node1 ansible_connection=local ansible_python_interpreter={sys.executable} "
                                    f"target_file={tmp_path / 'node1.conf'}\n")
    return {"dir": tmp_path, "inventory": str(tmp_path / "hosts"),
            "env": {**os.environ, "HKGPU_TUNE_ANSIBLE_DIR": str(base)}}


def hk(rack, *args, stdin=None):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", "rack", "apply", "-i", rack["inventory"], "-v", *args],
                          capture_output=True, text=True, env=rack["env"], cwd=ROOT, timeout=300, input=stdin,
                          start_new_session=True)   # no terminal: getpass reads the password from stdin


def test_vault_password_file_and_check_exits_2_with_changes_pending(rack):
    conf = rack["dir"] / "node1.conf"
    p = hk(rack, "--vault-password-file", str(rack["dir"] / "pass"), "--check")
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert not conf.exists()
    p = hk(rack, "--vault-password-file", str(rack["dir"] / "pass"))
    assert p.returncode == 0 and conf.read_text() == "s3cret\n", p.stdout[-2000:] + p.stderr[-2000:]
    p = hk(rack, "--vault-password-file", str(rack["dir"] / "pass"), "--check")
    assert p.returncode == 0, p.stdout[-2000:]      # nothing pending


def test_ask_vault_pass_reads_the_password_and_no_vault_is_an_error(rack):
    p = hk(rack, "--ask-vault-pass", stdin=PASSWORD + "\n")
    assert p.returncode == 0 and (rack["dir"] / "node1.conf").read_text() == "s3cret\n", p.stdout[-2000:] + p.stderr
    p = hk(rack)
    assert p.returncode != 0


def test_become_and_user_reach_ansible(rack):
    p = hk(rack, "--vault-password-file", str(rack["dir"] / "pass"), "--no-become", "--user", "opsuser")
    assert "become=False" in p.stdout and "user=opsuser" in p.stdout, p.stdout[-3000:]
    p = hk(rack, "--vault-password-file", str(rack["dir"] / "pass"), "--become")
    assert "become=True" in p.stdout, p.stdout[-3000:]
