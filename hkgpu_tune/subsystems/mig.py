"""MIG layouts (gpu.mig, parsed in subsystems/gpu.py), in nvidia-mig-parted's per-device form:

    gpu:
      mig:
        - devices: [0, 1]          # or all
          mig-enabled: true
          mig-devices: {"1g.6gb": 4}      # profile name: GPU instances (one compute instance each)
        - devices: [2]
          mig-enabled: false

Per GPU two settings, applied in this order and rolled back in the reverse one:
- mig_mode: needs the GPU drained (no process on it); NVML resets the GPU to switch, and where it
  cannot (pass-through VMs) the mode stays pending until a GPU reset or VM reboot.
- mig_devices: the GPU instances by profile name; the original layout (or none, with MIG off) is
  saved and rebuilt on rollback. Each resulting MIG device is named by its UUID in the facts.
"""
from __future__ import annotations

import re

from hkgpu_tune.backends.mig import IN_USE, RESET_REQUIRED, SUCCESS
from hkgpu_tune.core.errors import ApplyError, HkError, TargetGone, UnsupportedError
from hkgpu_tune.core.report import DRIFT, ERROR, OK, UNSUPPORTED
from hkgpu_tune.core import fields
from hkgpu_tune.core.fields import SettingType
from hkgpu_tune.subsystems.base import Spec, Subsystem
from hkgpu_tune.subsystems.gpu import MigEntry

def check_layout(want: dict[str, int], profiles: list[dict], model: str) -> str:
    """Why a layout cannot be built on this GPU ('' when it fits)."""
    by_name = {p["name"]: p for p in profiles}
    for name, cnt in want.items():
        if name not in by_name:
            return f"{model} has no MIG profile {name} (it has: {', '.join(sorted(by_name)) or 'none'})"
        if cnt > by_name[name]["instances"]:
            return f"{model} holds at most {by_name[name]['instances']} x {name}"
    total = max((p["slices"] for p in profiles), default=0)
    used = sum(by_name[n]["slices"] * c for n, c in want.items())
    if used > total:
        return f"{used} slices asked, {model} has {total}"
    return ""


class Plugin(Subsystem):
    name = "mig"

    def _entries(self) -> tuple[MigEntry, ...]:
        gpu = self.profile.section("gpu")
        return getattr(gpu, "mig", None) or ()

    def _want(self, count: int) -> dict[int, MigEntry]:
        out = {}
        for e in self._entries():
            for i in (range(count) if e.devices is None else e.devices):
                out[i] = e
        return out

    def read(self, every: bool = False) -> dict:
        """The GPUs the profile lays out (every GPU for the facts)."""
        if not (every or self._entries()):
            return {"gpus": {}, "count": 0}
        try:
            n = self.b.nvml.count()
        except UnsupportedError as e:
            return {"unsupported": str(e)}
        state = {"gpus": {}, "count": n}
        for i in range(n) if every else sorted(i for i in self._want(n) if i < n):
            try:
                g = self.b.nvml.gpu(i, ("name", "uuid"))
                state["gpus"][i] = {**g, **self.b.nvml.mig(i)}
            except HkError as e:
                state["gpus"][i] = {"error": str(e)}
        return state

    def facts(self) -> dict:
        st = self.read(every=True)
        if "unsupported" in st:
            return st
        return {f"gpu{i}": g for i, g in st["gpus"].items()}

    def compare(self, state):
        want = self._want(state.get("count", 0))
        if "unsupported" in state:
            return [self.result("gpu" if e.devices is None else f"gpu{i}", "mig_mode", None, e.enabled,
                                UNSUPPORTED, state["unsupported"])
                    for e in self._entries() for i in (e.devices or (None,))]
        res = []
        for i, e in sorted(want.items()):
            t = f"gpu{i}"
            g = state["gpus"].get(i)
            if g is None:
                res.append(self.result(t, "present", None, True, ERROR, f"no GPU {i} on this host"))
            elif "error" in g:
                res.append(self.result(t, "mig_mode", None, e.enabled, ERROR, g["error"]))
            elif g["mode"] is None:
                res.append(self.result(t, "mig_mode", None, e.enabled, UNSUPPORTED,
                                       f"{g.get('name') or 'this GPU'} has no MIG (NVML: Not Supported)"))
            else:
                res += self._compare_gpu(t, i, g, e)
        return res

    def _compare_gpu(self, t, i, g, e):
        model = g.get("name") or f"GPU {i}"
        m = g["mode"]
        data = {"index": i, "uuid": g.get("uuid")}
        res = []
        if m["pending"] != m["current"] and m["pending"] == e.enabled:
            res.append(self.result(t, "mig_mode", m["current"], e.enabled, DRIFT,
                                   f"MIG mode pending {'on' if e.enabled else 'off'}: reset the GPU "
                                   f"(nvidia-smi -r -i {i}) or, in a pass-through VM, reboot it"))
        elif m["current"] == e.enabled:
            res.append(self.result(t, "mig_mode", m["current"], e.enabled, OK))
        else:
            res.append(self.result(t, "mig_mode", m["current"], e.enabled, DRIFT,
                                   f"drain GPU {i} first (no process may hold it); NVML resets the GPU to "
                                   "switch, and a pass-through VM needs a reboot", write=e.enabled, data=data))
        if not e.enabled:
            return res
        cur = {}
        for gi in g["layout"]:
            cur[gi["name"]] = cur.get(gi["name"], 0) + 1
        want = e.counts()
        why = check_layout(want, g["profiles"], model)
        if why:
            res.append(self.result(t, "mig_devices", cur, want, UNSUPPORTED, why))
        elif cur == want and all(gi["compute"] for gi in g["layout"]):
            res.append(self.result(t, "mig_devices", cur, want, OK,
                                   ", ".join(d["uuid"] or "?" for d in g["devices"])))
        else:
            note = "after the MIG mode change; " if not m["current"] else ""
            res.append(self.result(t, "mig_devices", cur, want, DRIFT,
                                   f"{note}the GPU's instances are destroyed and made again (it must be idle)",
                                   write=want, data=data))
        return res

    def _busy(self, i) -> list[int]:
        p = self.b.nvml.processes(i)
        return sorted(set(p.get("compute", [])) | set(p.get("mps", [])))

    def write(self, target, key, value, data):
        i = data["index"]
        if data.get("uuid"):   # as the gpu subsystem: a replaced or missing board is another device
            try:
                now = self.b.nvml.gpu(i, ("uuid",)).get("uuid")
            except HkError:
                now = None
            if now != data["uuid"]:
                raise TargetGone(f"{target}: the GPU at index {i} is {now or 'gone'}, not {data['uuid']} whose "
                                 f"{key} this is: not touched, its original is kept")
        busy = self._busy(i)
        if busy:
            raise ApplyError(f"{target} {key}: GPU {i} is in use by pid {', '.join(map(str, busy))}: "
                             "drain it (stop its services) and apply again")
        if key == "mig_mode":
            status = self.b.nvml.set_mig_mode(i, bool(value))
            if status == RESET_REQUIRED:
                self.b.nvml.set_mig_mode(i, not value)     # leave no pending change behind
                raise ApplyError(f"{target}: MIG mode {'on' if value else 'off'} needs a GPU reset this platform "
                                 f"does not expose (pass-through VM): set it with nvidia-smi -i {i} -mig "
                                 f"{int(bool(value))}, reboot the VM, then apply again")
            if status == IN_USE:
                raise ApplyError(f"{target}: NVML could not switch MIG mode: the GPU is in use")
            if status != SUCCESS:
                raise ApplyError(f"{target}: MIG mode: NVML activation status {status}")
            got = self.b.nvml.mig(i)["mode"]
            if got["current"] != bool(value):
                raise ApplyError(f"{target}: wrote MIG mode {value}, NVML shows {got['current']}")
        elif key == "mig_devices":
            st = self.b.nvml.mig(i)
            if not (st["mode"] or {}).get("current"):
                if value:
                    raise ApplyError(f"{target}: MIG is off: cannot make {value}")
                return      # nothing to destroy with MIG off
            self.b.nvml.set_mig_devices(i, dict(value))
            cur = {}
            for gi in self.b.nvml.mig(i)["layout"]:
                cur[gi["name"]] = cur.get(gi["name"], 0) + 1
            if cur != dict(value):
                raise ApplyError(f"{target}: made {cur}, wanted {dict(value)}")
        else:
            raise HkError(f"mig: cannot write {key}")


# ---------------------------------------------------------------- the setting types (state.json)
_MIG_NAME = re.compile(r"[1-8]g\.[0-9]{1,4}gb(\+[a-z]{1,8})*")


def _check_layout(c) -> None:
    if not re.fullmatch(r"gpu[0-9]{1,4}", c.target):
        fields.fail(f"target: {c.target!r} is not gpuN")
    fields.one_of(c.key, "key", ("mig_mode", "mig_devices"))
    fields.integer(c.data.get("index"), "data.index", 0, 1023)
    fields.text(c.data.get("uuid"), "data.uuid", maxlen=96, none=True)
    for k, v in (("original", c.current), ("desired", c.desired)):
        if c.key == "mig_mode":
            fields.boolean(v, k)
        elif not isinstance(v, dict) or len(v) > 16:
            fields.fail(f"{k}: expected {{profile name: count}}")
        else:
            for name, n in v.items():
                if not _MIG_NAME.fullmatch(name):
                    fields.fail(f"{k}: {name!r} is not a MIG profile name")
                fields.integer(n, f"{k}.{name}", 1, 8)


SPEC = Spec(name="mig", order=80, section="gpu", plugin=Plugin, persist="boot",
            types=(SettingType("mig.layout", "mig", _check_layout),))
