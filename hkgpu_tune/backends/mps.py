"""The CUDA MPS control daemon: start, commands through its control pipe, quit. Works without systemd.

>>> mps = MpsControl()                                               # doctest: +SKIP
>>> mps.start("/tmp/mps-pipe", "/tmp/mps-log", gpus=[0])             # doctest: +SKIP
>>> mps.send("/tmp/mps-pipe", "get_default_active_thread_percentage")  # doctest: +SKIP
'100.0'
>>> mps.stop("/tmp/mps-pipe")                                        # doctest: +SKIP
"""
from __future__ import annotations

import errno
import os
import pwd
import stat
import subprocess
import time

from hkgpu_tune.core.errors import ApplyError, HkError, UnsupportedError
from hkgpu_tune.backends.command import Command
from hkgpu_tune.core.fsutil import program_refusal

CONTROL = "nvidia-cuda-mps-control"


def mps_env(pipe_dir: str, log_dir: str | None = None, gpus=None) -> dict:
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe_dir}
    if log_dir:
        env["CUDA_MPS_LOG_DIRECTORY"] = log_dir
    if gpus is not None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"   # the same numbering as NVML
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return env


# Where the profile may put MPS pipe and log directories (checked at parse time): places meant
# for a service's runtime, log or state files. A directory is strictly below one of them.
SAFE_DIR_ROOTS = ("/run", "/var/run", "/tmp", "/var/lib/hkgpu-tune", "/var/log", "/srv")


def safe_root(path: str) -> str | None:
    """The allowed root `path` lies under ('' parts, '..' and links in the name itself are refused
    elsewhere), or None."""
    return next((r for r in SAFE_DIR_ROOTS if path.startswith(r + "/") and len(path) > len(r) + 1), None)


def _trusted(st, euid: int) -> bool:
    """A directory no one but root (or us) can change the contents of."""
    return st.st_uid in (0, euid) and not st.st_mode & 0o022


def _open_dir(name: str, dir_fd: int, path: str) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ApplyError(f"{path}: a link or not a directory: refused (the tool never follows links here)") from None
        raise


def ensure_dir(path: str, mode: int, user: str) -> bool:
    """Make `path` a directory with `mode`, owned by `user`; True when this call created it.

    A directory the tool creates is given to `user`. One that exists is never chowned: it must
    already belong to `user` and not be writable by group or others, else ApplyError (only its
    mode is set). Every part below the allowed root is opened without following links, and
    each existing parent must be owned by root (or us) and not writable by others.
    """
    root = safe_root(path)
    if root is None or os.path.normpath(path) != path:
        raise ApplyError(f"{path}: not a directory under {', '.join(SAFE_DIR_ROOTS)}: refused")
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise ApplyError(f"{path}: no user {user!r} on this host") from None
    euid = os.geteuid()
    parts = path[len(root) + 1:].split("/")
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)   # the system's own (may be a link: /var/run)
    except FileNotFoundError:
        if os.path.dirname(root) != "/var/lib":
            raise ApplyError(f"{path}: {root} does not exist") from None
        os.makedirs(root, mode=0o755, exist_ok=True)          # /var/lib/hkgpu-tune, the tool's own
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        done = root
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            done += "/" + name
            created = False
            try:
                nfd = _open_dir(name, fd, done)
            except FileNotFoundError:
                try:
                    os.mkdir(name, 0o700 if last else 0o755, dir_fd=fd)
                    created = True
                except FileExistsError:
                    pass       # made in between by someone else: checked as an existing one below
                nfd = _open_dir(name, fd, done)
            os.close(fd)
            fd = nfd
            st = os.fstat(fd)
            if created:
                if euid == 0 and last:
                    os.fchown(fd, pw.pw_uid, pw.pw_gid)
                os.fchmod(fd, mode if last else 0o755)
                if last:
                    return True
                continue
            if not last:
                if not _trusted(st, euid) and not (st.st_uid == 0 and st.st_mode & stat.S_ISVTX):
                    raise ApplyError(f"{done}: owned by uid {st.st_uid} or writable by others: refused as a "
                                     f"parent of {path}")
                continue
            if st.st_uid != pw.pw_uid or st.st_mode & 0o022:
                raise ApplyError(f"{path}: exists, owned by {_owner(st.st_uid)} with mode "
                                 f"{stat.S_IMODE(st.st_mode):04o}; not made by hkgpu-tune, so it is not taken over "
                                 f"(wanted: owner {user}, not writable by others): remove it or fix it by hand")
            if stat.S_IMODE(st.st_mode) != mode:
                os.fchmod(fd, mode)
            return False
    except OSError as e:
        raise ApplyError(f"{path}: {e.strerror}", e.errno) from None
    finally:
        os.close(fd)
    return False


def set_dir_mode(path: str, mode: int) -> None:
    """Put back the mode of a directory (never its owner), without following links."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as e:
        raise ApplyError(f"{path}: {e.strerror}: mode not restored", e.errno) from None
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def dir_state(path: str) -> str | None:
    """'0755 user' for a directory, 'link' / 'not a directory' for anything else, None when missing."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        return "link"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    return f"{stat.S_IMODE(st.st_mode):04o} {_owner(st.st_uid)}"


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class MpsControl:
    def __init__(self, cmd: Command | None = None):
        self.cmd = cmd or Command()

    def binary(self) -> str | None:
        return self.cmd.which(CONTROL) or next(
            (p for p in ("/usr/local/nvidia/bin/" + CONTROL,) if os.path.exists(p)), None)

    def _exe(self) -> str:
        exe = self.binary()
        if exe is None:
            raise UnsupportedError(f"{CONTROL} not found (NVIDIA driver utilities not installed)")
        refused = program_refusal(exe)
        if refused:
            raise HkError(refused)
        return exe

    def send(self, pipe_dir: str, line: str, timeout: float = 5.0) -> str:
        """One command through the control pipe; its answer. HkError when no daemon answers."""
        exe = self._exe()
        try:
            p = subprocess.run([exe], input=line + "\n", capture_output=True, text=True, timeout=timeout,
                               env={**os.environ, **mps_env(pipe_dir)})
        except subprocess.TimeoutExpired:
            raise HkError(f"MPS control ({pipe_dir}): no answer to {line.split()[0]!r} in {timeout:g} s") from None
        out = (p.stdout or "").strip()
        if p.returncode != 0 or "Cannot find MPS control daemon" in out:
            raise HkError(f"MPS control ({pipe_dir}): {(p.stderr or out).strip() or f'exit {p.returncode}'}")
        return out

    def alive(self, pipe_dir: str) -> bool:
        try:
            if not os.listdir(pipe_dir):
                return False  # an empty pipe directory: no daemon made its pipes here
        except OSError:
            return False
        try:
            self.send(pipe_dir, "get_server_list", timeout=3)
            return True
        except HkError:
            return False

    def health(self, pipe_dir: str) -> dict:
        """The probe NVIDIA's k8s device plugin uses: server list and default thread percentage."""
        out = {"alive": False, "servers": [], "default_active_thread_percentage": None,
               "pids": self.processes(pipe_dir)}
        if not self.alive(pipe_dir):
            return out
        out["alive"] = True
        out["servers"] = [int(x) for x in self.send(pipe_dir, "get_server_list").split() if x.isdigit()]
        out["default_active_thread_percentage"] = _number(self.send(pipe_dir, "get_default_active_thread_percentage"))
        return out

    def start(self, pipe_dir: str, log_dir: str, gpus=None, user: str | None = None, timeout: float = 10) -> None:
        """`nvidia-cuda-mps-control -d` with the directories in its environment; waits until it answers."""
        exe = self._exe()
        env = {**os.environ, **mps_env(pipe_dir, log_dir, gpus)}
        kw = {}
        if user and os.geteuid() == 0 and user != "root":
            kw["user"] = user
        try:
            p = subprocess.run([exe, "-d"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=env, timeout=timeout, **kw)
        except subprocess.TimeoutExpired:
            raise ApplyError(f"{CONTROL} -d: did not return in {timeout} s") from None
        if p.returncode != 0:
            raise ApplyError(f"{CONTROL} -d: {p.stderr.strip() or f'exit {p.returncode}'}{_log_tail(log_dir)}")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.alive(pipe_dir):
                return
            time.sleep(0.05)
        raise ApplyError(f"{CONTROL} -d started but does not answer on {pipe_dir}{_log_tail(log_dir)}")

    def processes(self, pipe_dir: str) -> list[int]:
        """PIDs of MPS control daemons and servers that use this pipe directory."""
        import psutil
        out = []
        for p in psutil.process_iter(["name"]):
            try:
                if (p.info["name"] or "").startswith("nvidia-cuda-mps") and \
                        os.path.normpath(p.environ().get("CUDA_MPS_PIPE_DIRECTORY", "")) == os.path.normpath(pipe_dir):
                    out.append(p.pid)
            except (psutil.Error, OSError):
                continue
        return sorted(out)

    def daemon(self, pipe_dir: str) -> dict | None:
        """The running control daemon of this pipe directory as the kernel shows it: its pid, user
        and the environment it was started with (the GPUs it serves, its log directory); None
        when none runs. What it runs with, not what its unit file now says."""
        import psutil
        for pid in self.processes(pipe_dir):
            try:
                p = psutil.Process(pid)
                if not any(os.path.basename(a) == CONTROL for a in p.cmdline()):
                    continue   # an MPS server, not the control daemon
                env = p.environ()
                return {"pid": pid, "user": p.username(),
                        "gpus": env.get("CUDA_VISIBLE_DEVICES"), "log_dir": env.get("CUDA_MPS_LOG_DIRECTORY")}
            except (psutil.Error, OSError):
                continue
        return None

    def stop(self, pipe_dir: str, timeout: float = 15) -> None:
        """`quit`, then wait until the daemon and its servers have exited."""
        if self.alive(pipe_dir):
            self.send(pipe_dir, "quit")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.processes(pipe_dir):
                return
            time.sleep(0.05)
        raise ApplyError(f"MPS control ({pipe_dir}): processes {self.processes(pipe_dir)} still there "
                         f"{timeout:g} s after quit")


def _number(s: str):
    try:
        return float(s.split()[-1])
    except (ValueError, IndexError):
        return None


def _log_tail(log_dir: str) -> str:
    try:
        with open(os.path.join(log_dir, "control.log")) as f:
            lines = f.read().strip().splitlines()[-3:]
        return " (control.log: " + " | ".join(lines) + ")" if lines else ""
    except OSError:
        return ""
