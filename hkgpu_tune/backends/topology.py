"""Host topology read from /sys and /proc through a backend (root-prefixed: tests replay recorded
trees) and NVML: CPU lists, NUMA nodes, NICs and their interrupts, the placement for a GPU's service.

>>> service_placement(Backends(), 0)    # doctest: +SKIP
{'cpus': [0, 1, ...], 'mems': [0], 'numa_node': 0, 'source': 'nvml cpu affinity + sysfs numa node'}
"""
from __future__ import annotations

import errno
import os
import re

from hkgpu_tune.core.errors import ApplyError, HkError, UnsupportedError


PCI_ADDR = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")



def parse_cpulist(s: str | None) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    out: list[int] = []
    for part in (s or "").replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return sorted(set(out))



def format_cpulist(cpus) -> str:
    cpus = sorted(set(cpus))
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)



def online_cpus(fs) -> list[int]:
    return parse_cpulist(fs.read("/sys/devices/system/cpu/online"))



def numa_nodes(fs) -> dict[int, list[int]]:
    out = {}
    for d in fs.listdir("/sys/devices/system/node"):
        if re.fullmatch(r"node\d+", d):
            out[int(d[4:])] = parse_cpulist(fs.read(f"/sys/devices/system/node/{d}/cpulist"))
    return out



def _real(fs, path: str) -> str:
    """The path a sysfs link points to, relative to the backend's root."""
    root = os.path.realpath(fs.p("/"))
    real = os.path.realpath(fs.p(path))
    return "/" + os.path.relpath(real, root)



def pci_device(fs, pci: str) -> dict:
    base = f"/sys/bus/pci/devices/{pci}"
    node = fs.read(f"{base}/numa_node")
    node = int(node) if node not in (None, "") and int(node) >= 0 else None
    return {"pci": pci, "numa_node": node, "local_cpus": parse_cpulist(fs.read(f"{base}/local_cpulist")),
            "msi_irqs": sorted(int(x) for x in fs.listdir(f"{base}/msi_irqs") if x.isdigit())}



def default_route_ifaces(fs) -> set[str]:
    out = set()
    for line in (fs.read("/proc/net/route") or "").splitlines()[1:]:
        f = line.split()
        if len(f) > 7 and f[1] == "00000000" and f[7] == "00000000":
            out.add(f[0])
    return out



def nics(fs) -> list[dict]:
    """Network interfaces that sit on a PCI device (virtual links have no interrupts to pin)."""
    out, default = [], default_route_ifaces(fs)
    for name in fs.listdir("/sys/class/net"):
        if not fs.exists(f"/sys/class/net/{name}/device"):
            continue
        dev = _real(fs, f"/sys/class/net/{name}/device")
        pci = next((p for p in reversed(dev.split("/")) if PCI_ADDR.match(p)), None)
        if pci is None:
            continue
        drv = fs.readlink(f"/sys/class/net/{name}/device/driver")
        out.append({"name": name, "mac": (fs.read(f"/sys/class/net/{name}/address") or "").lower(),
                    "driver": os.path.basename(drv) if drv else None, "pci": pci,
                    "default_route": name in default, **pci_device(fs, pci)})
    return out



def irq_names(fs) -> dict[int, str]:
    out = {}
    for line in (fs.read("/proc/interrupts") or "").splitlines()[1:]:
        head, _, rest = line.partition(":")
        if head.strip().isdigit():
            out[int(head)] = rest.split()[-1] if rest.split() else ""
    return out



def irq_affinity(fs, irq: int) -> dict:
    return {"irq": irq, "smp_affinity_list": fs.read(f"/proc/irq/{irq}/smp_affinity_list"),
            "effective": fs.read(f"/proc/irq/{irq}/effective_affinity_list")}



def set_irq_affinity(fs, irq: int, cpus: str) -> str:
    """Write /proc/irq/N/smp_affinity_list and return what the kernel shows afterwards."""
    path = f"/proc/irq/{irq}/smp_affinity_list"
    try:
        fs.write(path, cpus)
    except FileNotFoundError:
        raise UnsupportedError(f"IRQ {irq}: no such interrupt") from None
    except OSError as e:
        if e.errno == errno.EIO:
            raise UnsupportedError(f"IRQ {irq}: a kernel-managed interrupt, its affinity cannot be set") from None
        if e.errno in (errno.EPERM, errno.EACCES):
            raise HkError(f"IRQ {irq}: permission denied (run as root)", e.errno) from None
        if e.errno == errno.EINVAL:
            raise UnsupportedError(f"IRQ {irq}: the kernel refuses CPUs {cpus}", e.errno) from None
        raise ApplyError(f"IRQ {irq}: {e.strerror}", e.errno) from None
    got = fs.read(path)
    if got is None or parse_cpulist(got) != parse_cpulist(cpus):
        raise ApplyError(f"IRQ {irq}: wrote {cpus}, the kernel shows {got}")
    return got



def _node_of(cpus, nodes) -> list[int]:
    return sorted(n for n, c in nodes.items() if set(cpus) & set(c))



def sysfs_pci(bus_id: str) -> str:
    """NVML's PCI bus id (8-digit domain) as sysfs names the device (4-digit domain, lower case)."""
    pci = bus_id.lower()
    return pci[4:] if len(pci) == 16 else pci



def service_placement(backends, gpu_index: int) -> dict:
    """CPUs and NUMA memory node for a service that drives GPU `gpu_index`.

    Returns {"cpus": [ints], "mems": [ints], "numa_node": int|None, "source": str}. With no GPU or
    no NVML: all online CPUs, no memory binding, "known": False, and the source says why. For a unit:
    CPUAffinity=<cpus> NUMAPolicy=bind NUMAMask=<mems>; for a container: --cpuset-cpus/--cpuset-mems.
    """
    fs = backends.sysfs
    allc = online_cpus(fs)
    try:
        g = backends.nvml.gpu(gpu_index, ("pci_bus_id", "cpu_affinity", "numa_node"))
    except UnsupportedError as e:
        return {"cpus": allc, "mems": [], "numa_node": None, "source": f"all CPUs: {e}", "known": False}
    pci = sysfs_pci(g.get("pci_bus_id") or "")
    dev = pci_device(fs, pci) if pci else {"numa_node": None, "local_cpus": []}
    node = g.get("numa_node") if g.get("numa_node") is not None and g["numa_node"] >= 0 else dev["numa_node"]
    cpus = [c for c in (g.get("cpu_affinity") or dev["local_cpus"]) if not allc or c in allc]
    src = "nvml cpu affinity" if g.get("cpu_affinity") else "sysfs local_cpulist"
    if node is not None:
        ncpus = numa_nodes(fs).get(node, [])
        if set(cpus) & set(ncpus):
            cpus = sorted(set(cpus) & set(ncpus))
        src += " + " + ("nvml numa node" if g.get("numa_node") is not None else "sysfs numa node")
    else:
        src += "; no NUMA node reported (single-node host or firmware without SRAT)"
    return {"cpus": cpus or allc, "mems": [node] if node is not None else [], "numa_node": node, "source": src}



def unit_lines(placement: dict) -> list[str]:
    """systemd [Service] lines that apply a placement."""
    out = [f"CPUAffinity={' '.join(map(str, placement['cpus']))}"]
    if placement["mems"]:
        out += ["NUMAPolicy=bind", f"NUMAMask={format_cpulist(placement['mems'])}"]
    return out
