"""Registry of subsystems by name, in apply order (rollback runs in reverse)."""
from __future__ import annotations

import importlib

# subsystem -> the profile section it reads; each module defines a class `Plugin`
SECTION = {"sysctl": "sysctl", "link": "network", "ethtool": "network", "qdisc": "network",
           "firewall": "network", "rdma": "network",
           "gpu": "gpu", "mig": "gpu", "mps": "mps", "affinity": "affinity", "triton": "triton"}
ORDER = list(SECTION)


def get(name: str):
    """The Plugin class of a subsystem in ORDER (imported on first use)."""
    return importlib.import_module(f"hkgpu_tune.subsystems.{name}").Plugin


# sections that feed a subsystem besides its own (tcp_buffers derives sysctl's buffer keys)
ALSO = {"sysctl": ("tcp_buffers",)}


def for_sections(sections) -> list[str]:
    """The subsystems, in order, that the given profile sections need."""
    return [n for n in ORDER if SECTION[n] in sections or any(a in sections for a in ALSO.get(n, ()))]
