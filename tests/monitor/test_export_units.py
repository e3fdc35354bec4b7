"""The units that run the export: the boot unit of apply --persist and the hkgpu_verify role's
service, timer and environment file write the same one textfile."""
import os
import re

import jinja2
import yaml

from hkgpu_tune.tune import persist

from tests.helpers import role_filters

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE = os.path.join(REPO, "roles", "hkgpu_verify")


def render(name, **over):
    v = {"ansible_managed": "Ansible managed"}
    for role in ("hkgpu", "hkgpu_verify"):
        with open(os.path.join(REPO, "roles", role, "defaults", "main.yml")) as f:
            v.update(yaml.safe_load(f))
    v.update(over)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters.update(role_filters())
    for _ in range(3):
        v = {k: env.from_string(x).render(v) if isinstance(x, str) and "{{" in x else x for k, x in v.items()}
    with open(os.path.join(ROLE, "templates", name)) as f:
        return env.from_string(f.read()).render(v)


def keys(unit, key):
    return [ln.split("=", 1)[1] for ln in unit.splitlines() if ln.startswith(key + "=")]


def test_boot_unit_exports_into_the_textfile_not_run():
    u = persist.boot_unit("/opt/hkgpu-tune/bin/hkgpu-tune", ["link", "ethtool"])
    assert "/run/hkgpu-tune.prom" not in u and "--prometheus" not in u
    assert keys(u, "ExecStartPost") == ["-/opt/hkgpu-tune/bin/hkgpu-tune health --profile /etc/hkgpu-tune/profile.yaml",
                                        "-/opt/hkgpu-tune/bin/hkgpu-tune export --profile /etc/hkgpu-tune/profile.yaml"]
    assert keys(u, "EnvironmentFile") == ["-/etc/hkgpu-tune/export.env"]


def test_timer_at_boot_and_every_five_minutes_by_default():
    t = render("hkgpu-tune-verify.timer.j2")
    assert keys(t, "OnBootSec") == ["1min"] and keys(t, "OnUnitActiveSec") == ["5min"]
    assert keys(t, "Unit") == ["hkgpu-tune-verify.service"] and keys(t, "WantedBy") == ["timers.target"]
    t = render("hkgpu-tune-verify.timer.j2", hkgpu_verify_interval="30s", hkgpu_verify_boot_delay="10s")
    assert keys(t, "OnBootSec") == ["10s"] and keys(t, "OnUnitActiveSec") == ["30s"]


def test_service_runs_export_into_the_directory_the_boot_unit_reads():
    s = render("hkgpu-tune-verify.service.j2", hkgpu_verify_textfile_dir="/srv/textfile")
    health, export = keys(s, "ExecStart")
    cmd = export.split()
    assert cmd[1] == "export" and cmd[cmd.index("--textfile-dir") + 1] == "/srv/textfile" and "--probes" not in cmd
    env = render("export.env.j2", hkgpu_verify_textfile_dir="/srv/textfile")
    assert re.search(r"^HKGPU_TUNE_TEXTFILE_DIR=/srv/textfile$", env, re.M)
    # a oneshot that stays active would never run again from the timer
    assert "RemainAfterExit" not in s and keys(s, "Type") == ["oneshot"]
    assert keys(s, "SuccessExitStatus") == ["2"]        # drift is in the textfile, not a failed unit
    assert "--probes" in keys(render("hkgpu-tune-verify.service.j2", hkgpu_verify_probes=True), "ExecStart")[1]


def test_timer_and_boot_unit_run_health_so_its_hooks_fire():
    """health (hooks on a transition) runs before the export with the same profile and state
    directory; '-': a degraded node (exit 2) or an error (1) never stops the export."""
    s = render("hkgpu-tune-verify.service.j2", hkgpu_profile_path="/etc/hkgpu-tune/node.yaml")
    health, export = keys(s, "ExecStart")
    assert health.startswith("-") and not export.startswith("-")
    h, e = health[1:].split(), export.split()
    assert h[1] == "health" and h[h.index("--profile") + 1] == e[e.index("--profile") + 1] == "/etc/hkgpu-tune/node.yaml"
    assert "--no-hooks" not in h and keys(s, "Environment")[0].startswith("HKGPU_TUNE_STATE_DIR=")
    u = persist.boot_unit("/usr/bin/hkgpu-tune", ["link"])
    assert [x.split()[1] for x in keys(u, "ExecStartPost")] == ["health", "export"]
    assert all(x.startswith("-") for x in keys(u, "ExecStartPost"))


def test_role_writes_the_timer_and_env_and_enables_the_timer():
    with open(os.path.join(ROLE, "vars", "main.yml")) as f:
        v = yaml.safe_load(f)
    paths = [x["path"] for x in v["__hkgpu_verify_files"]]
    assert paths == ["{{ __hkgpu_verify_unit_path }}", "{{ __hkgpu_verify_timer_path }}", "{{ __hkgpu_verify_env_path }}"]
    assert v["__hkgpu_verify_env_path"] == "/" + persist.EXPORT_ENV
    links = {x["path"]: x["src"] for x in v["__hkgpu_verify_links"]}
    assert links["{{ hkgpu_verify_unit_dir }}/timers.target.wants/{{ __hkgpu_verify_timer_name }}"] == \
        "{{ __hkgpu_verify_timer_path }}"
    with open(os.path.join(ROLE, "handlers", "main.yml")) as f:
        [h] = yaml.safe_load(f)
    assert h["ansible.builtin.systemd_service"] == {"name": "{{ __hkgpu_verify_timer_name }}", "state": "restarted",
                                                     "daemon_reload": True}


def test_role_tasks_write_once_then_change_nothing(tmp_path):
    """The role's own tasks (checksum, write, enable) run by ansible-playbook on this host with
    every path under tmp_path: the first run writes service, timer, env and links; the second
    changes nothing; a changed interval rewrites the timer only."""
    import shutil
    import subprocess
    import pytest
    if not shutil.which("ansible-playbook"):
        pytest.skip("needs ansible-playbook (pip install -e .[test])")
    os.symlink(os.path.join(ROLE, "templates"), tmp_path / "templates")
    units, tf = tmp_path / "units", tmp_path / "textfile"
    (tmp_path / "play.yml").write_text(f"""
- hosts: localhost
  connection: local
  gather_facts: false
  vars_files:
    - {REPO}/roles/hkgpu/defaults/main.yml
    - {ROLE}/defaults/main.yml
    - {ROLE}/vars/main.yml
  tasks:
    - ansible.builtin.import_tasks: {ROLE}/tasks/main.yml
  handlers:
    - ansible.builtin.import_tasks: {ROLE}/handlers/main.yml
""")

    def play(**extra):
        ev = {"hkgpu_verify_unit_dir": str(units), "hkgpu_verify_textfile_dir": str(tf),
              "__hkgpu_verify_env_path": str(tmp_path / "etc" / "export.env"), **extra}
        import json as _j
        r = subprocess.run(["ansible-playbook", "-i", "localhost,", str(tmp_path / "play.yml"), "-e", _j.dumps(ev)],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path,
                           env={**os.environ, "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
                                "ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, "collections"),
                                "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "0"})
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        return int(re.search(r"changed=(\d+)", r.stdout).group(1))

    import sys
    assert play() == 3      # the directories, the files and the links (a loop task each)
    assert (units / "hkgpu-tune-verify.timer").exists() and tf.is_dir()
    assert os.readlink(units / "timers.target.wants" / "hkgpu-tune-verify.timer") == str(units / "hkgpu-tune-verify.timer")
    assert "HKGPU_TUNE_TEXTFILE_DIR=" + str(tf) in (tmp_path / "etc" / "export.env").read_text()
    assert play() == 0
    service = (units / "hkgpu-tune-verify.service").stat().st_mtime_ns
    assert play(hkgpu_verify_interval="1min") == 1   # the timer file only
    assert "OnUnitActiveSec=1min" in (units / "hkgpu-tune-verify.timer").read_text()
    assert (units / "hkgpu-tune-verify.service").stat().st_mtime_ns == service


def test_the_service_names_the_host_dir_only_when_the_role_sets_one():
    assert [e for e in keys(render("hkgpu-tune-verify.service.j2"), "Environment") if "HOST_DIR" in e] == []
    s = render("hkgpu-tune-verify.service.j2", hkgpu_host_dir="/srv/sim 1/%h")
    assert '"HKGPU_TUNE_HOST_DIR=/srv/sim 1/%%h"' in keys(s, "Environment")


def test_the_verify_service_runs_only_where_its_profile_exists():
    """With nothing for the roles to set there is no node profile: the timer's run is skipped
    (a start condition) instead of failing on every tick with `no such profile file`."""
    s = render("hkgpu-tune-verify.service.j2", hkgpu_profile_path="/etc/hkgpu-tune/node.yaml")
    profiles = {a.split()[a.split().index("--profile") + 1] for a in keys(s, "ExecStart")}
    assert keys(s, "ConditionPathExists") == sorted(profiles) == ["/etc/hkgpu-tune/node.yaml"]
    s = render("hkgpu-tune-verify.service.j2", hkgpu_profile_path="/srv/100%/node.yaml")
    assert keys(s, "ConditionPathExists") == ["/srv/100%%/node.yaml"]     # systemd's specifier escape
