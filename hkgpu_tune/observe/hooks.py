"""Run a program root was told to run (a health hook): only a trusted one, and nothing it starts
outlives its timeout.

Trust: the program, every file the command names by absolute path, and every directory above
them must be owned by root (or the user running the tool) and closed to other users
(fsutil.check_trusted). Tracking: while the hook runs this process is a child subreaper
(PR_SET_CHILD_SUBREAPER), so a descendant that starts its own session or double-forks is
reparented here instead of to init; when the hook ends or its time is up, every process that
descends from it (or was reparented here meanwhile) gets SIGTERM, then SIGKILL, until none is left.

>>> rec = run_hook(["/usr/local/sbin/drain"], {"HKGPU_HEALTH_STATUS": "degraded"}, 30)  # doctest: +SKIP
>>> rec["ok"], rec["rc"]                                                                  # doctest: +SKIP
(True, 0)
"""
from __future__ import annotations

import ctypes
import os
import re
import signal
import stat
import subprocess
import tempfile
import threading
import time

import psutil

from hkgpu_tune.core.fsutil import untrusted_reason

OUTPUT_TAIL = 2000
KILL_GRACE_S = 2.0
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

_lock = threading.Lock()   # one hook at a time per process: the subreaper flag is per process


SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "csh", "tcsh", "busybox"}
INTERPRETERS = re.compile(r"(python[0-9.]*|perl[0-9.]*|ruby[0-9.]*|node|nodejs|php[0-9.]*|lua[0-9.]*|awk|gawk|mawk)")
# programs that run another program found by name (on PATH) or as another user
LAUNCHERS = {"env", "nohup", "timeout", "sudo", "su", "runuser", "xargs", "nice", "ionice", "setsid", "chroot",
             "stdbuf", "doas", "pkexec", "systemd-run", "flock", "watch", "script"}


def string_refusal(argv) -> str | None:
    """Why a command is a string for another program to interpret (a shell's or an interpreter's
    -c/-e code, a launcher running a program by name), which no trust check can see into; None
    when the program it names is the program that runs."""
    name = os.path.basename(argv[0])
    if name in LAUNCHERS:
        return (f"{argv[0]} runs another program by name: name that program itself "
                "(its absolute path) as the hook")
    code = {"-c"} if name in SHELLS else {"-c", "-e", "-E", "--eval", "-r"} if INTERPRETERS.fullmatch(name) else set()
    for a in argv[1:]:
        if a in code or name in SHELLS and re.fullmatch(r"-[a-zA-Z]*c[a-zA-Z]*", a) or \
                INTERPRETERS.fullmatch(name) and re.fullmatch(r"-[a-zA-Z]*[ceE]", a) or \
                name in SHELLS and a in ("-s", "-i"):
            return (f"{argv[0]} {a} runs a string of code, which no check can see into: put the commands in a "
                    "script of root's and name that script")
    if name in SHELLS or INTERPRETERS.fullmatch(name):
        if len(argv) < 2 or argv[1].startswith("-") or not os.path.isabs(argv[1]):
            return f"{argv[0]} without a script by absolute path as its first argument: name the script"
    return None


def hook_refusal(argv) -> str | None:
    """Why this command must not run (None: it may): no string of code (string_refusal); its
    program and every existing regular file it names by absolute path must pass the trust rule."""
    why = string_refusal(argv)
    if why:
        return why
    prog = argv[0]
    if not os.path.lexists(prog):   # cannot start: reported as such, if no one else could put it there
        prog = os.path.dirname(prog)
    why = untrusted_reason(prog, "hook program" if prog == argv[0] else "directory")
    if why:
        return why
    for a in argv[1:]:
        if os.path.isabs(a):
            try:
                regular = stat.S_ISREG(os.stat(a).st_mode)
            except OSError:
                continue
            if regular:
                why = untrusted_reason(a, "file the hook names")
                if why:
                    return why
    return None


def _prctl(option: int, arg: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if option == PR_GET_CHILD_SUBREAPER:
        v = ctypes.c_int(0)
        libc.prctl(option, ctypes.byref(v), 0, 0, 0)
        return v.value
    return libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0)


def run_hook(argv, env_extra: dict, timeout_s: float) -> dict:
    """Run a hook (trusted only) with every descendant tracked; past timeout_s they all get SIGTERM,
    then SIGKILL after a short grace. Output goes to a file (a pipe could be held open by a
    grandchild) and its tail is kept."""
    t0 = time.monotonic()
    rec = {"argv": list(argv), "pid": None, "rc": None, "timed_out": False, "ok": False,
           "error": None, "output": "", "seconds": 0.0}
    why = hook_refusal(list(argv))
    if why:
        rec["error"] = f"refused: {why} (root runs only what no other user owns or can write)"
        return rec
    env = {**os.environ, **env_extra}
    with _lock, tempfile.TemporaryFile() as out:
        was = _prctl(PR_GET_CHILD_SUBREAPER)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        me = psutil.Process()
        before = {c.pid for c in me.children()}
        try:
            try:
                p = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True, close_fds=True)
            except OSError as e:
                rec["error"] = f"cannot start {argv[0]}: {e.strerror or e}"
                rec["seconds"] = time.monotonic() - t0
                return rec
            rec["pid"] = p.pid
            try:
                rec["rc"] = p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                rec["timed_out"] = True
                kill_descendants(p, before, KILL_GRACE_S)
            else:
                kill_descendants(p, before, 0)    # what the hook left running goes too
        finally:
            if not was:
                _prctl(PR_SET_CHILD_SUBREAPER, 0)
        out.seek(0, os.SEEK_END)
        size = out.tell()
        out.seek(max(0, size - OUTPUT_TAIL))
        rec["output"] = out.read().decode("utf-8", "replace")
    rec["seconds"] = round(time.monotonic() - t0, 3)
    if rec["timed_out"]:
        rec["error"] = f"killed after {timeout_s:g} s (hook_timeout_s)"
    elif rec["rc"] != 0:
        rec["error"] = f"exit status {rec['rc']}"
    rec["ok"] = rec["error"] is None
    return rec


def _tracked(p: subprocess.Popen, before: set[int]) -> list[psutil.Process]:
    """The hook's process (while it is not reaped), its descendants, and whatever was reparented to
    this process since it started (an orphan of the hook), with their descendants."""
    me = psutil.Process()
    roots = [c for c in me.children() if c.pid not in before]
    out = {}
    for r in roots:
        try:
            out[r.pid] = r
            for c in r.children(recursive=True):
                out[c.pid] = c
        except psutil.Error:
            continue
    return list(out.values())


def _reap(procs, skip: int) -> None:
    me = os.getpid()
    for c in procs:
        try:
            if c.pid != skip and c.ppid() == me:
                os.waitpid(c.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError, OSError):
            pass


def _signal_all(procs, sig) -> None:
    for c in procs:
        try:
            c.send_signal(sig)
        except psutil.Error:
            pass


def _live(procs) -> list:
    out = []
    for c in procs:
        try:
            if c.status() != psutil.STATUS_ZOMBIE:
                out.append(c)
        except psutil.Error:
            pass
    return out


def kill_descendants(p: subprocess.Popen, before: set[int], grace: float) -> None:
    """SIGTERM every tracked process, wait up to `grace`, then SIGKILL (stopping each first, so a
    forking loop cannot outrun the scan) until a scan finds none left; reap what is ours."""
    procs = _tracked(p, before)
    if grace > 0 or p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        _signal_all(procs, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            p.poll()
            procs = _live(_tracked(p, before))
            _reap(_tracked(p, before), p.pid)
            if not procs:
                break
            time.sleep(0.02)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        procs = _tracked(p, before)
        live = _live(procs)
        _signal_all(live, signal.SIGSTOP)
        _signal_all(live, signal.SIGKILL)
        p.poll()
        _reap(procs, p.pid)
        if not live and not _tracked(p, before):
            break
        time.sleep(0.01)
    if p.returncode is None:
        p.wait()
