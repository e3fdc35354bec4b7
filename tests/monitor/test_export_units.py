"""The units that run the export: the boot unit of apply --persist and the hkgpu_verify role's
service, timer and environment file write the same one textfile."""
import os
import re

import jinja2
import yaml

from hkgpu_tune import persist

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE = os.path.join(REPO, "roles", "hkgpu_verify")


def render(name, **over):
    v = {"ansible_managed": "Ansible managed"}
    for role in ("hkgpu", "hkgpu_verify"):
        with open(os.path.join(REPO, "roles", role, "defaults", "main.yml")) as f:
            v.update(yaml.safe_load(f))
    v.update(over)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    for _ in range(3):
        v = {k: env.from_string(x).render(v) if isinstance(x, str) and "{{" in x else x for k, x in v.items()}
    with open(os.path.join(ROLE, "templates", name)) as f:
        return env.from_string(f.read()).render(v)


def keys(unit, key):
    return [ln.split("=", 1)[1] for ln in unit.splitlines() if ln.startswith(key + "=")]


def test_boot_unit_exports_into_the_textfile_not_run():
    u = persist.boot_unit("/opt/hkgpu-tune/bin/hkgpu-tune", ["link", "ethtool"])
    assert "/run/hkgpu-tune.prom" not in u and "--prometheus" not in u
    assert keys(u, "ExecStartPost") == ["-/opt/hkgpu-tune/bin/hkgpu-tune export --profile /etc/hkgpu-tune/profile.yaml"]
    assert keys(u, "EnvironmentFile") == ["-/etc/hkgpu-tune/export.env"]


def test_timer_at_boot_and_every_five_minutes_by_default():
    t = render("hkgpu-tune-verify.timer.j2")
    assert keys(t, "OnBootSec") == ["1min"] and keys(t, "OnUnitActiveSec") == ["5min"]
    assert keys(t, "Unit") == ["hkgpu-tune-verify.service"] and keys(t, "WantedBy") == ["timers.target"]
    t = render("hkgpu-tune-verify.timer.j2", hkgpu_verify_interval="30s", hkgpu_verify_boot_delay="10s")
    assert keys(t, "OnBootSec") == ["10s"] and keys(t, "OnUnitActiveSec") == ["30s"]


def test_service_runs_export_into_the_directory_the_boot_unit_reads():
    s = render("hkgpu-tune-verify.service.j2", hkgpu_verify_textfile_dir="/srv/textfile")
    cmd = keys(s, "ExecStart")[0].split()
    assert cmd[1] == "export" and cmd[cmd.index("--textfile-dir") + 1] == "/srv/textfile" and "--probes" not in cmd
    env = render("export.env.j2", hkgpu_verify_textfile_dir="/srv/textfile")
    assert re.search(r"^HKGPU_TUNE_TEXTFILE_DIR=/srv/textfile$", env, re.M)
    # a oneshot that stays active would never run again from the timer
    assert "RemainAfterExit" not in s and keys(s, "Type") == ["oneshot"]
    assert keys(s, "SuccessExitStatus") == ["2"]        # drift is in the textfile, not a failed unit
    assert "--probes" in keys(render("hkgpu-tune-verify.service.j2", hkgpu_verify_probes=True), "ExecStart")[0]


def test_role_writes_the_timer_and_env_and_enables_the_timer():
    with open(os.path.join(ROLE, "vars", "main.yml")) as f:
        v = yaml.safe_load(f)
    paths = [x["path"] for x in v["__hkgpu_verify_files"]]
    assert paths == ["{{ __hkgpu_verify_unit_path }}", "{{ __hkgpu_verify_timer_path }}", "{{ __hkgpu_verify_env_path }}"]
    assert v["__hkgpu_verify_env_path"] == "/" + persist.EXPORT_ENV
    with open(os.path.join(ROLE, "tasks", "main.yml")) as f:
        tasks = f.read()
    assert "timers.target.wants" in tasks and "systemctl restart {{ __hkgpu_verify_timer_name | quote }}" in tasks
