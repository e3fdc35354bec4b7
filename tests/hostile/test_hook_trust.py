"""Health hooks run as root: a program another user owns or can write (itself, a file it names,
or any directory above them) is refused and never started; nothing a hook starts, even in a
session of its own or double-forked, outlives the hook's timeout."""
import os
import stat
import subprocess
import sys
import time

import pytest

from hkgpu_tune.observe.hooks import run_hook

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files of other owners")


def script(path, body, mode=0o755):
    path.write_text("#!/bin/sh\n" + body)
    os.chmod(path, mode)
    return str(path)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def d(tmp_path):
    os.chmod(tmp_path, 0o755)
    return tmp_path


def test_a_program_another_user_owns_is_not_run(d):
    mark = d / "ran"
    prog = script(d / "hook", f"touch {mark}\n")
    os.chown(prog, NOBODY, -1)
    rec = run_hook([prog], {}, 5)
    assert not rec["ok"] and rec["pid"] is None and "refused" in rec["error"] and "uid 65534" in rec["error"]
    assert not mark.exists()


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_a_program_others_can_write_is_not_run(d, mode):
    mark = d / "ran"
    prog = script(d / "hook", f"touch {mark}\n", mode)
    os.chown(prog, 0, NOBODY)          # group nogroup: group-writable by another group
    rec = run_hook([prog], {}, 5)
    assert not rec["ok"] and "writable by other users" in rec["error"] and not mark.exists()


def test_a_program_in_a_directory_another_user_can_write_is_not_run(d):
    sub = d / "sub" / "bin"
    sub.mkdir(parents=True)
    mark = d / "ran"
    prog = script(sub / "hook", f"touch {mark}\n")
    os.chown(d / "sub", NOBODY, -1)    # the grand-parent: nobody could rename bin/ and put another there
    rec = run_hook([prog], {}, 5)
    assert not rec["ok"] and str(d / "sub") in rec["error"] and not mark.exists()


def test_a_link_to_a_program_through_a_foreign_link_is_not_run(d):
    mark = d / "ran"
    prog = script(d / "hook", f"touch {mark}\n")
    sub = d / "world"
    sub.mkdir()
    os.chmod(sub, 0o1777 & ~0o1000 | 0o777)   # world-writable, not sticky
    os.symlink(prog, sub / "hook")
    rec = run_hook([str(sub / "hook")], {}, 5)
    assert not rec["ok"] and "writable by other users" in rec["error"] and not mark.exists()


def test_a_script_another_user_owns_given_to_a_trusted_interpreter_is_not_run(d):
    mark = d / "ran"
    s = d / "drain.sh"
    s.write_text(f"touch {mark}\n")
    os.chown(s, NOBODY, -1)
    rec = run_hook(["/bin/sh", str(s)], {}, 5)
    assert not rec["ok"] and "drain.sh" in rec["error"] and not mark.exists()


def test_a_trusted_program_runs(d):
    mark = d / "ran"
    prog = script(d / "hook", f"touch {mark}\n")
    rec = run_hook([prog], {}, 5)
    assert rec["ok"] and mark.exists(), rec


def test_a_child_in_its_own_session_dies_at_the_timeout(d):
    pidf = d / "pid"
    # the hook's child leaves the hook's process group and session, then the hook waits forever
    prog = script(d / "hook", f"setsid sh -c 'echo $$ > {pidf}; exec sleep 300' &\n"
                              f"while [ ! -s {pidf} ]; do sleep 0.05; done\nsleep 300\n")
    t0 = time.monotonic()
    rec = run_hook([prog], {}, 1)
    assert rec["timed_out"] and time.monotonic() - t0 < 8
    pid = int(pidf.read_text())
    assert not alive(pid), f"the hook's setsid child {pid} outlived the timeout"


def test_a_double_forked_daemon_left_by_a_hook_that_exits_is_ended(d):
    pidf = d / "pid"
    code = ("import os,sys,time\n"
            "if os.fork():\n"
            f"    while not os.path.getsize({str(pidf)!r}) if os.path.exists({str(pidf)!r}) else True: time.sleep(0.02)\n"
            "    sys.exit(0)\n"
            "os.setsid()\n"
            "if os.fork(): sys.exit(0)\n"
            f"open({str(pidf)!r},'w').write(str(os.getpid())); time.sleep(300)\n")
    prog = d / "daemon.py"
    prog.write_text(code)
    # the hook returns at once; its grandchild is reparented (to init without a subreaper)
    rec = run_hook([sys.executable, str(prog)], {}, 5)
    pid = int(pidf.read_text())
    assert not alive(pid), f"the daemon {pid} the hook left outlived it"
    assert rec["rc"] == 0


def test_the_profile_refuses_a_relative_or_dotted_program(tmp_path):
    for prog in ("drain", "/usr/../tmp/x"):
        f = tmp_path / "p.yaml"
        f.write_text(f"name: x\nhealth:\n  on_unhealthy: [{prog}]\n")
        p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "health", "--profile", str(f), "--no-hooks"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and f"{f}:3" in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("argv", [
    ["/bin/sh", "-c", "/usr/bin/id > {mark}"],
    ["/bin/bash", "-ec", "touch {mark}"],
    ["/usr/bin/env", "touch", "{mark}"],          # a program found by name on PATH
    ["/bin/sh", "-s"],
    [sys.executable, "-c", "open('{mark}', 'w')"],
    ["/usr/bin/perl", "-e", "open(F, '>{mark}')"],
])
def test_a_string_of_code_is_not_a_hook(d, argv):
    """A shell's -c string (or an interpreter's -c/-e code, or a launcher naming a program by name)
    runs whatever the string names: no trust check sees into it. Refused at run time and in the
    profile (file:line), nothing runs."""
    mark = d / "ran"
    argv = [a.replace("{mark}", str(mark)) for a in argv]
    rec = run_hook(argv, {}, 5)
    assert not rec["ok"] and rec["pid"] is None and "refused" in rec["error"] and not mark.exists(), rec
    f = d / "p.yaml"
    import json
    f.write_text(f"name: x\nhealth:\n  on_unhealthy: {json.dumps(argv)}\n")
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "health", "--profile", str(f), "--no-hooks"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and f"{f}:3" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_trusted_script_given_to_a_shell_still_runs(d):
    mark = d / "ran"
    s = d / "drain.sh"
    s.write_text(f"touch {mark}\n")
    rec = run_hook(["/bin/sh", str(s)], {}, 5)
    assert rec["ok"] and mark.exists(), rec
