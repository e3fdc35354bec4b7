"""The node a baseline was taken on: GPU model, driver and CUDA versions, each NIC's driver, firmware,
link speed and MTU, and the live value of every setting the profile names (what verify reads).
`changes` lists what differs between two records, so compare can say that the MTU or the driver
changed beside its performance verdicts.

>>> changes({"nics": {"eth1": {"mtu": 1500}}}, {"nics": {"eth1": {"mtu": 1280}}})
[{'what': 'nics.eth1.mtu', 'before': 1500, 'after': 1280}]
"""
from __future__ import annotations

from hkgpu_tune.core.errors import HkError

SKIP = ("triton",)      # the serving process, not the node: its own verify and health say how it is


def record(profile, backends=None) -> dict:
    from hkgpu_tune.subsystems import ORDER
    from hkgpu_tune.tune.engine import Engine
    out: dict = {"gpu": None, "nics": {}, "settings": {}}
    try:
        eng = Engine(profile, only=[n for n in ORDER if n not in SKIP], backends=backends)
    except HkError as e:
        return {"error": str(e)}
    try:
        for r in eng.verify():
            if r.key != "-":
                out["settings"][f"{r.subsystem} {r.target} {r.key}"] = r.current
        out["gpu"] = _gpu(eng.b.nvml)
        for ln in eng.b.net.links():
            nic = {"mtu": ln.get("mtu"), "driver": ln.get("driver")}
            try:
                info = eng.b.ethtool.link_info(ln["name"])
                nic.update({k: info.get(k) for k in ("firmware", "speed_mbit", "duplex")})
                nic["driver"] = nic["driver"] or info.get("driver")
            except HkError as e:
                nic["error"] = str(e)
            out["nics"][ln["name"]] = nic
    except HkError as e:
        out["error"] = str(e)
    finally:
        eng.b.close()
    return out


def _gpu(nvml) -> dict:
    try:
        info = nvml.info()
        gpus = [nvml.gpu(i, ("name", "uuid", "pci_bus_id")) for i in range(info["count"])]
    except HkError as e:
        return {"unsupported": str(e)}
    return {"driver_version": info.get("driver_version"), "cuda_version": info.get("cuda_version"),
            "models": [g.get("name") for g in gpus], "uuids": [g.get("uuid") for g in gpus]}


def _flat(v, prefix: str, out: dict) -> None:
    if isinstance(v, dict) and v:
        for k, x in v.items():
            _flat(x, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = v


def changes(before: dict | None, after: dict | None) -> list[dict]:
    """Every value that differs (or is only on one side), in a stable order."""
    b, a = {}, {}
    _flat(before or {}, "", b)
    _flat(after or {}, "", a)
    keys = list(b) + [k for k in a if k not in b]
    return [{"what": k, "before": b.get(k), "after": a.get(k)} for k in keys if b.get(k) != a.get(k)]
