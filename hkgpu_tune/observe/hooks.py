"""Health hooks: a program run in a process group of its own, killed as a group at its timeout."""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time

OUTPUT_TAIL = 2000
KILL_GRACE_S = 2.0


def run_hook(argv, env_extra: dict, timeout_s: float) -> dict:
    """Run a hook in a process group of its own; past timeout_s the whole group gets SIGTERM,
    then SIGKILL after a short grace. Output goes to a file (a pipe could be held open by a
    grandchild) and its tail is kept."""
    t0 = time.monotonic()
    rec = {"argv": list(argv), "pid": None, "rc": None, "timed_out": False, "ok": False,
           "error": None, "output": "", "seconds": 0.0}
    env = {**os.environ, **env_extra}
    with tempfile.TemporaryFile() as out:
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
            _kill_group(p)
        else:
            _kill_group(p, grace=0)    # what the hook left running in its group goes too
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


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_group(p: subprocess.Popen, grace: float = KILL_GRACE_S) -> None:
    pgid = p.pid   # start_new_session: the group's id is the leader's pid
    if grace > 0 or p.poll() is None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if p.poll() is not None and not _group_alive(pgid):
                break
            time.sleep(0.02)
    elif not _group_alive(pgid):
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()
    # members of the group are not our children: wait until the kernel has removed them
    deadline = time.monotonic() + 5
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
