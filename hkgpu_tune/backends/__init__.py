"""Thin adapters over the outside world. Tests swap these, nothing else.

>>> b = Backends(sysctl=FakeSysctl({"net.core.rmem_max": "212992"}))  # doctest: +SKIP
"""
from __future__ import annotations

import importlib

# attribute -> "module:factory"
DEFAULTS = {
    "sysctl": "hkgpu_tune.backends.procfs:ProcSys",
    "net": "hkgpu_tune.backends.netlink:Net",
    "ethtool": "hkgpu_tune.backends.netlink:Ethtool",
    "tc": "hkgpu_tune.backends.netlink:Tc",
    "cmd": "hkgpu_tune.backends.command:Command",
    "nvml": "hkgpu_tune.backends.nvml:Nvml",
    "systemd": "hkgpu_tune.backends.systemd:Systemd",
    "sysfs": "hkgpu_tune.backends.procfs:SysFs",
}


class Backends:
    """Lazily built backends; pass overrides as keyword arguments."""

    def __init__(self, **overrides):
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        if name.startswith("_") or name not in DEFAULTS:
            raise AttributeError(name)
        mod, cls = DEFAULTS[name].split(":")
        obj = getattr(importlib.import_module(mod), cls)()
        self.__dict__[name] = obj
        return obj

    def close(self):
        for v in list(self.__dict__.values()):
            if hasattr(v, "close"):
                try:
                    v.close()
                except Exception:  # noqa: BLE001 - best effort on exit
                    pass
