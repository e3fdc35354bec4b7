"""A CPU-throttled cgroup for one test subprocess: the process (and what it forks) gets a fixed share
of one CPU whatever the machine's speed or load, so a test that needs a slow client has one on a
quiet fast machine too. cgroup v1's cpu controller (cpu.cfs_quota_us) or cgroup v2's (cpu.max); the
group is named with this run's tag and removed after."""
from __future__ import annotations

import contextlib
import itertools
import os
import time

import psutil

from tests.helpers import tagged

_seq = itertools.count()


class NoCpuController(Exception):
    """No writable cgroup CPU controller on this machine (the reason is the message)."""


def _controller() -> tuple[str, str]:
    """(version "1" | "2", the mount point to create the group under)."""
    tried = []
    for part in psutil.disk_partitions(all=True):
        if part.fstype == "cgroup" and "cpu" in part.opts.split(","):
            if os.access(part.mountpoint, os.W_OK):
                return "1", part.mountpoint
            tried.append(f"{part.mountpoint} is not writable")
    for part in psutil.disk_partitions(all=True):
        if part.fstype == "cgroup2":
            with open(os.path.join(part.mountpoint, "cgroup.controllers")) as f:
                if "cpu" not in f.read().split():
                    tried.append(f"{part.mountpoint} (cgroup v2) has no cpu controller")
                    continue
            try:
                with open(os.path.join(part.mountpoint, "cgroup.subtree_control"), "w") as f:
                    f.write("+cpu")
            except OSError as e:
                tried.append(f"{part.mountpoint}: cannot enable cpu for its children: {e}")
                continue
            return "2", part.mountpoint
    raise NoCpuController("no writable cgroup cpu controller: " + ("; ".join(tried) or "none mounted"))


@contextlib.contextmanager
def cpu_share(fraction: float):
    """A cgroup limited to `fraction` of one CPU; yields a preexec_fn that moves the child process
    into it (subprocess.run(..., preexec_fn=...)). Raises NoCpuController where none can be made."""
    version, mnt = _controller()
    path = os.path.join(mnt, tagged(f"hkgpu-test-cpu{next(_seq)}"))
    try:
        os.mkdir(path)
    except OSError as e:
        raise NoCpuController(f"cannot create a cgroup under {mnt}: {e}") from None
    try:
        if version == "1":
            with open(os.path.join(path, "cpu.cfs_period_us")) as f:
                period = int(f.read())
            with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
                f.write(str(max(1000, int(period * fraction))))
        else:
            period = 100000
            with open(os.path.join(path, "cpu.max"), "w") as f:
                f.write(f"{max(1000, int(period * fraction))} {period}")
        procs = os.path.join(path, "cgroup.procs")

        def enter():   # in the child, before exec: only os calls
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        yield enter
    finally:
        _remove(path, os.path.join(mnt, "cgroup.procs"))


def _remove(path: str, parent_procs: str) -> None:
    """Remove the group; a process still in it (one the test left) goes back to the root group first."""
    for _ in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            with open(os.path.join(path, "cgroup.procs")) as f:
                left = f.read().split()
            for pid in left:
                try:
                    with open(parent_procs, "w") as f:
                        f.write(pid)
                except OSError:
                    pass   # exited meanwhile
            time.sleep(0.1)
    os.rmdir(path)   # still busy: the error names it
