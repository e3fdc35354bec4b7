"""Jinja filters that write a value into a systemd unit with systemd's own quoting (the rules of
hkgpu_tune.core.unitfile, which renders the tool's own units; tests/hostile/test_unit_quoting.py
checks that both give the same text). The controller need not have hkgpu_tune installed.

    ExecStart={{ [hkgpu_cli, 'export', '--profile', hkgpu_profile_path] | hkgpu.tune.systemd_exec }}
    Environment={{ 'HKGPU_TUNE_STATE_DIR' | hkgpu.tune.systemd_env(hkgpu_state_dir) }}
"""
import os
import re

from ansible.errors import AnsibleFilterError

_CTRL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_PLAIN = re.compile(r"[A-Za-z0-9_./:=,+@%$-]+")


def _check(s):
    s = str(s)
    if _CTRL.search(s):
        raise AnsibleFilterError(f"{s!r}: a line break or control character cannot be written to a systemd unit")
    return s


def _escape(s):
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")


def word(s):
    s = _check(s)
    if s and _PLAIN.fullmatch(s) and s != ";":
        return s.replace("%", "%%").replace("$", "$$")
    return '"' + _escape(s).replace("$", "$$") + '"'


def exec_line(argv):
    argv = list(argv)
    if not argv or not os.path.isabs(str(argv[0])):
        raise AnsibleFilterError(f"{argv[:1]!r}: the program of a unit's command must be an absolute path")
    return " ".join(word(a) for a in argv)


def environment(key, value):
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)):
        raise AnsibleFilterError(f"{key!r}: not an environment variable name")
    s = _check(f"{key}={value}")
    return s.replace("%", "%%") if _PLAIN.fullmatch(s) else '"' + _escape(s) + '"'


def envfile_value(value):
    """A value in an EnvironmentFile= (no specifiers there; double quotes with backslash escapes)."""
    s = _check(value)
    if re.fullmatch(r"[A-Za-z0-9_./:=,+@%-]+", s):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`") + '"'


class FilterModule:
    def filters(self):
        return {"systemd_exec": exec_line, "systemd_env": environment, "systemd_envfile": envfile_value}
