"""Registry of subsystems by name, in apply order (rollback runs in reverse)."""
from __future__ import annotations

import importlib

# name -> module; each module defines a class `Plugin`
ORDER = ["sysctl", "link", "ethtool", "qdisc", "gpu", "mps", "affinity", "triton"]


def get(name: str):
    try:
        mod = importlib.import_module(f"hkgpu_tune.subsystems.{name}")
    except ImportError:
        return None
    return getattr(mod, "Plugin", None)


def available() -> list[str]:
    return [n for n in ORDER if get(n) is not None]
