"""GPU health through NVML: utilisation, memory, temperature, power, clock-event (throttle) reasons,
ECC counts, remapped rows, retired pages, PCIe link. A field NVML does not support is None.

>>> read(ReplayNvml("tests/fixtures/gpu/h200-health.json"))[0]["temp_c"]   # doctest: +SKIP
31
"""
from __future__ import annotations

import os

from hkgpu_tune.backends.nvml import EVENT_REASONS, HEALTH
from hkgpu_tune.observe.collect import Family

KEYS = ("name", "uuid", "pci_bus_id", "pcie") + tuple(HEALTH)
REASONS = tuple(n for _, n in EVENT_REASONS)


def _nvml(nvml):
    if nvml is not None:
        return nvml
    from hkgpu_tune.backends.nvml import Nvml, ReplayNvml
    if not any(os.path.exists(p) for p in ("/proc/driver/nvidia", "/dev/nvidiactl")):
        # no driver loaded: say so without importing pynvml (~50 ms on every export of a CPU node)
        return ReplayNvml.missing("no NVIDIA driver loaded (/proc/driver/nvidia, /dev/nvidiactl)")
    return Nvml()


def read(nvml=None) -> list[dict]:
    """One dict per GPU (see notes in docs/monitoring.md); raises HkError when NVML is missing."""
    nv = _nvml(nvml)
    out = []
    for i in range(nv.count()):
        g = nv.gpu(i, KEYS)
        u, m = g.get("utilization") or {}, g.get("memory") or {}
        out.append({
            "index": i, "uuid": g.get("uuid"), "name": g.get("name"), "pci_bus_id": g.get("pci_bus_id"),
            "util_pct": u.get("gpu"), "mem_util_pct": u.get("memory"),
            "mem_used_bytes": m.get("used"), "mem_total_bytes": m.get("total"),
            "temp_c": g.get("temperature_c"), "power_w": g.get("power_w"),
            "throttle_reasons": g.get("throttle_reasons"),
            "ecc": g.get("ecc_errors"), "remapped_rows": g.get("remapped_rows"),
            "retired_pages": g.get("retired_pages"), "pcie": g.get("pcie"),
            "errors": g.get("errors") or {},
        })
    return out


def families(gpus: list[dict]) -> list[Family]:
    F = {n: Family(n, k, h) for n, k, h in (
        ("hkgpu_tune_gpu_utilization_ratio", "gauge", "GPU utilisation (NVML, 0-1)."),
        ("hkgpu_tune_gpu_memory_used_bytes", "gauge", "GPU memory in use."),
        ("hkgpu_tune_gpu_memory_total_bytes", "gauge", "GPU memory in all."),
        ("hkgpu_tune_gpu_temperature_celsius", "gauge", "GPU core temperature."),
        ("hkgpu_tune_gpu_power_watts", "gauge", "GPU power draw."),
        ("hkgpu_tune_gpu_throttle", "gauge", "1 while the clock-event (throttle) reason is active."),
        ("hkgpu_tune_gpu_ecc_errors_total", "counter", "ECC errors (volatile: since driver load; aggregate: lifetime)."),
        ("hkgpu_tune_gpu_remapped_rows", "gauge", "Memory rows remapped, by the error that caused it."),
        ("hkgpu_tune_gpu_remap_pending", "gauge", "1 while a row remap waits for the next GPU reset."),
        ("hkgpu_tune_gpu_remap_failed", "gauge", "1 if a row remap failed (the GPU needs replacing)."),
        ("hkgpu_tune_gpu_retired_pages", "gauge", "Retired memory pages, by cause (sbe, dbe)."),
        ("hkgpu_tune_gpu_retired_pages_pending", "gauge", "1 while a page retirement waits for a reset."),
        ("hkgpu_tune_gpu_pcie_link_gen", "gauge", "PCIe link generation."),
        ("hkgpu_tune_gpu_pcie_link_width", "gauge", "PCIe link width (lanes)."),
        ("hkgpu_tune_gpu_nvml_errors", "gauge", "NVML fields that answered an error other than NotSupported."))}

    def put(name, lab, v):
        F[name].samples.append((lab, v))

    for g in gpus:
        lab = {"gpu": str(g["index"]), "uuid": g.get("uuid") or ""}
        put("hkgpu_tune_gpu_utilization_ratio", lab, None if g["util_pct"] is None else g["util_pct"] / 100)
        put("hkgpu_tune_gpu_memory_used_bytes", lab, g["mem_used_bytes"])
        put("hkgpu_tune_gpu_memory_total_bytes", lab, g["mem_total_bytes"])
        put("hkgpu_tune_gpu_temperature_celsius", lab, g["temp_c"])
        put("hkgpu_tune_gpu_power_watts", lab, g["power_w"])
        tr = g["throttle_reasons"]
        if tr is not None:
            for r in REASONS + tuple(x for x in tr if x not in REASONS):
                put("hkgpu_tune_gpu_throttle", {**lab, "reason": r}, 1 if r in tr else 0)
        for scope, kinds in (g["ecc"] or {}).items():
            for kind, v in (kinds or {}).items():
                put("hkgpu_tune_gpu_ecc_errors_total", {**lab, "type": kind, "scope": scope}, v)
        # counts and 0/1 flags are separate families: a sum or rate over one family means one thing
        rows = g["remapped_rows"] or {}     # NotSupported: no series, not a 0
        for cause in ("correctable", "uncorrectable"):
            if rows.get(cause) is not None:
                put("hkgpu_tune_gpu_remapped_rows", {**lab, "cause": cause}, rows[cause])
        for flag, name in (("pending", "hkgpu_tune_gpu_remap_pending"), ("failed", "hkgpu_tune_gpu_remap_failed")):
            if rows.get(flag) is not None:
                put(name, lab, rows[flag])
        pages = g["retired_pages"] or {}
        for cause in ("sbe", "dbe"):
            if pages.get(cause) is not None:
                put("hkgpu_tune_gpu_retired_pages", {**lab, "cause": cause}, pages[cause])
        if pages.get("pending") is not None:
            put("hkgpu_tune_gpu_retired_pages_pending", lab, pages["pending"])
        p = g["pcie"] or {}
        for which, k in (("current", "gen"), ("max", "max_gen")):
            put("hkgpu_tune_gpu_pcie_link_gen", {**lab, "which": which}, p.get(k))
        for which, k in (("current", "width"), ("max", "max_width")):
            put("hkgpu_tune_gpu_pcie_link_width", {**lab, "which": which}, p.get(k))
        put("hkgpu_tune_gpu_nvml_errors", lab, len(g["errors"]))
    return list(F.values())


def run(profile, src):
    from hkgpu_tune.core.errors import UnsupportedError
    try:
        gpus = read(src.nvml)
    except UnsupportedError as e:
        if profile is not None and profile.section("gpu"):
            raise   # the profile expects GPUs: no NVML is a failure
        return [], {"gpus": [], "unsupported": str(e)}   # a node without GPUs
    return families(gpus), {"gpus": gpus}
