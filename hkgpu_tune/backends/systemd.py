"""systemd through `systemctl` (no D-Bus library needed).

>>> sd = Systemd()                                  # doctest: +SKIP
>>> sd.available(), sd.is_active("nvidia-persistenced.service")   # doctest: +SKIP
(True, True)
"""
from __future__ import annotations

import os

from hkgpu_tune.core.errors import ApplyError, UnsupportedError
from hkgpu_tune.core.fsutil import atomic_write
from hkgpu_tune.backends.command import Command

UNIT_DIR = "/etc/systemd/system"


class Systemd:
    def __init__(self, cmd: Command | None = None, root: str = "/"):
        self.cmd = cmd or Command()
        self.root = root

    def available(self) -> bool:
        """True where systemd is the service manager (sd_booted(): /run/systemd/system exists)."""
        return os.path.isdir(os.path.join(self.root, "run/systemd/system")) and self.cmd.which("systemctl") is not None

    def why_not(self) -> str:
        if self.cmd.which("systemctl") is None:
            return "systemctl not installed"
        return "systemd is not the service manager here (PID 1 is not systemd)"

    def _need(self):
        if not self.available():
            raise UnsupportedError(self.why_not())

    def _ctl(self, *args, check=True, timeout: float = 60):
        self._need()
        r = self.cmd.run(["systemctl", *args], timeout=timeout)
        if check and r.rc != 0:
            raise ApplyError(f"systemctl {' '.join(args)}: {(r.err or r.out).strip() or f'exit {r.rc}'}")
        return r

    def is_active(self, unit: str) -> bool:
        return self._ctl("is-active", "--quiet", unit, check=False).rc == 0

    def is_enabled(self, unit: str) -> bool:
        return self._ctl("is-enabled", "--quiet", unit, check=False).rc == 0

    def exists(self, unit: str) -> bool:
        r = self._ctl("list-unit-files", "--no-legend", unit, check=False)
        return r.rc == 0 and unit in r.out

    def enable(self, unit: str, now: bool = True) -> None:
        self._ctl("enable", *(["--now"] if now else []), unit)

    def disable(self, unit: str, now: bool = True) -> None:
        self._ctl("disable", *(["--now"] if now else []), unit)

    def start(self, unit: str) -> None:
        self._ctl("start", unit)

    def stop(self, unit: str, timeout: float = 60) -> None:
        """systemctl stop, waited for up to `timeout` s (the unit's TimeoutStopSec can be longer than 60)."""
        self._ctl("stop", unit, timeout=timeout)

    def daemon_reload(self) -> None:
        self._ctl("daemon-reload")

    def unit_path(self, unit: str) -> str:
        return os.path.join(self.root, UNIT_DIR.lstrip("/"), unit)

    def read_unit(self, unit: str) -> str | None:
        try:
            with open(self.unit_path(unit)) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def write_unit(self, unit: str, text: str | None) -> None:
        """Write (or with None remove) a unit file atomically; the caller reloads."""
        path = self.unit_path(unit)
        if text is None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, text, mode=0o644)
