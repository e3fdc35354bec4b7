"""GPU settings over NVML: persistence, compute mode, application clocks, power limit, PCIe link.

Profile section:

    gpu:
      gpus: all              # or a list of indices: [0, 1]
      persistence: true      # through nvidia-persistenced where installed
      compute_mode: default  # or exclusive_process
      application_clocks: {sm: 1980, mem: 2619}   # MHz, optional
      power_limit_w: 700     # optional
      pcie_check: true       # a link that trained below its maximum is drift
      mig: [...]             # MIG layouts in nvidia-mig-parted's form: subsystems/mig.py

All GPUs are read in one process with one nvmlInit; verify asks NVML only for the fields it compares.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

from hkgpu_tune.core.errors import ApplyError, HkError, TargetGone, UnsupportedError
from hkgpu_tune.core.report import DRIFT, ERROR, OK, UNSUPPORTED
from hkgpu_tune.core import fields
from hkgpu_tune.core.fields import SettingType
from hkgpu_tune.subsystems.base import Spec, Subsystem

PERSISTENCED = "nvidia-persistenced"
PERSISTENCED_UNIT = "nvidia-persistenced.service"
MODES = ("default", "exclusive_process")


@dataclass(frozen=True)
class AppClocks:
    sm: int
    mem: int


@dataclass(frozen=True)
class GpuProfile:
    gpus: tuple[int, ...] | None = None   # None = all
    persistence: bool | None = None
    compute_mode: str | None = None
    application_clocks: AppClocks | None = None
    power_limit_w: int | None = None
    pcie_check: bool = True
    mig: tuple | None = None              # MigEntry, one per device group


def parse_gpus(n) -> tuple[int, ...] | None:
    """`all` or a list of GPU indices (shared by the gpu, mps and affinity sections)."""
    if n.kind() == "scalar" and n.node.value == "all":
        return None
    if n.kind() == "scalar":
        raise n.error(f"expected 'all' or a list of GPU indices, got {n._desc()}")
    idx = [i.integer(0, 63) for i in n.items()]
    if not idx:
        raise n.error("expected at least one GPU index (or 'all')")
    if len(set(idx)) != len(idx):
        raise n.error("a GPU index is listed twice")
    return tuple(idx)


def parse_profile(n) -> GpuProfile:
    m = n.mapping(("gpus", "persistence", "compute_mode", "application_clocks", "power_limit_w", "pcie_check", "mig"))
    clocks = None
    if "application_clocks" in m:
        c = m["application_clocks"].mapping(("sm", "mem"), required=("sm", "mem"))
        clocks = AppClocks(c["sm"].integer(100, 5000), c["mem"].integer(100, 20000))
    return GpuProfile(
        gpus=parse_gpus(m["gpus"]) if "gpus" in m else None,
        persistence=m["persistence"].boolean() if "persistence" in m else None,
        compute_mode=m["compute_mode"].choice(MODES) if "compute_mode" in m else None,
        application_clocks=clocks,
        power_limit_w=m["power_limit_w"].integer(50, 2000) if "power_limit_w" in m else None,
        pcie_check=m["pcie_check"].boolean() if "pcie_check" in m else True,
        mig=parse_mig(m["mig"]) if "mig" in m else None,
    )


# ---------------------------------------------------------------- gpu.mig (subsystems/mig.py applies it)
PROFILE_NAME = r"[1-8]g\.[0-9]{1,4}gb(\+[a-z]{1,8})*"


@dataclass(frozen=True)
class MigEntry:
    devices: tuple[int, ...] | None     # None: all
    enabled: bool
    layout: tuple[tuple[str, int], ...] = ()
    line: int = 0

    def counts(self) -> dict[str, int]:
        return dict(sorted(self.layout))


def parse_mig(n) -> tuple[MigEntry, ...]:
    out, seen, every = [], {}, None
    for item in n.items():
        m = item.mapping(("devices", "mig-enabled", "mig-devices"), required=("devices", "mig-enabled"))
        devs = parse_gpus(m["devices"])
        on = m["mig-enabled"].boolean()
        layout = []
        if "mig-devices" in m:
            if not on:
                raise m["mig-devices"].error("mig-devices needs mig-enabled: true")
            for name, cnt in m["mig-devices"].mapping().items():
                if name.startswith(("1c.", "2c.", "3c.", "4c.", "7c.")):
                    raise cnt.error("compute-instance profiles are not supported: each GPU instance gets "
                                    "one compute instance spanning it")
                if not re.fullmatch(PROFILE_NAME, name):
                    raise cnt.error(f"expected a MIG profile name such as 1g.10gb or 1g.10gb+me, got {name!r}")
                layout.append((name, cnt.integer(1, 8)))
        if devs is None:
            if every is not None or seen:
                raise item.error("devices: all overlaps another entry")
            every = item.line
        else:
            if every is not None:
                raise item.error(f"devices overlap the entry with devices: all (line {every})")
            for d in devs:
                if d in seen:
                    raise m["devices"].error(f"GPU {d} is already in the entry at line {seen[d]}")
                seen[d] = item.line
        out.append(MigEntry(devs, on, tuple(layout), item.line))
    if not out:
        raise n.error("expected at least one entry {devices, mig-enabled, mig-devices}")
    return tuple(out)



def select(nvml, wanted: tuple[int, ...] | None) -> tuple[list[int], list[int]]:
    """(present indices to look at, wanted indices this host lacks)."""
    n = nvml.count()
    if wanted is None:
        return list(range(n)), []
    return [i for i in wanted if i < n], [i for i in wanted if i >= n]


# fields verify needs, by setting
VERIFY_FIELDS = {"persistence": ("persistence",), "compute_mode": ("compute_mode",),
                 "application_clocks": ("app_clocks_mhz",), "power_limit_w": ("power_limit_w", "power_limits_w"),
                 "pcie_check": ("pcie",)}   # pstate only when the link runs below its maximum


class Plugin(Subsystem):
    name = "gpu"
    poll_s = 5.0   # how long a service-made change may take to show in NVML

    @property
    def cfg(self) -> GpuProfile:
        return self.profile.section("gpu") or GpuProfile()

    def _keys(self) -> tuple[str, ...]:
        c, keys = self.cfg, ["pci_bus_id", "uuid"]
        for setting, fields in VERIFY_FIELDS.items():
            val = getattr(c, setting)
            if val is not None and not (setting == "pcie_check" and val is False):
                keys += fields
        return tuple(dict.fromkeys(keys))

    def _persistenced(self) -> dict:
        installed = self.b.cmd.which(PERSISTENCED) is not None
        out = {"installed": installed, "systemd": False, "active": None}
        try:
            out["systemd"] = self.b.systemd.available()
            if out["systemd"]:
                out["active"] = self.b.systemd.is_active(PERSISTENCED_UNIT)
        except HkError:
            pass
        return out

    def read(self, keys=None) -> dict:
        try:
            gpus, missing = select(self.b.nvml, self.cfg.gpus)
            state = {"gpus": [self.b.nvml.gpu(i, keys or self._keys()) for i in gpus], "missing": missing}
        except UnsupportedError as e:
            return {"unsupported": str(e)}
        return state

    def facts(self) -> dict:
        from hkgpu_tune.backends.nvml import ALL
        try:
            info = self.b.nvml.info()
            gpus = [self.b.nvml.gpu(i, ALL) for i in range(info["count"])]
        except UnsupportedError as e:
            return {"unsupported": str(e)}
        return {"driver": info, "gpus": gpus, "persistenced": self._persistenced()}

    # ------------------------------------------------------------ compare
    def _wanted(self) -> list[tuple[str, object]]:
        c = self.cfg
        out = [(k, getattr(c, k)) for k in ("persistence", "compute_mode", "power_limit_w") if getattr(c, k) is not None]
        if c.application_clocks:
            out.append(("application_clocks", {"sm": c.application_clocks.sm, "mem": c.application_clocks.mem}))
        if c.pcie_check:
            out.append(("pcie_link", "max"))
        return out

    def compare(self, state):
        if "unsupported" in state:
            return [self.result("gpu" if self.cfg.gpus is None else f"gpu{i}", k, None, v, UNSUPPORTED,
                                state["unsupported"])
                    for i in (self.cfg.gpus or (None,)) for k, v in self._wanted()]
        res = [self.result(f"gpu{i}", "present", None, True, ERROR, f"no GPU {i} on this host")
               for i in state.get("missing", [])]
        if not state["gpus"] and self.cfg.gpus is None:
            return [self.result("gpu", k, None, v, UNSUPPORTED, "NVML sees no GPU") for k, v in self._wanted()]
        for g in state["gpus"]:
            t = f"gpu{g['index']}"
            for key, want in self._wanted():
                r = getattr(self, f"_cmp_{key}")(t, g, want, state)
                if isinstance(r.data, dict) and "index" in r.data and g.get("uuid"):
                    r.data["uuid"] = g["uuid"]   # the device: a GPU replaced at this index is another
                res.append(r)
        return res

    def _na(self, t, key, want, g, field):
        err = (g.get("errors") or {}).get(field)
        if err:
            return self.result(t, key, None, want, ERROR, f"NVML: {err}")
        return self.result(t, key, None, want, UNSUPPORTED, "not supported by this GPU or driver")

    def _cmp_persistence(self, t, g, want, state):
        cur = g.get("persistence")
        if cur is None:
            return self._na(t, "persistence", want, g, "persistence")
        if cur == want:
            return self.result(t, "persistence", cur, want, OK)
        # how to fix it: asked only on drift (systemctl would cost verify a process start)
        if "persistenced" not in state:
            state["persistenced"] = self._persistenced()
        d = state["persistenced"]
        how = "service" if d.get("installed") and d.get("systemd") else "nvml"
        why = "persistence mode is off" if want else "persistence mode is on"
        return self.result(t, "persistence", cur, want, DRIFT, f"{why}; fix: {PERSISTENCED} service" if how == "service"
                           else f"{why}; fix: NVML (no {PERSISTENCED} service here)", write=want,
                           data={"index": g["index"], "how": how})

    def _cmp_compute_mode(self, t, g, want, state):
        cur = g.get("compute_mode")
        if cur is None:
            return self._na(t, "compute_mode", want, g, "compute_mode")
        if cur == want:
            return self.result(t, "compute_mode", cur, want, OK)
        return self.result(t, "compute_mode", cur, want, DRIFT, "differs", write=want, data={"index": g["index"]})

    def _cmp_application_clocks(self, t, g, want, state):
        ac = g.get("app_clocks_mhz")
        if not ac or ac.get("sm") is None:
            return self._na(t, "application_clocks", want, g, "app_clocks_mhz")
        cur = {"sm": ac["sm"], "mem": ac["mem"]}
        if cur == want:
            return self.result(t, "application_clocks", cur, want, OK)
        return self.result(t, "application_clocks", cur, want, DRIFT, "differs", write=want,
                           data={"index": g["index"]})

    def _cmp_power_limit_w(self, t, g, want, state):
        cur = g.get("power_limit_w")
        if cur is None:
            return self._na(t, "power_limit_w", want, g, "power_limit_w")
        lim = g.get("power_limits_w") or {}
        if lim.get("min") is not None and not lim["min"] <= want <= lim["max"]:
            return self.result(t, "power_limit_w", cur, want, UNSUPPORTED,
                               f"outside what this GPU allows ({lim['min']:g}-{lim['max']:g} W)")
        if abs(cur - want) < 0.5:
            return self.result(t, "power_limit_w", cur, want, OK)
        return self.result(t, "power_limit_w", cur, want, DRIFT, "differs", write=want, data={"index": g["index"]})

    def _cmp_pcie_link(self, t, g, want, state):
        p = g.get("pcie")
        if not p or p.get("width") is None or p.get("max_width") is None:
            return self._na(t, "pcie_link", want, g, "pcie")
        cur = f"gen{p['gen']} x{p['width']}"
        top = f"gen{p['max_gen']} x{p['max_width']}"
        if p["width"] < p["max_width"]:
            return self.result(t, "pcie_link", cur, top, DRIFT,
                               f"link trained at x{p['width']} of x{p['max_width']}: reseat the GPU or check the "
                               "riser/slot (not fixable by software)")
        # an idle GPU may drop its link speed to save power; a busy one must run at full speed
        if p["gen"] is not None and p["max_gen"] is not None and p["gen"] < p["max_gen"]:
            if "pstate" not in g:
                g["pstate"] = self.b.nvml.gpu(g["index"], ("pstate",))["pstate"]
            idle = (g.get("pstate") or 0) >= 8
            if idle:
                return self.result(t, "pcie_link", cur, top, OK,
                                   f"gen{p['gen']} while idle (P{g['pstate']}): power saving, not a fault")
            return self.result(t, "pcie_link", cur, top, DRIFT,
                               f"link runs at gen{p['gen']} of gen{p['max_gen']} under load (P{g.get('pstate')}): "
                               "check the slot, riser and BIOS PCIe settings (not fixable by software)")
        return self.result(t, "pcie_link", cur, top, OK)

    # ------------------------------------------------------------ write
    def write(self, target, key, value, data):
        i = data["index"]
        nv = self.b.nvml
        if data.get("uuid"):
            now = nv.gpu(i, ("uuid",)).get("uuid")
            if now != data["uuid"]:
                raise TargetGone(f"{target}: the GPU at index {i} is {now or 'unknown'}, not {data['uuid']} whose "
                                 f"{key} this is: not touched, its original is kept")
        if key == "persistence":
            if data.get("how") == "service":
                # NVIDIA's recommended way: the daemon keeps the driver loaded
                sd = self.b.systemd
                (sd.enable if value else sd.disable)(PERSISTENCED_UNIT)
            else:
                nv.set_persistence(i, bool(value))
        elif key == "compute_mode":
            nv.set_compute_mode(i, value)
        elif key == "application_clocks":
            if value is None:
                nv.set_app_clocks(i, None, None)
            else:
                nv.set_app_clocks(i, value["mem"], value["sm"])
        elif key == "power_limit_w":
            nv.set_power_limit(i, value)
        else:
            raise HkError(f"gpu: cannot write {key}")
        # read back; the persistence daemon needs a moment after its start (poll, do not sleep)
        end = time.monotonic() + (self.poll_s if data.get("how") == "service" else 0)
        while True:
            cur = self._current(i, key)
            if value is None or cur == value or (key == "power_limit_w" and abs(cur - value) < 0.5):
                return
            if time.monotonic() >= end:
                if data.get("how") == "service":   # leave the service as it was
                    (self.b.systemd.disable if value else self.b.systemd.enable)(PERSISTENCED_UNIT)
                raise ApplyError(f"{target} {key}: wrote {value!r}, NVML shows {cur!r}")
            time.sleep(0.1)

    def _current(self, i, key):
        field = {"persistence": "persistence", "compute_mode": "compute_mode",
                 "application_clocks": "app_clocks_mhz", "power_limit_w": "power_limit_w"}[key]
        got = self.b.nvml.gpu(i, (field,))[field]
        if key == "application_clocks":
            return {k: (got or {}).get(k) for k in ("sm", "mem")}
        return got


# ---------------------------------------------------------------- the setting types (state.json)
_GPU_KEYS = ("persistence", "compute_mode", "application_clocks", "power_limit_w")


def _check_attr(c) -> None:
    fields.text(c.target, "target", maxlen=64)
    fields.one_of(c.key, "key", _GPU_KEYS)
    fields.integer(c.data.get("index"), "data.index", 0, 1023)
    fields.text(c.data.get("uuid"), "data.uuid", maxlen=96, none=True)
    fields.one_of(c.data.get("how"), "data.how", (None, "service", "nvml"))
    for k, v in (("original", c.current), ("desired", c.desired)):
        if c.key == "persistence":
            fields.boolean(v, k, none=True)
        elif c.key == "compute_mode":
            if v is not None and not (isinstance(v, str) and re.fullmatch(r"[a-z_]{1,32}", v)):
                fields.fail(f"{k}: {v!r} is not a compute mode")
        elif c.key == "application_clocks":
            if v is not None:
                if not isinstance(v, dict) or set(v) - {"sm", "mem"}:
                    fields.fail(f"{k}: expected {{sm, mem}}")
                for f in ("sm", "mem"):
                    fields.integer(v.get(f), f"{k}.{f}", 0, 100000, none=True)
        else:
            fields.number(v, k, 0, 100000, none=True)


SPEC = Spec(name="gpu", order=70, section="gpu", plugin=Plugin, persist="boot", sections={"gpu": parse_profile},
            types=(SettingType("gpu.attr", "gpu", _check_attr),))
