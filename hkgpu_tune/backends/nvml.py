"""NVML (pynvml from nvidia-ml-py): one nvmlInit per process, queries by field name.

>>> nv = Nvml()                                   # doctest: +SKIP
>>> nv.gpu(0, ["persistence", "compute_mode"])    # doctest: +SKIP
{'index': 0, 'persistence': True, 'compute_mode': 'default'}

`ReplayNvml` serves recorded facts (the `gpu` part of `hkgpu-tune facts --json`) through the
same interface, for tests and for hosts without a GPU.
"""
from __future__ import annotations

import copy
import json
import threading

from ..errors import ApplyError, HkError, UnsupportedError

NO_LIBRARY = "NVML library not found (libnvidia-ml.so.1)"
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
COMPUTE_CODES = {v: k for k, v in COMPUTE_MODES.items()}


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def cpus_from_masks(masks, bits=64) -> list[int]:
    """NVML's CPU affinity words (lowest CPUs first) -> CPU numbers."""
    out = []
    for w, m in enumerate(masks):
        out += [w * bits + b for b in range(bits) if (int(m) >> b) & 1]
    return out


def _nvlink_peers(nv, h) -> list[str]:
    peers = []
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if nv.nvmlDeviceGetNvLinkState(h, link) != 1:
                continue
            peers.append(_s(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId))
        except nv.NVMLError:
            break  # NotSupported on the first link: no NVLink at all
    return peers


# field -> function(pynvml, handle); a field NVML does not support reads as None
FIELDS = {
    "name": lambda nv, h: _s(nv.nvmlDeviceGetName(h)),
    "uuid": lambda nv, h: _s(nv.nvmlDeviceGetUUID(h)),
    "pci_bus_id": lambda nv, h: _s(nv.nvmlDeviceGetPciInfo(h).busId),
    "persistence": lambda nv, h: nv.nvmlDeviceGetPersistenceMode(h) == 1,
    "compute_mode": lambda nv, h: COMPUTE_MODES.get(nv.nvmlDeviceGetComputeMode(h), "unknown"),
    "mig": lambda nv, h: dict(zip(("current", "pending"), (bool(x) for x in nv.nvmlDeviceGetMigMode(h)))),
    "ecc": lambda nv, h: dict(zip(("current", "pending"), (bool(x) for x in nv.nvmlDeviceGetEccMode(h)))),
    "pstate": lambda nv, h: int(nv.nvmlDeviceGetPerformanceState(h)),
    "clocks_mhz": lambda nv, h: {
        "sm": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "mem": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        "max_sm": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        "max_mem": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)},
    "app_clocks_mhz": lambda nv, h: {
        "sm": nv.nvmlDeviceGetApplicationsClock(h, nv.NVML_CLOCK_SM),
        "mem": nv.nvmlDeviceGetApplicationsClock(h, nv.NVML_CLOCK_MEM),
        "default_sm": nv.nvmlDeviceGetDefaultApplicationsClock(h, nv.NVML_CLOCK_SM),
        "default_mem": nv.nvmlDeviceGetDefaultApplicationsClock(h, nv.NVML_CLOCK_MEM)},
    "power_limit_w": lambda nv, h: nv.nvmlDeviceGetPowerManagementLimit(h) / 1000,
    "power_limits_w": lambda nv, h: dict(zip(
        ("min", "max"), (x / 1000 for x in nv.nvmlDeviceGetPowerManagementLimitConstraints(h))),
        default=nv.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000),
    "pcie": lambda nv, h: {
        "gen": nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "max_gen": nv.nvmlDeviceGetMaxPcieLinkGeneration(h),
        "width": nv.nvmlDeviceGetCurrPcieLinkWidth(h),
        "max_width": nv.nvmlDeviceGetMaxPcieLinkWidth(h)},
    "numa_node": lambda nv, h: nv.nvmlDeviceGetNumaNodeId(h),
    "cpu_affinity": lambda nv, h: cpus_from_masks(nv.nvmlDeviceGetCpuAffinity(h, 16)),
    "nvlink_peers": _nvlink_peers,
}
ALL = tuple(FIELDS)


class Nvml:
    """The real NVML. Methods raise UnsupportedError when the library or the GPU is missing."""

    def __init__(self):
        self._nv = None
        self._err: HkError | None = None
        self._handles: dict[int, object] = {}
        self._lock = threading.Lock()

    # --- set-up
    def _lib(self):
        if self._nv is not None:
            return self._nv
        if self._err is not None:
            raise self._err
        with self._lock:
            if self._nv is None and self._err is None:
                try:
                    import pynvml as nv
                except ImportError:
                    self._err = UnsupportedError("NVML Python binding missing (pip install nvidia-ml-py)")
                    raise self._err from None
                try:
                    nv.nvmlInit()
                    self._nv = nv
                except nv.NVMLError_LibraryNotFound:
                    self._err = UnsupportedError(NO_LIBRARY)
                except nv.NVMLError as e:
                    self._err = UnsupportedError(f"NVML did not start: {e}")
            if self._err is not None:
                raise self._err
        return self._nv

    def available(self) -> tuple[bool, str]:
        try:
            self._lib()
            return True, ""
        except HkError as e:
            return False, str(e)

    def close(self):
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except self._nv.NVMLError:
                pass
            self._nv, self._handles = None, {}

    def _h(self, index: int):
        nv = self._lib()
        if index not in self._handles:
            try:
                self._handles[index] = nv.nvmlDeviceGetHandleByIndex(index)
            except nv.NVMLError as e:
                raise UnsupportedError(f"GPU {index}: {e}") from None
        return self._handles[index]

    # --- reads
    def info(self) -> dict:
        nv = self._lib()
        cuda = nv.nvmlSystemGetCudaDriverVersion_v2()
        return {"driver_version": _s(nv.nvmlSystemGetDriverVersion()),
                "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
                "nvml_version": _s(nv.nvmlSystemGetNVMLVersion()),
                "count": nv.nvmlDeviceGetCount()}

    def count(self) -> int:
        return self._lib().nvmlDeviceGetCount()

    def gpu(self, index: int, keys=ALL) -> dict:
        nv, h = self._lib(), self._h(index)
        out = {"index": index}
        for k in keys:
            try:
                out[k] = FIELDS[k](nv, h)
            except nv.NVMLError_NotSupported:
                out[k] = None
            except nv.NVMLError as e:  # a GPU that fell off the bus says so here
                out[k] = None
                out.setdefault("errors", {})[k] = str(e)
        return out

    # --- writes (root; never exercised on the shared GPU machine)
    def _call(self, what, fn, *args):
        nv = self._lib()
        try:
            fn(*args)
        except nv.NVMLError_NotSupported:
            raise UnsupportedError(f"{what}: not supported by this GPU or driver") from None
        except nv.NVMLError_NoPermission:
            raise HkError(f"{what}: permission denied (run as root)") from None
        except nv.NVMLError as e:
            raise ApplyError(f"{what}: {e}") from None

    def processes(self, index: int) -> dict[str, list[int]]:
        """Pids with a CUDA context on the GPU: 'compute' (their own context, or the MPS server's)
        and 'mps' (MPS clients: nvmlDeviceGetMPSComputeRunningProcesses)."""
        nv, h = self._lib(), self._h(index)
        try:
            return {"compute": [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)],
                    "mps": [p.pid for p in nv.nvmlDeviceGetMPSComputeRunningProcesses(h)]}
        except nv.NVMLError as e:
            raise UnsupportedError(f"GPU {index}: listing its processes: {e}") from None

    def set_persistence(self, index: int, on: bool) -> None:
        nv = self._lib()
        self._call(f"GPU {index} persistence", nv.nvmlDeviceSetPersistenceMode, self._h(index),
                   nv.NVML_FEATURE_ENABLED if on else nv.NVML_FEATURE_DISABLED)

    def set_compute_mode(self, index: int, mode: str) -> None:
        nv = self._lib()
        self._call(f"GPU {index} compute mode", nv.nvmlDeviceSetComputeMode, self._h(index), COMPUTE_CODES[mode])

    def set_app_clocks(self, index: int, mem_mhz: int | None, sm_mhz: int | None) -> None:
        """None for both resets them to the defaults."""
        nv = self._lib()
        if mem_mhz is None and sm_mhz is None:
            self._call(f"GPU {index} application clocks", nv.nvmlDeviceResetApplicationsClocks, self._h(index))
        else:
            self._call(f"GPU {index} application clocks", nv.nvmlDeviceSetApplicationsClocks, self._h(index),
                       int(mem_mhz), int(sm_mhz))

    def set_power_limit(self, index: int, watts: float) -> None:
        nv = self._lib()
        self._call(f"GPU {index} power limit", nv.nvmlDeviceSetPowerManagementLimit, self._h(index),
                   int(round(watts * 1000)))


class ReplayNvml:
    """Recorded facts served through Nvml's interface; writes change the copy and are logged.

    `facts` is the `gpu` part of `hkgpu-tune facts --json` ({"driver": ..., "gpus": [...]}),
    or {"unsupported": reason} for a host without a driver.
    """

    def __init__(self, facts: dict | str):
        if isinstance(facts, str):
            with open(facts) as f:
                facts = json.load(f)
            facts = facts.get("gpu", facts)
        self.facts = copy.deepcopy(facts)
        self.writes: list[tuple] = []
        self.inits = 0

    @classmethod
    def missing(cls, reason: str = NO_LIBRARY) -> "ReplayNvml":
        return cls({"unsupported": reason})

    def _check(self):
        if "unsupported" in self.facts:
            raise UnsupportedError(self.facts["unsupported"])
        self.inits = 1

    def available(self):
        try:
            self._check()
            return True, ""
        except HkError as e:
            return False, str(e)

    def close(self):
        pass

    def _g(self, index):
        self._check()
        gpus = self.facts["gpus"]
        if not 0 <= index < len(gpus):
            raise UnsupportedError(f"GPU {index}: Invalid Argument")
        return gpus[index]

    def info(self):
        self._check()
        return {**self.facts.get("driver", {}), "count": len(self.facts["gpus"])}

    def count(self):
        self._check()
        return len(self.facts["gpus"])

    def gpu(self, index, keys=ALL):
        g = self._g(index)
        return {"index": index, **{k: copy.deepcopy(g.get(k)) for k in keys}}

    def processes(self, index):
        p = self._g(index).get("processes") or {}
        return {"compute": list(p.get("compute", [])), "mps": list(p.get("mps", []))}

    def _w(self, index, key, value, apply):
        g = self._g(index)
        if g.get("read_only"):
            raise HkError(f"GPU {index} {key}: permission denied (run as root)")
        self.writes.append((index, key, value))
        apply(g)

    def set_persistence(self, index, on):
        self._w(index, "persistence", on, lambda g: g.__setitem__("persistence", bool(on)))

    def set_compute_mode(self, index, mode):
        self._w(index, "compute_mode", mode, lambda g: g.__setitem__("compute_mode", mode))

    def set_app_clocks(self, index, mem_mhz, sm_mhz):
        def apply(g):
            ac = g.get("app_clocks_mhz") or {}
            if ac.get("sm") is None and "default_sm" not in ac:
                raise UnsupportedError(f"GPU {index} application clocks: not supported by this GPU or driver")
            ac["sm"] = ac.get("default_sm") if sm_mhz is None else sm_mhz
            ac["mem"] = ac.get("default_mem") if mem_mhz is None else mem_mhz
        self._w(index, "app_clocks", (mem_mhz, sm_mhz), apply)

    def set_power_limit(self, index, watts):
        self._w(index, "power_limit_w", watts, lambda g: g.__setitem__("power_limit_w", watts))
