"""Which GPUs a Triton service sees: NVML indices, or one MIG device, by position or by UUID.

`triton.gpu` is 3, [4, 5], null (every GPU), or one MIG device:
- by position, `mig:GPU/SLOT`: GPU the parent's NVML index (or its `GPU-<uuid>`), SLOT the device's
  place in that GPU's layout counted from 0 in placement order (backends/mig.py slots()). The boot
  unit re-creates a mig-parted layout with new UUIDs but the same slots: the position still names
  the device, resolved to its UUID when the service starts and in verify;
- by UUID, `MIG-<uuid>` as `nvidia-smi -L` and NVML print it (the form CUDA_VISIBLE_DEVICES and the
  NVIDIA container toolkit's `--gpus device=` take); it is lost when the layout is made again.
A MIG device is named alone: a CUDA process enumerates one MIG device (NVIDIA's MIG user guide,
"CUDA Device Enumeration"). Inside, the server sees it as device 0; its CPUs and NUMA node are the
parent GPU's.

>>> is_mig("MIG-a30a30a3-0000-5000-8000-000000000301"), is_mig("GPU-a30a30a3-0000-5000-8000-000000000301")
(True, False)
>>> is_mig("mig:0/1"), is_mig_pos("mig:0/1"), is_mig_pos("mig:0/32")
(True, True, False)
"""
from __future__ import annotations

import re

from hkgpu_tune.backends.mig import POS_RE, locate, parse_pos

MIG_RE = r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
MIG_WHAT = ("a GPU index or a MIG device UUID (MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi -L prints it) "
            "or position (mig:GPU/SLOT)")
POS_WHAT = ("a MIG device by position, mig:GPU/SLOT (GPU an index 0-63 or the parent's GPU-<uuid>, SLOT 0-31: "
            "its place in the GPU's MIG layout)")


class MigPos(str):
    """A MIG device by position ('mig:0/1'), with the profile node it came from (its errors name
    file, line and key)."""
    node = None

    @property
    def gpu(self) -> int | str:
        return parse_pos(self)[0]

    @property
    def slot(self) -> int:
        return parse_pos(self)[1]


def is_mig(v) -> bool:
    """A MIG device: by UUID or by position."""
    return isinstance(v, str) and (re.fullmatch(MIG_RE, v) is not None or parse_pos(v) is not None)


def is_mig_pos(v) -> bool:
    return parse_pos(v) is not None


def mig_ref(n) -> str:
    """One MIG device of the profile: a position (MigPos, keeping its node) or a UUID."""
    v = str(n.node.value)
    if v.startswith("mig:"):
        p = MigPos(n.string(POS_RE, POS_WHAT))
        p.node = n
        return p
    return n.string(MIG_RE, MIG_WHAT)


def resolve(nvml, ref) -> str:
    """The UUID of the MIG device `ref` names (a UUID is itself): what CUDA_VISIBLE_DEVICES and the
    container's --gpus take when the service starts. HkError naming the profile's line where this
    host has no such device."""
    from hkgpu_tune.core.errors import HkError
    if not is_mig_pos(ref):
        return ref
    d, why = locate(nvml, ref)
    if d is None:
        node = getattr(ref, "node", None)
        raise node.error(f"{ref}: {why}") if node is not None else HkError(f"{ref}: {why}")
    return d["uuid"]


ENV_DIR = "/run/hkgpu-tune"     # the units' MIG environment files (tmpfs: gone at reboot, written at start)


def env_file(unit: str) -> str:
    return f"{ENV_DIR}/mig-{unit}.env"


def host_nvml(backends=None):
    """The NVML to resolve a position against: the caller's, else a replay named by
    $HKGPU_TUNE_NVML_REPLAY (tests, hosts without a GPU), else the host's."""
    if backends is not None:
        return backends.nvml
    from hkgpu_tune.backends.nvml import replay_from_env
    r = replay_from_env()
    if r is not None:
        return r
    from hkgpu_tune.backends.nvml import Nvml
    return Nvml()


def start_lines(ref, unit: str) -> list[str]:
    """Unit lines that find a MIG position's UUID each time the unit starts: ExecStartPre (as root,
    `+`) writes CUDA_VISIBLE_DEVICES=<UUID> to the unit's file under /run, which the next command
    (ExecStart) reads; '-': absent before the first start. After= the boot unit, which re-creates
    the layout."""
    from hkgpu_tune.core import unitfile
    from hkgpu_tune.core.paths import entry_point
    f = env_file(unit)
    exe = entry_point("hkgpu-tune entry point for a MIG service unit")
    return [f"ExecStartPre=+{unitfile.exec_line([*exe, 'mig-env', str(ref), f], 'mig-env command')}",
            f"EnvironmentFile=-{unitfile.path(f, 'MIG environment file')}"]


def check_layout(profile) -> None:
    """Each MIG position the profile names (triton.gpu, mps.gpus) against the profile's own gpu.mig,
    where it has one: the GPU has an entry with MIG on, and the slot lies within its mig-devices."""
    g = profile.section("gpu")
    entries = getattr(g, "mig", None)
    if not entries:
        return
    for pos in named_positions(profile):
        if pos.node is None or not isinstance(pos.gpu, int):
            continue
        e = next((e for e in entries if e.devices is None or pos.gpu in e.devices), None)
        if e is None:
            raise pos.node.error(f"{pos}: GPU {pos.gpu} has no entry in gpu.mig (no such GPU in the layout)")
        if not e.enabled:
            raise pos.node.error(f"{pos}: MIG is off on GPU {pos.gpu} (gpu.mig, line {e.line})")
        n = sum(c for _, c in e.layout)
        if e.layout and pos.slot >= n:
            raise pos.node.error(f"{pos}: slot {pos.slot} is beyond GPU {pos.gpu}'s layout in gpu.mig "
                                 f"(line {e.line}: {n} MIG device{'s' if n != 1 else ''}, slots 0-{n - 1})")


def named_positions(profile) -> list[MigPos]:
    t = profile.section("triton")
    every = tuple(t) if isinstance(t, tuple) else ((t,) if t is not None else ())   # triton.services: each
    out = [g for one in every for g in (one.gpus or ()) if isinstance(g, MigPos)]
    mps = profile.section("mps")
    out += [g for g in (getattr(mps, "gpus", None) or ()) if isinstance(g, MigPos)]
    return out


def gpu_set(n) -> tuple[int | str, ...] | None:
    """gpu: 3 | [4, 5] | mig:GPU/SLOT | MIG-<uuid> | null (every GPU), GPUs as NVML (and nvidia-smi) number them."""
    import yaml
    if n.is_null():
        return None
    if isinstance(n.node, yaml.SequenceNode):
        items = n.items()
        for i in items:
            if isinstance(i.node, yaml.ScalarNode) and str(i.node.value).startswith(("MIG-", "mig:")):
                raise i.error("a MIG device is named alone (gpu: mig:GPU/SLOT or MIG-...), not in a list: a "
                              "CUDA process enumerates one MIG device")
        ids = tuple(i.integer(0, 63) for i in items)
        if not ids or len(set(ids)) != len(ids):
            raise n.error("expected a GPU index or a list of distinct GPU indices")
        return ids
    if isinstance(n.node, yaml.ScalarNode) and n.node.tag.endswith(":str"):
        return (mig_ref(n),)
    return (n.integer(0, 63),)


def remap_gpus(config: dict, nodes: dict, visible, item) -> None:
    """instance_group gpus name GPUs as NVML numbers them; the server sees only `visible`
    (CUDA_VISIBLE_DEVICES, or the container's --gpus), renumbered from 0: the config gets the
    numbers the server sees. A GPU outside the set is refused at its line. With a MIG device the
    server sees one device, 0: a group names its parent GPU (one index) or no GPU."""
    if visible is None:
        return
    for gi, group in enumerate(config.get("instance_group", [])):
        if "gpus" not in group:
            continue
        mapped = []
        for j, g in enumerate(group["gpus"]):
            node = item
            try:
                node = nodes[("instance_group",)].items()[gi].mapping()["gpus"].items()[j]
            except (KeyError, IndexError, AttributeError):
                pass
            if is_mig(visible[0]):
                if len(group["gpus"]) != 1:
                    raise node.error(f"the server sees one MIG device ({visible[0]}): name its parent GPU "
                                     f"once, or no gpus")
                mapped.append(0)
                continue
            if int(g) not in visible:
                raise node.error(f"GPU {g} is not one this server sees (triton.gpu: "
                                 f"{list(visible) if len(visible) > 1 else visible[0]})")
            mapped.append(visible.index(int(g)))
        group["gpus"] = mapped


def mig_check(nvml, ref: str) -> tuple[str, str, str]:
    """(status, current, reason) for a named MIG device (UUID or position): ok where it exists, drift
    where this host has none (a MIG layout lost at a GPU reset or reboot, a UUID of a layout made
    again), unsupported where NVML cannot be read. A position's ok names the UUID it resolves to."""
    from hkgpu_tune.core.errors import HkError
    try:
        d, why = locate(nvml, ref)
    except HkError as e:
        return "unsupported", "", f"cannot read MIG devices through NVML: {e}"
    if d is None:
        return "drift", "absent", why + ("" if is_mig_pos(ref) else "; apply the gpu.mig layout")
    where = f"GPU instance {d['gpu_instance']}, compute instance {d['compute_instance']} of GPU {d['gpu']} " \
            f"({d['gpu_name']})"
    if is_mig_pos(ref):
        return "ok", f"{d['profile']} on GPU {d['gpu']}", f"{d['uuid']}: {where}"
    return "ok", f"{d['profile']} on GPU {d['gpu']}", where
