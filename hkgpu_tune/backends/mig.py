"""MIG over NVML: the GPU instance profiles a GPU offers, its GPU and compute instances, the MIG
devices (each named by its UUID), and the writes nvidia-mig-parted makes: mode, destroy, create.

Every function takes the NVML module (pynvml) and a device handle; `MigLib` answers the same calls
from a recorded GPU, so tests run this code and not a copy of it.

>>> lib = MigLib({"uuid": "GPU-0", "mig": {"current": True, "pending": True},
...               "mig_profiles": [{"index": 0, "id": 19, "name": "1g.18gb", "slices": 1, "instances": 7,
...                                 "memory_mb": 16384, "sm": 16}], "mig_max_slices": 7})
>>> create(lib, None, {"1g.18gb": 2}); counts(read_layout(lib, None))
{'1g.18gb': 2}
"""
from __future__ import annotations

import uuid as uuidlib
from types import SimpleNamespace

from hkgpu_tune.core.errors import ApplyError, UnsupportedError

MAX_GI_ID = 32       # GPU instance ids NVML hands out are small (1-14 on a 7-slice GPU)
MAX_CI_ID = 8        # compute instance ids per GPU instance (0-7)
SUCCESS, RESET_REQUIRED, IN_USE = 0, 16, 19   # nvml.h return codes (NVML_ERROR_RESET_REQUIRED, _IN_USE)


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def _err(nv, name):
    return getattr(nv, f"NVMLError_{name}", nv.NVMLError)


def mode(nv, h) -> dict | None:
    """{"current": bool, "pending": bool}, or None where the GPU has no MIG."""
    try:
        cur, pend = nv.nvmlDeviceGetMigMode(h)
    except nv.NVMLError_NotSupported:
        return None
    return {"current": bool(cur), "pending": bool(pend)}


def _info(nv, h, index):
    fn = getattr(nv, "nvmlDeviceGetGpuInstanceProfileInfoV", None)
    return fn(h, index, 2) if fn else nv.nvmlDeviceGetGpuInstanceProfileInfo(h, index)


def profiles(nv, h) -> list[dict]:
    """The GPU instance profiles this GPU offers, by NVML's profile index (readable with MIG off)."""
    out = []
    for index in range(int(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 16))):
        try:
            i = _info(nv, h, index)
        except nv.NVMLError:        # NotSupported / InvalidArgument: not a profile of this GPU
            continue
        name = _s(getattr(i, "name", "") or "")
        name = name[4:] if name.startswith("MIG ") else name
        out.append({"index": index, "id": int(i.id), "name": name or f"{i.sliceCount}g.{i.memorySizeMB}mb",
                    "slices": int(i.sliceCount), "instances": int(i.instanceCount),
                    "memory_mb": int(i.memorySizeMB), "sm": int(i.multiprocessorCount)})
    return out


def read_layout(nv, h, profs: list[dict] | None = None) -> list[dict]:
    """GPU instances with their compute instances and MIG device UUIDs (MIG mode must be on)."""
    names = {p["id"]: p["name"] for p in (profs if profs is not None else profiles(nv, h))}
    uuids = {}
    for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except nv.NVMLError:      # NotFound: that slot holds no MIG device
            continue
        uuids[(nv.nvmlDeviceGetGpuInstanceId(mh), nv.nvmlDeviceGetComputeInstanceId(mh))] = _s(nv.nvmlDeviceGetUUID(mh))
    out = []
    for gi_id in range(MAX_GI_ID):
        try:
            gi = nv.nvmlDeviceGetGpuInstanceById(h, gi_id)
        except nv.NVMLError:      # NotFound / InvalidArgument
            continue
        info = nv.nvmlGpuInstanceGetInfo(gi)
        cis = []
        for ci_id in range(MAX_CI_ID):
            try:
                ci = nv.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
            except nv.NVMLError:
                continue
            ci_info = nv.nvmlComputeInstanceGetInfo(ci)
            cis.append({"id": int(ci_info.id), "profile_id": int(ci_info.profileId),
                        "uuid": uuids.get((int(info.id), int(ci_info.id)))})
        out.append({"id": int(info.id), "profile_id": int(info.profileId),
                    "name": names.get(int(info.profileId), f"profile {int(info.profileId)}"),
                    "start": int(info.placement.start), "size": int(info.placement.size), "compute": cis})
    return out


def counts(layout: list[dict]) -> dict[str, int]:
    """{profile name: GPU instances}: the form nvidia-mig-parted's mig-devices takes."""
    out: dict[str, int] = {}
    for gi in layout:
        out[gi["name"]] = out.get(gi["name"], 0) + 1
    return dict(sorted(out.items()))


def devices(layout: list[dict]) -> list[dict]:
    """One entry per MIG device (a compute instance): what services, MPS and health name."""
    return [{"uuid": ci["uuid"], "profile": gi["name"], "gpu_instance": gi["id"], "compute_instance": ci["id"]}
            for gi in layout for ci in gi["compute"]]


def state(nv, h) -> dict:
    """{"mode", "profiles", "layout", "devices"}: mode None where the GPU has no MIG."""
    m = mode(nv, h)
    if m is None:
        return {"mode": None, "profiles": [], "layout": [], "devices": []}
    profs = profiles(nv, h)
    layout = read_layout(nv, h, profs) if m["current"] else []
    return {"mode": m, "profiles": profs, "layout": layout, "devices": devices(layout)}


# a MIG device by position: mig:GPU/SLOT, GPU an NVML index or the parent's UUID, SLOT its place in the layout
POS_RE = (r"mig:([0-9]|[1-5][0-9]|6[0-3]|GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
          r"/([0-9]|[1-2][0-9]|3[01])")


def parse_pos(ref) -> tuple[int | str, int] | None:
    """'mig:0/1' -> (0, 1); 'mig:GPU-<uuid>/2' -> ('GPU-<uuid>', 2); None for anything else."""
    import re
    m = re.fullmatch(POS_RE, ref) if isinstance(ref, str) else None
    if m is None:
        return None
    g = m.group(1)
    return (g if g.startswith("GPU-") else int(g)), int(m.group(2))


def slots(layout: list[dict]) -> list[dict]:
    """The GPU's MIG devices in slot order: GPU instances by placement (their first memory slice,
    `nvidia-smi mig -lgi`'s Placement), then compute instance id. Re-creating the same mig-parted
    layout gives the same slots; the UUIDs are new."""
    return [{"uuid": ci["uuid"], "profile": gi["name"], "gpu_instance": gi["id"], "compute_instance": ci["id"]}
            for gi in sorted(layout, key=lambda g: (g["start"], g["id"]))
            for ci in sorted(gi["compute"], key=lambda c: c["id"])]


def locate(nvml, ref: str) -> tuple[dict | None, str]:
    """(the MIG device `ref` names on this host, or None with why): ref is a MIG device UUID or a
    position (mig:GPU/SLOT). The device is devices()' entry plus "gpu" (the parent's NVML index),
    "gpu_name" and "slot". Raises HkError (UnsupportedError) where NVML cannot be read."""
    pos = parse_pos(ref)
    n = nvml.count()
    if pos is None:
        for i in range(n):
            for slot, d in enumerate(slots(nvml.mig(i).get("layout") or [])):
                if d.get("uuid") == ref:
                    return {**d, "gpu": i, "slot": slot,
                            "gpu_name": nvml.gpu(i, ("name",)).get("name") or "unknown"}, ""
        return None, (f"no MIG device {ref} on this host (MIG devices do not survive a GPU reset or reboot "
                      "unless re-created, and then get new UUIDs: name it by position, mig:GPU/SLOT)")
    gpu, slot = pos
    if isinstance(gpu, str):
        idx = next((i for i in range(n) if nvml.gpu(i, ("uuid",)).get("uuid") == gpu), None)
        if idx is None:
            return None, f"no GPU {gpu} on this host"
    else:
        if gpu >= n:
            return None, f"no GPU {gpu} on this host ({n} GPU{'s' if n != 1 else ''})"
        idx = gpu
    devs = slots(nvml.mig(idx).get("layout") or [])
    if slot >= len(devs):
        return None, (f"GPU {idx} has no MIG device in slot {slot} (its layout has {len(devs)}: "
                      "MIG off, or the layout not re-created since a GPU reset or reboot)")
    return {**devs[slot], "gpu": idx, "slot": slot, "gpu_name": nvml.gpu(idx, ("name",)).get("name") or "unknown"}, ""


def find(nvml, ref: str) -> dict | None:
    """The MIG device with this UUID, or at this position (mig:GPU/SLOT), on this host, through the
    nvml backend (Nvml or ReplayNvml): locate()'s device, None where there is none.
    Raises HkError (UnsupportedError) where NVML cannot be read."""
    return locate(nvml, ref)[0]


# ---------------------------------------------------------------- writes
def set_mode(nv, h, on: bool) -> int:
    """nvmlDeviceSetMigMode; the activation status (SUCCESS, RESET_REQUIRED, IN_USE, ...)."""
    try:
        return int(nv.nvmlDeviceSetMigMode(h, 1 if on else 0))
    except _err(nv, "InUse"):
        return IN_USE
    except _err(nv, "ResetRequired"):
        return RESET_REQUIRED


def destroy_all(nv, h) -> None:
    """Compute instances first, then their GPU instances (NVML refuses the other order)."""
    for gi_id in range(MAX_GI_ID):
        try:
            gi = nv.nvmlDeviceGetGpuInstanceById(h, gi_id)
        except nv.NVMLError:
            continue
        for ci_id in range(MAX_CI_ID):
            try:
                ci = nv.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
            except nv.NVMLError:
                continue
            _call(nv, f"destroy compute instance {gi_id}/{ci_id}", nv.nvmlComputeInstanceDestroy, ci)
        _call(nv, f"destroy GPU instance {gi_id}", nv.nvmlGpuInstanceDestroy, gi)


def write_layout(nv, h, want: dict[str, int]) -> None:
    """Replace the GPU's instances by {profile name: count} (mig-parted's mig-devices)."""
    profs = profiles(nv, h)
    destroy_all(nv, h)
    create(nv, h, want, profs)


def create(nv, h, want: dict[str, int], profs: list[dict] | None = None) -> None:
    """GPU instances for {profile name: count}, largest first (as mig-parted places them), each
    with one compute instance spanning it."""
    by_name = {p["name"]: p for p in (profs if profs is not None else profiles(nv, h))}
    for name in sorted(want, key=lambda n: -by_name[n]["slices"]):
        p = by_name[name]
        for _ in range(want[name]):
            gi = _call(nv, f"create GPU instance {name}", nv.nvmlDeviceCreateGpuInstance, h, p["id"])
            ci_id = _full_compute_profile(nv, gi, p["slices"])
            _call(nv, f"create compute instance on {name}", nv.nvmlGpuInstanceCreateComputeInstance, gi, ci_id)


def _full_compute_profile(nv, gi, slices: int) -> int:
    shared = getattr(nv, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
    for index in range(int(getattr(nv, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 9))):
        try:
            i = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, shared)
        except nv.NVMLError:
            continue
        if int(i.sliceCount) == slices:
            return int(i.id)
    raise UnsupportedError(f"no compute instance profile of {slices} slices on this GPU instance")


def _call(nv, what, fn, *args):
    try:
        return fn(*args)
    except nv.NVMLError_NotSupported:
        raise UnsupportedError(f"MIG {what}: not supported by this GPU or driver") from None
    except nv.NVMLError as e:
        raise ApplyError(f"MIG {what}: {e}") from None


# ---------------------------------------------------------------- a recorded GPU
class MigError(Exception):
    def __init__(self, text, code=0):
        super().__init__(text)
        self.code = code


class MigNotSupported(MigError):
    pass


class MigNotFound(MigError):
    pass


class MigInUse(MigError):
    pass


class MigInsufficient(MigError):
    pass


class MigLib:
    """The pynvml MIG calls above, answered from one recorded GPU (the `gpu.gpus[]` entry of the
    facts): `mig` {current, pending}, `mig_profiles` (profiles()' form), `mig_max_slices`,
    `mig_instances` (read_layout()'s form), `mig_reset_required` (pass-through: the mode waits for
    a reset), `processes`. Writes change the record as nvml.h documents them:
    - nvmlDeviceSetMigMode: IN_USE while processes hold the GPU; RESET_REQUIRED where the platform
      cannot reset (pass-through): the pending mode changes, the current one waits.
    - nvmlDeviceCreateGpuInstance: InsufficientResources beyond a profile's instance count or the
      GPU's slices (placement is reduced to counting slices); NotSupported with MIG off.
    - nvmlGpuInstanceDestroy: InUse while it still has compute instances.
    UUIDs of new MIG devices are derived from the GPU's UUID, the instance ids and a count of the
    devices made: a device made again gets a new UUID, as on a real GPU."""

    NVMLError = MigError
    NVMLError_NotSupported = MigNotSupported
    NVMLError_NotFound = MigNotFound
    NVMLError_InUse = MigInUse
    NVML_GPU_INSTANCE_PROFILE_COUNT = 16
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 9
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0

    def __init__(self, gpu: dict):
        self.g = gpu

    # --- reads
    def nvmlDeviceGetMigMode(self, h):
        m = self.g.get("mig")
        if m is None:
            raise MigNotSupported("Not Supported")
        return [int(m["current"]), int(m["pending"])]

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, h, index, version=2):
        for p in self.g.get("mig_profiles") or []:
            if p["index"] == index:
                return SimpleNamespace(id=p["id"], name=f"MIG {p['name']}", sliceCount=p["slices"],
                                       instanceCount=p["instances"], memorySizeMB=p["memory_mb"],
                                       multiprocessorCount=p.get("sm", 0))
        raise MigNotSupported("Not Supported")

    def _on(self):
        if not (self.g.get("mig") or {}).get("current"):
            raise MigNotSupported("Not Supported")
        return self.g.setdefault("mig_instances", [])

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7 if (self.g.get("mig") or {}).get("current") else 0

    def _devices(self):
        return [(gi, ci) for gi in self._on() for ci in gi["compute"]]

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        devs = self._devices()
        if i >= len(devs):
            raise MigNotFound("Not Found")
        return devs[i]

    def nvmlDeviceGetGpuInstanceId(self, mh):
        return mh[0]["id"]

    def nvmlDeviceGetComputeInstanceId(self, mh):
        return mh[1]["id"]

    def nvmlDeviceGetUUID(self, mh):
        return mh[1]["uuid"]

    def nvmlDeviceGetGpuInstanceById(self, h, gi_id):
        for gi in self._on():
            if gi["id"] == gi_id:
                return gi
        raise MigNotFound("Not Found")

    def nvmlGpuInstanceGetInfo(self, gi):
        return SimpleNamespace(id=gi["id"], profileId=gi["profile_id"],
                               placement=SimpleNamespace(start=gi["start"], size=gi["size"]))

    def nvmlGpuInstanceGetComputeInstanceById(self, gi, ci_id):
        for ci in gi["compute"]:
            if ci["id"] == ci_id:
                return (gi, ci)
        raise MigNotFound("Not Found")

    def nvmlComputeInstanceGetInfo(self, ci):
        return SimpleNamespace(id=ci[1]["id"], profileId=ci[1]["profile_id"])

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, index, eng):
        # the compute profile index of an n-slice compute instance is the GPU profile index of n slices
        for p in self.g.get("mig_profiles") or []:
            if p["index"] == index:
                return SimpleNamespace(id=index, sliceCount=p["slices"])
        raise MigNotSupported("Not Supported")

    # --- writes
    def nvmlDeviceSetMigMode(self, h, on):
        m = self.g.get("mig")
        if m is None:
            raise MigNotSupported("Not Supported")
        p = self.g.get("processes") or {}
        if p.get("compute") or p.get("mps") or (not on and self.g.get("mig_instances")):
            return IN_USE
        m["pending"] = bool(on)
        if self.g.get("mig_reset_required"):
            return RESET_REQUIRED
        m["current"] = bool(on)
        return SUCCESS

    def nvmlDeviceCreateGpuInstance(self, h, profile_id):
        gis = self._on()
        p = next((p for p in self.g["mig_profiles"] if p["id"] == profile_id), None)
        if p is None:
            raise MigNotSupported("Not Supported")
        used = sum(gi["size"] for gi in gis)
        same = sum(1 for gi in gis if gi["profile_id"] == profile_id)
        if same >= p["instances"] or used + p["slices"] > self.g.get("mig_max_slices", 7):
            raise MigInsufficient("Insufficient Resources")
        gi = {"id": min(set(range(1, MAX_GI_ID)) - {g["id"] for g in gis}), "profile_id": profile_id,
              "name": p["name"], "start": used, "size": p["slices"], "compute": []}
        gis.append(gi)
        return gi

    def nvmlGpuInstanceCreateComputeInstance(self, gi, ci_profile):
        ci_id = len(gi["compute"])
        # as on a real GPU, a device made again (after a reset or reboot) gets a new UUID
        made = self.g["mig_made"] = self.g.get("mig_made", 0) + 1
        u = uuidlib.uuid5(uuidlib.NAMESPACE_OID, f"{self.g.get('uuid')}/{gi['id']}/{ci_id}/{made}")
        ci = {"id": ci_id, "profile_id": ci_profile, "uuid": f"MIG-{u}"}
        gi["compute"].append(ci)
        return (gi, ci)

    def nvmlComputeInstanceDestroy(self, ci):
        ci[0]["compute"].remove(ci[1])

    def nvmlGpuInstanceDestroy(self, gi):
        if gi["compute"]:
            raise MigInUse("In use by another client")
        self._on().remove(gi)

