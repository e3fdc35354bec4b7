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
import os
import threading
from types import SimpleNamespace

from hkgpu_tune.core.errors import ApplyError, HkError, UnsupportedError

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

# --- health reads (monitoring). Constants are nvml.h's documented values, so a replay needs no pynvml.
TEMPERATURE_GPU = 0                       # nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU
ERR_CORRECTED, ERR_UNCORRECTED = 0, 1     # nvmlMemoryErrorType_t
VOLATILE_ECC, AGGREGATE_ECC = 0, 1        # nvmlEccCounterType_t
RETIRE_SBE, RETIRE_DBE = 0, 1             # nvmlPageRetirementCause_t (multiple single-bit, double-bit)
# nvmlClocksEventReasons (nvml.h; the older name is nvmlClocksThrottleReasons, same bits)
EVENT_REASONS = ((0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"),
                 (0x8, "hw_slowdown"), (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"),
                 (0x40, "hw_thermal_slowdown"), (0x80, "hw_power_brake_slowdown"),
                 (0x100, "display_clock_setting"))


def reason_names(mask: int) -> list[str]:
    """A clocks-event bitmask -> names; a bit nvml.h does not name reads as bit_N."""
    mask = int(mask)
    names = [n for b, n in EVENT_REASONS if mask & b]
    known = sum(b for b, _ in EVENT_REASONS)
    return names + [f"bit_{i}" for i in range(64) if (mask & ~known) >> i & 1]


def _opt(nv, fn, *args):
    """One NVML call; NotSupported -> None (other errors propagate)."""
    try:
        return fn(*args)
    except nv.NVMLError_NotSupported:
        return None


class _Never(Exception):
    pass


def _event_reasons(nv, h):
    fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if fn is not None:
        try:
            return reason_names(fn(h))
        except getattr(nv, "NVMLError_FunctionNotFound", _Never):
            pass   # a driver older than the binding: the older name below
    return reason_names(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))


def _ecc_errors(nv, h):
    return {scope: {kind: _opt(nv, nv.nvmlDeviceGetTotalEccErrors, h, et, ct)
                    for kind, et in (("corrected", ERR_CORRECTED), ("uncorrected", ERR_UNCORRECTED))}
            for scope, ct in (("volatile", VOLATILE_ECC), ("aggregate", AGGREGATE_ECC))}


def _remapped_rows(nv, h):
    corr, unc, pending, failed = nv.nvmlDeviceGetRemappedRows(h)
    return {"correctable": int(corr), "uncorrectable": int(unc), "pending": bool(pending), "failed": bool(failed)}


def _retired_pages(nv, h):
    sbe = _opt(nv, nv.nvmlDeviceGetRetiredPages, h, RETIRE_SBE)
    dbe = _opt(nv, nv.nvmlDeviceGetRetiredPages, h, RETIRE_DBE)
    pending = _opt(nv, nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
    if sbe is None and dbe is None and pending is None:
        return None
    return {"sbe": None if sbe is None else len(sbe), "dbe": None if dbe is None else len(dbe),
            "pending": None if pending is None else bool(pending)}


HEALTH = {
    "utilization": lambda nv, h: (lambda u: {"gpu": int(u.gpu), "memory": int(u.memory)})(
        nv.nvmlDeviceGetUtilizationRates(h)),
    "memory": lambda nv, h: (lambda m: {"total": int(m.total), "used": int(m.used), "free": int(m.free)})(
        nv.nvmlDeviceGetMemoryInfo(h)),
    "temperature_c": lambda nv, h: int(nv.nvmlDeviceGetTemperature(h, TEMPERATURE_GPU)),
    "power_w": lambda nv, h: nv.nvmlDeviceGetPowerUsage(h) / 1000,
    "throttle_reasons": _event_reasons,
    "ecc_errors": _ecc_errors,
    "remapped_rows": _remapped_rows,
    "retired_pages": _retired_pages,
}
FIELDS.update(HEALTH)


def read_fields(nv, h, keys, out: dict) -> dict:
    """FIELDS[k] for each key into out; NotSupported -> None, another NVML error -> None plus
    out["errors"][k] (a GPU that fell off the bus says so here)."""
    for k in keys:
        try:
            out[k] = FIELDS[k](nv, h)
        except nv.NVMLError_NotSupported:
            out[k] = None
        except nv.NVMLError as e:
            out[k] = None
            out.setdefault("errors", {})[k] = str(e)
    return out


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
        return read_fields(nv, h, keys, {"index": index})

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


class ReplayError(Exception):
    """pynvml's NVMLError, replayed."""


class ReplayNotSupported(ReplayError):
    pass


# nvml.h return codes a replay may record as {"nvml_error": NAME}; the text is nvmlErrorString's
ERROR_TEXT = {"NotSupported": "Not Supported", "GpuIsLost": "GPU is lost", "Unknown": "Unknown Error",
              "NoPermission": "Insufficient Permissions", "Timeout": "Timeout",
              "InvalidArgument": "Invalid Argument", "FunctionNotFound": "Function Not Found",
              "CorruptedInforom": "corrupted infoROM", "ResetRequired": "GPU requires reset"}


class ReplayLib:
    """pynvml's health calls served from one GPU's recorded raw answers (`nvml_raw` in the facts):
    the same FIELDS functions convert them as on a real GPU. Shapes (nvml.h / pynvml):
      nvmlDeviceGetUtilizationRates {"gpu": %, "memory": %}; nvmlDeviceGetMemoryInfo {"total", "free",
      "used"} bytes; nvmlDeviceGetTemperature int C (sensor 0); nvmlDeviceGetPowerUsage int mW;
      nvmlDeviceGetCurrentClocksEventReasons int bitmask; nvmlDeviceGetTotalEccErrors
      {"corrected"|"uncorrected": {"volatile"|"aggregate": int}}; nvmlDeviceGetRemappedRows
      [corrRows, uncRows, isPending, failureOccurred]; nvmlDeviceGetRetiredPages {"sbe"|"dbe": [addresses]};
      nvmlDeviceGetRetiredPagesPendingStatus 0|1. Any answer may be {"nvml_error": NAME} (ERROR_TEXT).
    A call the record lacks answers NotSupported."""

    NVMLError = ReplayError
    NVMLError_NotSupported = ReplayNotSupported

    def __init__(self, raw: dict):
        self.raw = raw

    def _get(self, name, *path):
        v = self.raw.get(name, {"nvml_error": "NotSupported"})
        for p in path:
            v = self._answer(v)
            v = v.get(p, {"nvml_error": "NotSupported"}) if isinstance(v, dict) else v
        return self._answer(v)

    @staticmethod
    def _answer(v):
        if isinstance(v, dict) and "nvml_error" in v:
            name = str(v["nvml_error"])
            if name == "NotSupported":
                raise ReplayNotSupported(ERROR_TEXT[name])
            raise ReplayError(ERROR_TEXT.get(name, name))
        return v

    def nvmlDeviceGetUtilizationRates(self, h):
        v = self._get("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=v["gpu"], memory=v["memory"])

    def nvmlDeviceGetMemoryInfo(self, h):
        v = self._get("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=v["total"], free=v["free"], used=v["used"])

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._get("nvmlDeviceGetTemperature")

    def nvmlDeviceGetPowerUsage(self, h):
        return self._get("nvmlDeviceGetPowerUsage")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._get("nvmlDeviceGetCurrentClocksEventReasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._get("nvmlDeviceGetCurrentClocksEventReasons")

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        return self._get("nvmlDeviceGetTotalEccErrors", ("corrected", "uncorrected")[error_type],
                         ("volatile", "aggregate")[counter_type])

    def nvmlDeviceGetRemappedRows(self, h):
        return tuple(self._get("nvmlDeviceGetRemappedRows"))

    def nvmlDeviceGetRetiredPages(self, h, cause):
        return list(self._get("nvmlDeviceGetRetiredPages", ("sbe", "dbe")[cause]))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return self._get("nvmlDeviceGetRetiredPagesPendingStatus")


ENV_REPLAY = "HKGPU_TUNE_NVML_REPLAY"


def replay_from_env() -> "ReplayNvml | None":
    """A recorded host in place of the real NVML when $HKGPU_TUNE_NVML_REPLAY names its facts JSON
    (tests, hosts without a GPU); `health` and `export` both read it through here."""
    path = os.environ.get(ENV_REPLAY)
    if not path:
        return None
    try:
        return ReplayNvml(path)
    except (OSError, ValueError, AttributeError) as e:
        raise HkError(f"{path}: cannot read the NVML replay ({ENV_REPLAY}): {e}") from None


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
        out = {"index": index}
        raw = g.get("nvml_raw")
        for k in keys:
            if k in HEALTH and raw is not None:
                read_fields(ReplayLib(raw), None, (k,), out)
            else:
                out[k] = copy.deepcopy(g.get(k))
        return out

    def set_raw(self, index: int, call: str, answer) -> None:
        """Replace one recorded NVML answer (a fault: an ECC count, a pending remap,
        {"nvml_error": "GpuIsLost"}). The shapes are ReplayLib's."""
        self._g(index).setdefault("nvml_raw", {})[call] = copy.deepcopy(answer)

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
