"""Which GPUs a Triton service sees: NVML indices, or one MIG device named by its UUID.

`triton.gpu` is 3, [4, 5], null (every GPU), or `MIG-<uuid>` as `nvidia-smi -L` and NVML print a
MIG device (the form CUDA_VISIBLE_DEVICES and the NVIDIA container toolkit's `--gpus device=` take).
A MIG device is named alone: a CUDA process enumerates one MIG device (NVIDIA's MIG user guide,
"CUDA Device Enumeration"). Inside, the server sees it as device 0; its CPUs and NUMA node are the
parent GPU's.

>>> is_mig("MIG-a30a30a3-0000-5000-8000-000000000301"), is_mig("GPU-a30a30a3-0000-5000-8000-000000000301")
(True, False)
"""
from __future__ import annotations

import re

from hkgpu_tune.backends.mig import find as find_mig  # noqa: F401 (callers use devices.find_mig)

MIG_RE = r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
MIG_WHAT = "a GPU index or a MIG device UUID (MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi -L prints it)"


def is_mig(v) -> bool:
    return isinstance(v, str) and re.fullmatch(MIG_RE, v) is not None


def gpu_set(n) -> tuple[int | str, ...] | None:
    """gpu: 3 | [4, 5] | MIG-<uuid> | null (every GPU), GPUs as NVML (and nvidia-smi) number them."""
    import yaml
    if n.is_null():
        return None
    if isinstance(n.node, yaml.SequenceNode):
        items = n.items()
        for i in items:
            if isinstance(i.node, yaml.ScalarNode) and str(i.node.value).startswith("MIG-"):
                raise i.error("a MIG device is named alone (gpu: MIG-...), not in a list: a CUDA process "
                              "enumerates one MIG device")
        ids = tuple(i.integer(0, 63) for i in items)
        if not ids or len(set(ids)) != len(ids):
            raise n.error("expected a GPU index or a list of distinct GPU indices")
        return ids
    if isinstance(n.node, yaml.ScalarNode) and n.node.tag.endswith(":str"):
        return (n.string(MIG_RE, MIG_WHAT),)
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


def mig_check(nvml, uuid: str) -> tuple[str, str, str]:
    """(status, current, reason) for a named MIG device: ok where it exists, drift where no GPU
    of this host has it (a MIG layout lost at a GPU reset or reboot), unsupported where NVML
    cannot be read."""
    from hkgpu_tune.core.errors import HkError
    try:
        d = find_mig(nvml, uuid)
    except HkError as e:
        return "unsupported", "", f"cannot read MIG devices through NVML: {e}"
    if d is None:
        return ("drift", "absent", f"no MIG device {uuid} on this host (MIG devices do not survive a GPU reset "
                "or reboot unless re-created: apply the gpu.mig layout, then name the new UUID)")
    return "ok", f"{d['profile']} on GPU {d['gpu']}", f"GPU instance {d['gpu_instance']}, compute instance " \
                                                       f"{d['compute_instance']} of GPU {d['gpu']} ({d['gpu_name']})"
