"""`hkgpu-tune rack` is bounded per host (--timeout): a host whose sshd accepts the connection and never
answers is reported unreachable, a task that hangs on a node is reported timed out, both within the
bound, and the other hosts' results still come back. Real ansible-playbook and ssh; the silent sshd
is a socket that accepts and says nothing (as a wedged sshd, or a firewall that lets the SYN in)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("ansible_runner", reason="rack needs ansible-runner (pip install -e .[test])")
if not shutil.which("ansible-playbook", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]):
    pytest.skip("ansible-playbook is not installed", allow_module_level=True)

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = """\
- hosts: all
  gather_facts: false
  tasks:
    - name: a command that hangs on the node
      ansible.builtin.command: "{{ cmd }}"
      changed_when: false
"""


@pytest.fixture
def silent():
    """A listening socket nobody answers on: the kernel completes the TCP handshake, no banner ever comes."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s.getsockname()[1]
    s.close()


def rack(tmp_path, silent_port, *args):
    base = tmp_path / "ansible"
    books = base / "collections" / "ansible_collections" / "hkgpu" / "tune" / "playbooks"
    books.mkdir(parents=True)
    (base / "ansible.cfg").write_text("[defaults]\n")
    (books / "verify.yml").write_text(PLAYBOOK)
    inv = tmp_path / "hosts"
    local = f"ansible_connection=local ansible_python_interpreter={sys.executable}"
    inv.write_text(f"quick {local} cmd=true\n"
                   f"hung {local} cmd='sleep 300'\n"
                   f"silent ansible_host=127.0.0.1 ansible_port={silent_port} ansible_user=root cmd=true "
                   f"ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null'\n")
    env = {**os.environ, "HKGPU_TUNE_ANSIBLE_DIR": str(base)}
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "rack", "verify", "-i", str(inv), *args],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    return p, time.monotonic() - t


def test_a_silent_sshd_is_unreachable_and_a_hung_task_times_out_within_the_bound(tmp_path, silent):
    p, took = rack(tmp_path, silent, "--timeout", "8", "--json")
    assert p.returncode == 1, p.stdout + p.stderr
    hosts = json.loads(p.stdout)["hosts"]
    assert hosts["quick"]["state"] == "ok" and not hosts["quick"]["failed"], hosts["quick"]
    hung = hosts["hung"]
    assert hung["state"] == "timed out" and hung["timed_out"] and hung["failed"] == 1, hung
    assert hung["msg"] == "timed out: a command that hangs on the node ran past 8 s (rack --timeout)", hung["msg"]
    s = hosts["silent"]
    assert s["state"] == "unreachable" and s["unreachable"] == 1, s
    assert "timed out" in s["msg"] and "banner" in s["msg"], s["msg"]
    # the bound, not a wait: 300 s of sleep and an sshd that never speaks ended in the per-host bound
    # (plus ansible's start-up; generous for a busy machine, far below either wait)
    assert took < 120, took


def test_the_plain_lines_say_timed_out(tmp_path, silent):
    p, _ = rack(tmp_path, silent, "--timeout", "8")
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert "hung timed out: a command that hangs on the node" in lines, p.stdout      # as it happens
    assert any(x.startswith("hung: timed out ok=0 changed=0 failed=1") for x in lines), p.stdout   # the summary
    assert any(x.startswith("silent: unreachable ") for x in lines), p.stdout


def test_the_bound_has_a_default_and_is_documented():
    from hkgpu_tune.fleet import rack as fleet_rack
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "rack", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert "--timeout SECONDS" in p.stdout and f"(default {fleet_rack.TIMEOUT_S})" in " ".join(p.stdout.split())
