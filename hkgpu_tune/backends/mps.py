"""The CUDA MPS control daemon: start, commands through its control pipe, quit. Works without systemd.

>>> mps = MpsControl()                                               # doctest: +SKIP
>>> mps.start("/tmp/mps-pipe", "/tmp/mps-log", gpus=[0])             # doctest: +SKIP
>>> mps.send("/tmp/mps-pipe", "get_default_active_thread_percentage")  # doctest: +SKIP
'100.0'
>>> mps.stop("/tmp/mps-pipe")                                        # doctest: +SKIP
"""
from __future__ import annotations

import os
import subprocess
import time

from ..errors import ApplyError, HkError, UnsupportedError
from .command import Command

CONTROL = "nvidia-cuda-mps-control"


def mps_env(pipe_dir: str, log_dir: str | None = None, gpus=None) -> dict:
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe_dir}
    if log_dir:
        env["CUDA_MPS_LOG_DIRECTORY"] = log_dir
    if gpus is not None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"   # the same numbering as NVML
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return env


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
