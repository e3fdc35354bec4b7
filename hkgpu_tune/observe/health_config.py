"""The profile's `health:` section -> HealthConfig (errors name file:line and key)."""
from __future__ import annotations

import os
from dataclasses import dataclass

# XIDs that mean the GPU needs a reset or the node a drain (NVIDIA's XID catalogue: 48 DBE,
# 63/64 row remapping, 74 NVLink, 79 fallen off the bus, 92 high SBE rate, 94/95 contained and
# uncontained ECC, 119/120 GSP errors)
DEFAULT_XIDS = (48, 63, 64, 74, 79, 92, 94, 95, 119, 120)


@dataclass(frozen=True)
class HealthConfig:
    gpus_expected: int | None = None
    ecc_uncorrected_max: int = 0
    remapped_rows: bool = True
    retired_pages_pending: bool = True
    xids: tuple[int, ...] = DEFAULT_XIDS
    temperature_max_c: float = 85.0
    pcie_width: bool = True
    pcie_gen: bool = True
    nic_devices: tuple[str, ...] = ()
    nic_errors_max_increase: int = 0
    verify_drift: bool = False
    triton_ready: bool = False     # one check per Triton service: /v2/health/ready answers 200
    on_unhealthy: tuple[str, ...] | None = None
    on_healthy: tuple[str, ...] | None = None
    hook_timeout_s: float = 30.0
    hold_down_s: float = 300.0


KEYS = ("gpus_expected", "ecc_uncorrected_max", "remapped_rows", "retired_pages_pending", "xids",
        "temperature_max_c", "pcie_width", "pcie_gen", "nic_errors", "verify_drift", "triton_ready",
        "on_unhealthy", "on_healthy", "hook_timeout_s", "hold_down_s")


def _number(n, lo: float, hi: float, what: str) -> float:
    v = n.value() if n.kind() == "scalar" else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or not lo <= v <= hi:
        raise n.error(f"expected {what} ({lo:g}-{hi:g}), got {n._desc()}")
    return float(v)


def _argv(n) -> tuple[str, ...]:
    items = n.items()
    if not items:
        raise n.error("expected a command as a list: [/absolute/program, arg, ...], got an empty list")
    if len(items) > 64:
        raise n.error("a command of more than 64 arguments")
    argv = tuple(i.string(what="a command-line argument (a string)") for i in items)
    if not os.path.isabs(argv[0]) or os.path.normpath(argv[0]) != argv[0]:
        raise items[0].error(f"the program must be an absolute path without '.', '..' or '//' (hooks run "
                             f"as root, without a trusted PATH), got {argv[0]!r}")
    from hkgpu_tune.observe.hooks import string_refusal
    why = string_refusal(argv)
    if why:
        raise items[0].error(f"{why}: refused")
    return argv


def parse_profile(n) -> HealthConfig:
    """The `health:` section (a profile.Node) -> HealthConfig; errors name file:line and key."""
    from hkgpu_tune.core.profile import IFNAME_RE
    m = n.mapping(KEYS)
    kw: dict = {}
    if "gpus_expected" in m:
        kw["gpus_expected"] = m["gpus_expected"].integer(0, 64)
    if "ecc_uncorrected_max" in m:
        kw["ecc_uncorrected_max"] = m["ecc_uncorrected_max"].integer(0, 1 << 32)
    for k in ("remapped_rows", "retired_pages_pending", "pcie_width", "pcie_gen", "verify_drift", "triton_ready"):
        if k in m:
            kw[k] = m[k].boolean()
    if "xids" in m:
        kw["xids"] = tuple(sorted({i.integer(1, 1 << 16) for i in m["xids"].items()}))
    if "temperature_max_c" in m:
        kw["temperature_max_c"] = _number(m["temperature_max_c"], 0, 200, "degrees Celsius")
    if "nic_errors" in m:
        nm = m["nic_errors"].mapping(("devices", "max_increase"), required=("devices",))
        kw["nic_devices"] = tuple(d.string(IFNAME_RE, "an interface name (1-15 characters, no '/', ':' or spaces)")
                                  for d in nm["devices"].items())
        if "max_increase" in nm:
            kw["nic_errors_max_increase"] = nm["max_increase"].integer(0, 1 << 48)
    for k in ("on_unhealthy", "on_healthy"):
        if k in m and not m[k].is_null():
            kw[k] = _argv(m[k])
    if "hook_timeout_s" in m:
        kw["hook_timeout_s"] = _number(m["hook_timeout_s"], 0.1, 3600, "seconds")
    if "hold_down_s" in m:
        kw["hold_down_s"] = _number(m["hold_down_s"], 0, 7 * 86400, "seconds")
    return HealthConfig(**kw)


def config_of(profile) -> HealthConfig:
    return profile.section("health") or HealthConfig()
