"""`hkgpu-tune rack`: the flags reach ansible-playbook, plain lines per host when not on a
terminal, the diff under --check, the JSON envelope. A real ansible-playbook run (local
connection) of a playbook that reports the flags ansible itself parsed (its magic variables)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("ansible_runner", reason="rack needs ansible-runner (pip install -e .[test])")
if not shutil.which("ansible-playbook", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]):
    pytest.skip("ansible-playbook is not installed", allow_module_level=True)

pytestmark = pytest.mark.slow   # each test runs ansible-playbook (4-8 s here)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = """\
- hosts: all
  gather_facts: false
  tasks:
    - name: a file that check mode would change
      ansible.builtin.copy:
        content: "mtu 9000\\n"
        dest: "{{ target_file }}"
      tags: [always]
    - name: the flags ansible-playbook was given
      ansible.builtin.fail:
        msg: "tags={{ ansible_run_tags | sort | join(',') }} skip={{ ansible_skip_tags | sort | join(',') }}
          limit={{ ansible_limit | default('') }} forks={{ ansible_forks }} verbosity={{ ansible_verbosity }}
          check={{ ansible_check_mode }} diff={{ ansible_diff_mode }}"
      tags: [always]
"""


@pytest.fixture
def rack(tmp_path):
    base = tmp_path / "ansible"
    books = base / "collections" / "ansible_collections" / "hkgpu" / "tune" / "playbooks"
    books.mkdir(parents=True)
    (base / "ansible.cfg").write_text("[defaults]\n")
    (books / "verify.yml").write_text(PLAYBOOK)
    inv = tmp_path / "hosts"
    lines = []
    for h in ("node1", "node2"):
        (tmp_path / f"{h}.conf").write_text("mtu 1500\n")
        lines.append(f"{h} ansible_connection=local ansible_python_interpreter={sys.executable} "
                     f"target_file={tmp_path / f'{h}.conf'}")
    inv.write_text("\n".join(lines) + "\n")
    return {"dir": tmp_path, "inventory": str(inv), "env": {**os.environ, "HKGPU_TUNE_ANSIBLE_DIR": str(base)}}


def hk(rack, *args):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", "rack", "verify", "-i", rack["inventory"], *args],
                          capture_output=True, text=True, env=rack["env"], cwd=ROOT, timeout=300)


def test_flags_reach_ansible_playbook_and_check_shows_the_diff(rack):
    p = hk(rack, "--limit", "node1", "--tags", "sysctl,link", "--skip-tags", "qdisc", "--forks", "7", "-vv",
           "--check")
    out = p.stdout
    assert "\x1b[" not in out, out   # not a terminal: no colour codes
    flags = "tags=link,sysctl skip=qdisc limit=node1 forks=7 verbosity=2 check=True diff=True"
    assert f"node1: failed ok=1 changed=1 failed=1 unreachable=0: {flags}" in unwrap(out), out
    assert "node2" not in out.replace("node2.conf", "")   # --limit
    # --check: the diff as ansible --diff shows it, and nothing changed
    conf = rack["dir"] / "node1.conf"
    assert f"--- node1: a file that check mode would change\n--- {conf}\n+++ {conf}\n@@ -1 +1 @@\n-mtu 1500\n" \
           f"+mtu 9000\n" in out, out
    assert conf.read_text() == "mtu 1500\n"
    assert "TASK [the flags ansible-playbook was given]" in out   # -v: ansible's own output
    assert p.returncode == 1, p.stderr


def unwrap(text: str) -> list[str]:
    """Lines as printed before wrapping at 80 columns (continuations are indented 4)."""
    out: list[str] = []
    for ln in text.splitlines():
        if ln.startswith("    ") and out:
            out[-1] += " " + ln.strip()
        else:
            out.append(ln)
    return out


TASK = re.compile(r"^(\S+) (ok|changed|failed|unreachable): (.*)$")


def test_plain_lines_per_host_and_defaults(rack):
    p = hk(rack)
    assert not [ln for ln in p.stdout.splitlines() if len(ln) > 80], p.stdout
    lines = unwrap(p.stdout)
    # each host's task as it finished, then one line per host and the total
    tasks = [TASK.match(ln).groups() for ln in lines if TASK.match(ln)]
    assert sorted(tasks) == [("node1", "changed", "a file that check mode would change"),
                             ("node1", "failed", "the flags ansible-playbook was given"),
                             ("node2", "changed", "a file that check mode would change"),
                             ("node2", "failed", "the flags ansible-playbook was given")], p.stdout
    assert lines.index([ln for ln in lines if TASK.match(ln)][-1]) < len(tasks)   # streamed before the summary
    lines = [ln for ln in lines if not TASK.match(ln)]
    assert [ln.split(":")[0] for ln in lines] == ["node1", "node2", "verify.yml"], p.stdout
    for h in ("node1", "node2"):
        assert f"{h}: failed ok=1 changed=1 failed=1 unreachable=0: tags=all skip= limit= forks=5 verbosity=0 " \
               "check=False diff=False" in lines, p.stdout
    assert re.fullmatch(r"verify\.yml: 2 host\(s\), 2 failed, \d+\.\d s", lines[-1])
    assert (rack["dir"] / "node1.conf").read_text() == "mtu 9000\n"   # not --check: applied
    assert p.stderr == "" and p.returncode == 1


def test_diff_without_check_and_extra_vars_from_a_file(rack, tmp_path):
    """--diff alone: applied, and the diff shown; -e @FILE: YAML variables, as ansible-playbook takes them."""
    (tmp_path / "vars.yml").write_text(f"target_file: {tmp_path / 'other.conf'}\n")
    (tmp_path / "other.conf").write_text("mtu 1500\n")
    p = hk(rack, "--diff", "-l", "node1", "-e", f"@{tmp_path / 'vars.yml'}")
    assert "check=False diff=True" in " ".join(unwrap(p.stdout)), p.stdout
    assert "--- node1: a file that check mode would change" in p.stdout and "+mtu 9000" in p.stdout
    assert (tmp_path / "other.conf").read_text() == "mtu 9000\n"           # the file's variable won
    assert (rack["dir"] / "node1.conf").read_text() == "mtu 1500\n"
    (tmp_path / "bad.yml").write_text("target_file: [unclosed\n")
    for arg, msg in ((f"@{tmp_path / 'bad.yml'}", f"--extra-vars @{tmp_path / 'bad.yml'}:2: not valid YAML"),
                     (f"@{tmp_path / 'none.yml'}", "No such file or directory")):
        p = hk(rack, "-e", arg)
        assert p.returncode == 1 and p.stdout == "" and msg in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_json_envelope_with_the_diffs(rack):
    p = hk(rack, "--check", "--json", "-l", "node2")
    doc = json.loads(p.stdout)
    assert list(doc)[:7] == ["schema_version", "command", "host", "profile", "profile_source", "time", "version"]
    assert doc["command"] == "rack verify" and doc["profile"] is None
    assert list(doc["hosts"]) == ["node2"]
    h = doc["hosts"]["node2"]
    assert h["failed"] == 1 and "check=True diff=True" in h["msg"]
    assert [d["task"] for d in h["diffs"]] == ["a file that check mode would change"]
    assert "-mtu 1500\n+mtu 9000\n" in h["diffs"][0]["diff"]


def test_bad_forks_is_a_usage_error(rack):
    p = hk(rack, "--forks", "0")
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("hkgpu-tune: error: argument --forks/-f: expected a positive number, got 0")
