"""Every unit the tool renders is written with systemd's own quoting: a path with spaces stays
one argument, '%' is not a specifier, '$' is not a variable, quotes and backslashes arrive as
they are, and `systemd-analyze verify` accepts the unit; a line break never reaches a unit. The
roles' filter plugin writes exactly what the library writes."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from hkgpu_tune.core import unitfile
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.serve.running import forms
from hkgpu_tune.tune import persist

from ..helpers import role_filters
from ..triton.conftest import HAVE_PYTRITON, dump, profile_dict

HOSTILE = ["/srv/my models/v1", "100%", "%n%i%h", "$HOME", "${PATH}", "a\"b", "it's", "back\\slash", ";", "",
           "--opt=a b"]
PLACE = {"cpus": [0], "mems": [], "numa_node": None, "source": "test"}
analyze_needed = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze (Debian's systemd)")


def systemd_split(line: str) -> list[str]:
    """How systemd reads a command line back (systemd.service(5) "Command lines"), written here
    from the manual and not from the renderer: words split on whitespace, double quotes group,
    backslash escapes inside them; then '%%' is '%' and '$$' is '$'."""
    out, cur, i, quoted, started = [], "", 0, False, False
    while i < len(line):
        c = line[i]
        if quoted:
            if c == "\\":
                cur += {"n": "\n", "t": "\t"}.get(line[i + 1], line[i + 1])
                i += 1
            elif c == '"':
                quoted = False
            else:
                cur += c
        elif c == '"':
            quoted, started = True, True
        elif c in " \t":
            if started:
                out.append(cur)
            cur, started = "", False
        else:
            assert c != "\\" or line[i + 1] not in " ", line
            cur += c
            started = True
        i += 1
    if started:
        out.append(cur)
    assert not quoted
    spec = re.compile(r"%(.)")
    for w in out:   # an unescaped specifier or variable would be expanded by systemd
        assert all(m.group(1) == "%" for m in spec.finditer(w.replace("%%", ""))) or "%" not in w.replace("%%", "")
    return [w.replace("%%", "%").replace("$$", "$") for w in out]


def test_every_hostile_argument_comes_back_as_it_was():
    argv = ["/opt/my tools/bin/prog"] + HOSTILE
    line = unitfile.exec_line(argv)
    assert "\n" not in line
    assert systemd_split(line) == argv
    assert "%n" not in line.replace("%%", "") and "$HOME" not in line.replace("$$", "")


@pytest.mark.parametrize("bad", ["a\nExecStartPre=/bin/sh -c id", "a\rb", "a\x00b", "a\u2028b"])
def test_a_line_break_is_refused(bad):
    for f in (lambda: unitfile.exec_line(["/bin/true", bad]), lambda: unitfile.environment("X", bad),
              lambda: unitfile.path("/srv/" + bad), lambda: unitfile.value(bad)):
        with pytest.raises(unitfile.UnitValueError, match="line break or control character"):
            f()


def test_the_roles_filters_write_what_the_library_writes():
    f = role_filters()
    for v in HOSTILE:
        assert f["hkgpu.tune.systemd_exec"](["/usr/bin/x", v]) == unitfile.exec_line(["/usr/bin/x", v])
        assert f["hkgpu.tune.systemd_env"]("K", v) == unitfile.environment("K", v)
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError):
        f["hkgpu.tune.systemd_exec"](["/usr/bin/x", "a\nb"])
    with pytest.raises(AnsibleFilterError):
        f["hkgpu.tune.systemd_envfile"]("/srv/a\nEVIL=1")


def analyze(tmp_path, name, text):
    d = tmp_path / "units"
    d.mkdir(exist_ok=True)
    (d / name).write_text(text)
    p = subprocess.run(["systemd-analyze", "verify", "--man=no", "--generators=no", str(d / name)],
                       capture_output=True, text=True, timeout=120)
    return [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]


@analyze_needed
@pytest.mark.skipif(not HAVE_PYTRITON, reason="needs the nvidia-pytriton wheel (the binary the unit runs)")
def test_a_triton_unit_from_hostile_profile_values_verifies_and_keeps_them(tmp_path):
    repo = str(tmp_path / "my models" / "100% $HOME 'q'")
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    doc["triton"].update(model_repository=repo, user="triton-server", extra_args=["--log-file=/tmp/a b%h$x"])
    from hkgpu_tune.serve.schema.config import section
    t = section(parse_profile_text(dump(doc), str(tmp_path / "p.yaml")))
    text = forms.render_unit(t, PLACE)
    assert analyze(tmp_path, "hkgpu-triton.service", text) == []
    execs = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("ExecStart=")]
    argv = systemd_split(execs[0])
    assert argv == forms.command(t, PLACE)
    assert f"--model-repository={repo}" in argv and "--log-file=/tmp/a b%h$x" in argv
    ro = next(ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("ReadOnlyPaths="))
    assert systemd_split(ro) == [repo]


@analyze_needed
def test_the_boot_unit_with_an_entry_point_under_a_path_with_spaces_verifies(tmp_path):
    d = tmp_path / "my venv" / "bin"
    d.mkdir(parents=True)
    exe = d / "hkgpu-tune"
    exe.write_text("#!/bin/sh\n")
    os.chmod(exe, 0o755)
    text = persist.boot_unit([str(exe)], ["link", "ethtool"])
    assert analyze(tmp_path, persist.UNIT_NAME, text) == []
    line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    assert systemd_split(line.split("=", 1)[1]) == [str(exe), "apply", "--profile", "/etc/hkgpu-tune/profile.yaml",
                                                    "--only", "link,ethtool"]
