"""Launch tritonserver: a systemd unit, a container command, or (without systemd) a supervised process.

>>> start(t); wait_ready(t); stop(t)       # doctest: +SKIP
"""
from __future__ import annotations

import grp
import json
import os
import pwd
import signal
import socket
import subprocess
import time

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.fsutil import atomic_write, check_trusted
from hkgpu_tune.serve.running import client, forms, records
from hkgpu_tune.serve.running.form_base import FORMS, form

# ---------------------------------------------------------------- start / status / stop
def _state_path(t) -> str:
    return os.path.join(t.run_dir, forms.PID_FILE)


def _load_state(t) -> dict | None:
    """The run directory's record of the process we started, trusted only when neither it nor its
    directory (nor any above) is another user's or writable by others: root signals process groups
    on its word. An untrusted record is an HkError, never read."""
    path = _state_path(t)
    if not os.path.lexists(path):
        return None
    check_trusted(os.path.abspath(path), "Triton run record")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            st = json.loads(f.read(1 << 20))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise HkError(f"{path}: cannot read the Triton run record: {e.strerror}: refused") from None
    except ValueError as e:
        raise HkError(f"{path}: not a Triton run record this tool wrote ({e}): refused") from None
    ok = (isinstance(st, dict) and isinstance(st.get("pid"), int) and not isinstance(st["pid"], bool)
          and st["pid"] > 1 and isinstance(st.get("start_ticks"), int) and isinstance(st.get("argv"), list)
          and st["argv"] and all(isinstance(a, str) for a in st["argv"]) and os.path.isabs(st["argv"][0]))
    if not ok:
        raise HkError(f"{path}: not a Triton run record this tool wrote (pid, start_ticks, argv): refused")
    return st


def _start_ticks(pid: int) -> int:
    """When a process started, in clock ticks since boot (proc(5) /proc/PID/stat field 22).
    psutil's create_time() adds the wall-clock boot time, which moves when the clock is stepped
    or slewed across a second boundary; this does not (psutil's own process identity uses it)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def _alive(st: dict | None) -> bool:
    if not st:
        return False
    import psutil
    try:
        p = psutil.Process(st["pid"])
        # the same process we started (a recycled pid has another start time or program); right after
        # exec, before the kernel has set up the new program's arguments, its cmdline reads empty:
        # that is the program starting, not gone (the start time already proves it is ours)
        cmd = p.cmdline()
        # and the server: the program we ran (by its executable, not its name), leading the session
        # we gave it, as the user we started it as
        exe = os.path.realpath(p.exe()) if p.exe() else ""
        uid = _user_ids(st["user"])[0] if st.get("user") else os.geteuid()
        ours = (_start_ticks(p.pid) == st["start_ticks"] and p.status() != psutil.STATUS_ZOMBIE
                and os.getsid(p.pid) == p.pid and p.uids().real == uid)
        if exe == os.path.realpath(st["argv"][0]):
            return ours and (not cmd or cmd == st["argv"])
        # a `server:` that is a script: its interpreter runs it (cmdline INTERPRETER [ARG] SCRIPT ARGS...),
        # or it has exec'd the server; the pid, its start time, session and user are still the ones we started
        return ours and _script(st["argv"][0])
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, OSError, HkError):
        return False


def _script(path: str) -> bool:
    """Whether the program at path is a script (starts with '#!')."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            return os.read(fd, 2) == b"#!"
        finally:
            os.close(fd)
    except OSError:
        return False


class Server:
    """A service as it runs, chosen once from its supervisor (server()): a systemd unit, or a process
    this tool supervises (a tritonserver binary or a container runtime's `run`, as its record says).
    `t` is the profile's section or a ServiceRef (rollback has no profile)."""
    name = ""       # the supervisor: systemd | process
    reaps = False   # whether the server is our child, whose exit status we read

    def __init__(self, t, backends=None):
        self.t, self.backends = t, backends

    def status(self) -> dict:
        """{'active': bool, 'state': str, 'target': str, 'pid': int|None, 'reason': str}"""
        raise NotImplementedError

    def explicit(self) -> bool:
        """Whether the running server takes loads through the repository API (explicit model control)."""
        raise NotImplementedError

    def main_pid(self) -> int | None:
        raise NotImplementedError

    def run(self, place: dict) -> dict:
        """Start the checked service with the placement; what to add to its status."""
        raise NotImplementedError

    def stop(self, timeout: float) -> dict:
        raise NotImplementedError


class Unit(Server):
    """The systemd unit hkgpu-tune renders: systemd starts, restarts and stops it."""
    name = "systemd"

    def status(self) -> dict:
        name = forms.unit_name(self.t)
        active = forms._b(self.backends).systemd.is_active(name)
        return {"active": active, "state": "active" if active else "inactive", "target": name, "pid": None,
                "reason": "" if active else f"systemctl is-active {name}: not active"}

    def explicit(self) -> bool:
        return True   # a unit is as rendered once apply has installed it

    def main_pid(self) -> int | None:
        r = forms._b(self.backends).cmd.run(["systemctl", "show", "--property=MainPID", "--value",
                                             forms.unit_name(self.t)])
        return int(r.out.strip() or 0) if r.rc == 0 and r.out.strip().isdigit() else None

    def run(self, place: dict) -> dict:
        forms.install_unit(self.t, self.backends, place)
        forms._b(self.backends).systemd.enable(forms.unit_name(self.t), now=True)
        return {}

    def stop(self, timeout: float) -> dict:
        b, name = forms._b(self.backends), forms.unit_name(self.t)
        if not b.systemd.is_active(name):
            return {"stopped": False, "how": "was not running", "left": []}
        t0 = time.monotonic()
        # KillMode=control-group: the stubs go with the server; the unit's TimeoutStopSec ends it
        b.systemd.stop(name, timeout=forms.unit_stop_s(timeout) + 15)   # systemd's own kill ends it before
        rep = {"stopped": not b.systemd.is_active(name), "how": "systemctl stop", "left": [],
               "seconds": round(time.monotonic() - t0, 2)}
        return rep | _slow_stop(rep, timeout, f"journalctl -u {name}")


class Process(Server):
    """A process in its own session that this tool started and keeps a record of (no systemd)."""
    name = "process"
    reaps = True

    def status(self) -> dict:
        st = _load_state(self.t)
        if _alive(st):
            return {"active": True, "state": "running", "target": f"process {st['pid']}", "pid": st["pid"],
                    "reason": f"started {time.strftime('%H:%M:%S', time.localtime(st['started']))}, no systemd"}
        why = "not started" if st is None else f"process {st['pid']} is gone (see {st.get('log')})"
        return {"active": False, "state": "stopped", "target": self.t.unit, "pid": None, "reason": why}

    def explicit(self) -> bool:
        st = process_record(self.t)   # a process says so in its argv
        return bool(st) and f"--model-control-mode={forms.CONTROL_MODE}" in st["argv"]

    def main_pid(self) -> int | None:
        st = process_record(self.t)
        if not st:
            return None
        return _record_form(st).main_pid(self.t, st["pid"], self.backends)

    def run(self, place: dict) -> dict:
        t, f = self.t, form(self.t.launch)
        argv = f.program(t, f.argv(t, place, self.backends))     # a MIG position: its UUID now
        user = service_user(t, self.name) if f.own_user else None
        _spawn(forms.ServiceRef.of(t, self.backends), argv, f.env(t, self.backends), user, t.launch, place)
        return {"argv": argv, "log": os.path.join(t.run_dir, forms.LOG_FILE)}

    def stop(self, timeout: float) -> dict:
        t = self.t
        st = _load_state(t)
        if not _alive(st):
            _reap(t)
            _clear_state(t)
            return {"stopped": False, "how": "was not running", "left": []}
        pid = st["pid"]
        t0 = time.monotonic()
        _record_form(st).before_signal(t, timeout)
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        how = "SIGTERM"
        grace = forms.STOP_GRACE_S if timeout > 0 else 0   # timeout 0: kill now
        while _group_members(pid) and time.monotonic() - t0 < timeout + grace:
            _reap(t)
            time.sleep(0.05)
        left = _group_members(pid)
        if left:
            how = "SIGKILL after timeout"
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 5
            while _group_members(pid) and time.monotonic() < deadline:
                _reap(t)
                time.sleep(0.05)
        if pid in _CHILDREN:
            _CHILDREN.pop(pid).wait(timeout=5)
        left = _group_members(pid)
        _clear_state(t)
        rep = {"stopped": not left, "how": how, "seconds": round(time.monotonic() - t0, 2), "left": left}
        return rep | _slow_stop(rep, timeout, st.get("log") or "its log")


SERVERS = {"systemd": Unit, "process": Process}


def _record_form(st: dict):
    """The launch form a run record names (a record without one: binary)."""
    return form(st["launch"] if st.get("launch") in FORMS else "binary")


def server(t, backends=None) -> Server:
    """The service's Server, by its supervisor (resolved: systemd where it manages services)."""
    return SERVERS[forms.supervisor(t, backends)](t, backends)


def status(t, backends=None) -> dict:
    """{'active': bool, 'state': str, 'target': str, 'pid': int|None, 'reason': str}"""
    return server(t, backends).status()


def process_record(t) -> dict | None:
    """The supervised process's record (argv, env added, pid) while it runs; None otherwise."""
    st = _load_state(t)
    return st if _alive(st) else None


def launched_as(t, backends=None) -> dict:
    """What a process started now would get: argv and the environment added to ours."""
    return {"argv": forms.command(t, backends=backends), "env": form(t.launch).env(t, backends)}


def explicit(t, backends=None) -> bool:
    """Whether the running server takes loads through the repository API (explicit model control).
    A unit is as rendered once apply has installed it; a process says so in its argv."""
    return server(t, backends).explicit()


def server_pids(t, backends=None) -> list[int]:
    """The server's process and its descendants (the Python backend stubs); [] when not running."""
    import psutil
    pid = server(t, backends).main_pid()
    if not pid:
        return []
    try:
        p = psutil.Process(pid)
        return [pid] + [c.pid for c in p.children(recursive=True)]
    except psutil.Error:
        return []


def restart(t, backends=None) -> None:
    stop(t, backends)
    start(t, backends)
    wait_ready(t, backends)


def check_ports(t) -> None:
    for key in ("http", "grpc", "metrics"):
        ep = getattr(t, key)
        if not client.port_free(ep.address, ep.port):
            raise HkError(f"triton: the {key} port {ep.port} on {ep.address} is already in use "
                          f"(another server? pick a free port under triton.{key}.port)")


def _check_repository(t) -> None:
    for m in t.models:
        if not os.path.isfile(os.path.join(t.model_repository, m.name, "config.pbtxt")):
            raise HkError(f"triton: model {m.name} is not rendered in {t.model_repository} "
                          f"(run: hkgpu-tune triton render)")


def _user_ids(name: str):
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise HkError(f"triton: user {name!r} does not exist (create it: useradd --system {name})") from None
    return pw.pw_uid, pw.pw_gid, pw.pw_dir


def _may(st: os.stat_result, uid: int, gids: set[int], bits: int) -> bool:
    """Whether uid (with groups gids) has the permission bits (4 read, 1 search) by the mode
    (POSIX ACLs are not read)."""
    if uid == 0:
        return True
    mode = st.st_mode >> 6 if st.st_uid == uid else st.st_mode >> 3 if st.st_gid in gids else st.st_mode
    return mode & bits == bits


def check_user_access(t, user: str) -> None:
    """The server runs as `user`: every path it reads (the model repository, the backends, the
    binary and, for the wheel, its libraries and PYTHONPATH) must be reachable by that user, or the
    unit fails with only "failed to stat file" in the journal. Raises naming the directory that
    blocks (e.g. a repository inside the 0700 state directory)."""
    uid, gid, _ = _user_ids(user)
    gids = {gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    paths = [t.model_repository, forms.backend_directory(t), forms.server_binary(t)]
    for k in ("LD_LIBRARY_PATH", "PYTHONPATH", "HKGPU_PYTHON_LIBRARY", "HKGPU_PYTHON_HOME"):
        paths += [p for p in forms.server_env(t).get(k, "").split(":") if p]
    for path in paths:
        path = os.path.abspath(path)
        parts = [p for p in path.split("/") if p]
        for i in range(len(parts) + 1):
            cur = "/" + "/".join(parts[:i])
            try:
                st = os.stat(cur)
            except OSError:
                break   # a path that is not there is reported by what needs it
            last = i == len(parts)
            bits = (4 | 1) if not last or os.path.isdir(cur) else 4
            if not _may(st, uid, gids, bits):
                owner = f"{pwd.getpwuid(st.st_uid).pw_name if _known_uid(st.st_uid) else st.st_uid}"
                hint = (", e.g. triton.model_repository: /var/lib/hkgpu-triton/models"
                        if path in (os.path.abspath(t.model_repository), os.path.abspath(forms.backend_directory(t))) else "")
                raise HkError(f"triton: the server runs as {user}, who cannot "
                              f"{'read' if last else 'reach'} {path}: {cur} is mode {st.st_mode & 0o7777:04o} "
                              f"owned by {owner} (put it where {user} can read it{hint}; nothing was started)")


def _known_uid(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def start(t, backends=None, place: dict | None = None) -> dict:
    """Start the service (no-op if it runs). Returns status() plus the argv and log path."""
    backends = forms._b(backends)
    cur = status(t, backends)
    if cur["active"]:
        return cur
    from hkgpu_tune.serve.repository.render import check_models
    from hkgpu_tune.serve.repository import render
    check_models(t)
    f = form(t.launch)
    f.check(t, backends)
    _check_repository(t)
    render.repository_state(t, backends)  # re-checks config.pbtxt against the schema
    place = place if place is not None else forms.placement(t, backends)
    srv = server(t, backends)
    user = service_user(t, srv.name)
    if f.own_user and user and user != "root":
        check_user_access(t, user)
    check_ports(t)
    started = srv.run(place)
    return srv.status() | started


def service_user(t, sup: str) -> str | None:
    """Who the server runs as: the profile's user; else, under systemd or when root starts it,
    DEFAULT_USER (root only when the profile names root); else the user running the tool."""
    if t.user:
        return t.user
    return forms.DEFAULT_USER if sup == "systemd" or os.geteuid() == 0 else None


def respawn_record(rec: dict) -> dict:
    """What _spawn needs to start this process again (kept by apply to undo a restart)."""
    return {k: rec.get(k) for k in ("argv", "env", "user", "launch", "placement")}


def respawn(ref: forms.ServiceRef, record: dict, backends=None) -> None:
    """Stop the supervised process and start the one described by `record` (respawn_record), once
    the record passes check_record and its paths the trust rule."""
    records.check_record(record)
    records.check_record_paths(record)
    stop(ref, backends)
    _spawn(ref, list(record["argv"]), dict(record.get("env") or {}), record.get("user"),
           record.get("launch") or "binary", record.get("placement") or {})


def _spawn(ref: forms.ServiceRef, argv: list[str], added: dict, user: str | None, launch: str, place: dict) -> int:
    """The server as a process in its own session (as `user` when root starts it), pinned to the
    placement's CPUs; its record (pid, start time, argv, env added) in the run directory."""
    os.makedirs(ref.run_dir, mode=0o755, exist_ok=True)
    check_trusted(os.path.abspath(ref.run_dir), "Triton run directory")
    check_trusted(argv[0], "Triton server program")
    if form(launch).own_user and not user and os.geteuid() == 0:
        user = forms.DEFAULT_USER   # root never starts the server as root unless the profile names root
    log = os.path.join(ref.run_dir, forms.LOG_FILE)
    env = dict(os.environ)
    env.update(added)
    kw = {}
    if user:
        if os.geteuid() == 0:
            uid, gid, home = _user_ids(user)
            kw.update(user=uid, group=gid, extra_groups=[g.gr_gid for g in grp.getgrall() if user in g.gr_mem])
            env["HOME"] = home
        elif pwd.getpwuid(os.geteuid()).pw_name != user:
            raise HkError(f"triton: starting as user {user} needs root")
    cpus = place.get("cpus") or []
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    with os.fdopen(fd, "ab") as logf:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                    cwd="/", start_new_session=True, close_fds=True, **kw)
        except OSError as e:
            raise HkError(f"triton: cannot start {argv[0]}: {e.strerror}") from None
    if cpus and form(launch).pinned:
        try:  # before it loads models (threads created later inherit the mask)
            os.sched_setaffinity(proc.pid, cpus)
        except OSError:
            pass
    st = {"pid": proc.pid, "start_ticks": _start_ticks(proc.pid), "argv": argv, "log": log,
          "started": time.time(), "placement": place, "launch": launch, "env": added, "user": user}
    try:
        atomic_write(_state_path(ref), json.dumps(st), mode=0o600)
    except HkError:   # no record, no way to stop it later: stop it now
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    _CHILDREN[proc.pid] = proc
    return proc.pid


_CHILDREN: dict[int, subprocess.Popen] = {}  # started by this process: reaped on stop


def log_tail(t, lines: int = 15) -> str:
    try:
        with open(os.path.join(t.run_dir, forms.LOG_FILE), "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    # no table rows, no frames of Python's import machinery (a model's traceback keeps its own lines)
    keep = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("+", "|", "  <frozen "))]
    return "\n".join(keep[-lines:])


def wait_ready(t, backends=None, timeout: float | None = None) -> float:
    """Poll /v2/health/ready (and each model) until 200 or the timeout; returns the seconds waited.

    With --strict-readiness the server is ready only when every model is. Raises with the log tail
    when the process exits first."""
    timeout = t.gate.ready_timeout_s if timeout is None else timeout
    backends = forms._b(backends)
    t0 = time.monotonic()
    c = client.Client(t.http.host, t.http.port, timeout=2)
    delay = 0.02
    try:
        while True:
            # HTTP answers before the metrics endpoint listens (tritonserver starts it last)
            if c.ready() and all(c.model_ready(m.name) for m in t.models) and not endpoints_down(t):
                return time.monotonic() - t0
            st = status(t, backends)
            if not st["active"] and server(t, backends).reaps:
                # our child seen not alive: it may be mid-exit (its /proc entries going away before it
                # is a zombie); its exit status says how it ended, or that it is still running
                how = _reap(t, wait_s=5.0)
                if how is None:
                    continue
                raise HkError(f"triton: the server exited before it was ready ({st['reason']}{how}):\n"
                              f"{log_tail(t) or '(the log is empty)'}")
            if not st["active"]:
                raise HkError(f"triton: {st['target']} stopped before it was ready "
                              f"(journalctl -u {st['target']} says why)")
            if time.monotonic() - t0 > timeout:
                down = endpoints_down(t) if c.ready() else []
                what = (f"the {' and '.join(down)} endpoint not answering" if down
                        else f"/v2/health/ready on {t.http.host}:{t.http.port}")
                raise HkError(f"triton: not ready after {timeout:.0f} s ({what}):\n{log_tail(t)}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.1)
    finally:
        c.close()


def _allowed(t, endpoint: str) -> bool:
    """Whether --allow-ENDPOINT in extra_args leaves it on (the last one counts, as in tritonserver)."""
    on = True
    for arg in t.extra_args:
        name, _, value = arg.partition("=")
        if name == f"--allow-{endpoint}":
            on = value.strip().lower() not in ("false", "0", "off", "no")
    return on


def endpoints_down(t) -> list[str]:
    """The gRPC and metrics endpoints the server was asked for that do not answer yet."""
    down = []
    if _allowed(t, "grpc"):
        try:
            socket.create_connection((t.grpc.host, t.grpc.port), timeout=2).close()
        except OSError:
            down.append(f"grpc ({t.grpc.host}:{t.grpc.port})")
    if _allowed(t, "metrics"):
        try:
            client.metrics_text(t.metrics.host, t.metrics.port, timeout=2)
        except HkError:
            down.append(f"metrics ({t.metrics.host}:{t.metrics.port})")
    return down


def _reap(t, wait_s: float = 0.0) -> str | None:
    """Reap our child once it has exited (waiting up to wait_s); returns how it ended (', exit code
    N'), '' when it is not our child, None when our child still runs."""
    st = _load_state(t)
    child = _CHILDREN.get(st["pid"]) if st else None
    if child is None:
        return ""
    try:
        rc = child.wait(timeout=wait_s) if wait_s else child.poll()
    except subprocess.TimeoutExpired:
        rc = None
    if rc is None:
        return None
    del _CHILDREN[st["pid"]]
    return f", killed by signal {-rc}" if rc < 0 else f", exit code {rc}"


def _group_members(pgid: int) -> list[int]:
    import psutil
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (OSError, psutil.Error):
            continue
    return out


def stop(t, backends=None, timeout: float | None = None) -> dict:
    """Stop the service; in process form SIGTERM the whole process group (server and backend stubs),
    poll until none is left, SIGKILL what remains after the timeout. Returns what happened.

    `timeout` is the server's own --exit-timeout-secs: tritonserver waits that long for open HTTP
    connections to close and models to unload, then ends itself; the SIGKILL comes STOP_GRACE_S later."""
    timeout = forms.ServiceRef.of(t, backends).stop_timeout_s if timeout is None else timeout
    return server(t, backends).stop(timeout)


def _slow_stop(rep: dict, timeout: float, log: str) -> dict:
    """A note when the server did not end before its own exit timeout (tritonserver waits that long
    for open HTTP connections and for models to unload)."""
    if timeout <= 0 or rep["seconds"] < timeout:
        return {}
    if rep["how"].startswith("SIGKILL"):
        return {"note": f"the server did not end within its exit timeout ({timeout:.0f} s) and "
                        f"{forms.STOP_GRACE_S} s more, and was killed (see {log})"}
    return {"note": f"the server used its whole exit timeout ({timeout:.0f} s): a client kept an HTTP "
                    f"connection open or a model did not unload (see {log})"}


def _clear_state(t) -> None:
    try:
        os.unlink(_state_path(t))
    except FileNotFoundError:
        pass
