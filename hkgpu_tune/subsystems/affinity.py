"""CPU and NUMA locality: NIC interrupts on the NIC's local CPUs, irqbalance kept off them, and the
CPU set / NUMA node for the inference service on each GPU.

Profile section:

    affinity:
      nics:
        - match: {driver: mlx5_core}   # the same match keys as network.interfaces
          irq_cpus: local              # the NIC's local CPUs, or a list such as "16-31"
          optional: false              # no NIC matched: ok instead of unsupported
      irqbalance_ban: true             # --banirq for every pinned interrupt
      services:
        - {name: tritonserver, gpu: 0} # running processes checked against service_placement()

Everything comes from /sys and /proc through `b.sysfs` (root-prefixed: tests replay recorded trees)
and from NVML for the GPUs.

>>> service_placement(Backends(), 0)    # doctest: +SKIP
{'cpus': [0, 1, ...], 'mems': [0], 'numa_node': 0, 'source': 'nvml cpu affinity + sysfs numa node'}
"""
from __future__ import annotations

import errno
import os
import re
import shlex
from dataclasses import dataclass

from hkgpu_tune.core.errors import ApplyError, HkError, UnsupportedError
from hkgpu_tune.core.match import matches
from hkgpu_tune.core.profile import IFNAME_RE, MAC_RE, PCI_RE, Match
from hkgpu_tune.core.report import DRIFT, OK, UNSUPPORTED
from hkgpu_tune.subsystems.base import Subsystem

PCI_ADDR = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
IRQBALANCE_FILES = ("/etc/default/irqbalance", "/etc/sysconfig/irqbalance")


# ------------------------------------------------------------------ CPU lists
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


# ------------------------------------------------------------------ profile
@dataclass(frozen=True)
class NicRule:
    match: Match
    irq_cpus: str = "local"        # "local" or a CPU list
    optional: bool = False
    line: int = 0


@dataclass(frozen=True)
class ServiceRule:
    name: str
    gpu: int


@dataclass(frozen=True)
class AffinityProfile:
    nics: tuple[NicRule, ...] = ()
    irqbalance_ban: bool = False
    services: tuple[ServiceRule, ...] = ()


def _match(n) -> Match:
    mm = n.mapping(("name", "mac", "driver", "pci", "default_route"))
    if not mm:
        raise n.error("expected at least one of name, mac, driver, pci, default_route")
    pci = mm["pci"].string(PCI_RE, "a PCI address like 0000:3b:00.0").lower() if "pci" in mm else None
    return Match(
        name=mm["name"].string(IFNAME_RE, "an interface name (1-15 characters, no '/', ':' or spaces)") if "name" in mm else None,
        mac=mm["mac"].string(MAC_RE, "a MAC address like 0c:42:a1:00:00:01").lower() if "mac" in mm else None,
        driver=mm["driver"].string(r"[A-Za-z0-9_.-]{1,32}", "a driver name") if "driver" in mm else None,
        pci=("0000:" + pci if pci and len(pci) == 7 else pci),
        default_route=mm["default_route"].boolean() if "default_route" in mm else False)


MAX_CPU = 8191   # the kernel's largest NR_CPUS


def _cpulist(n) -> str:
    """'local' or a CPU list such as 16-31,48: ranges low to high, CPUs 0-8191."""
    v = n.string(r"local|[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*", "'local' or a CPU list such as 16-31")
    if v == "local":
        return v
    for part in v.split(","):
        a, _, b = part.partition("-")
        if int(a) > MAX_CPU or (b and not int(a) <= int(b) <= MAX_CPU):
            raise n.error(f"expected CPU ranges low-high within 0-{MAX_CPU}, got {part!r}")
    return v


def parse_profile(n) -> AffinityProfile:
    m = n.mapping(("nics", "irqbalance_ban", "services"))
    nics = []
    for item in (m["nics"].items() if "nics" in m else []):
        f = item.mapping(("match", "irq_cpus", "optional"), required=("match",))
        cpus = _cpulist(f["irq_cpus"]) if "irq_cpus" in f else "local"
        rule = NicRule(_match(f["match"]), cpus, f["optional"].boolean() if "optional" in f else False, item.line)
        for other in nics:   # the same match twice: one NIC pinned two ways, or a rule written twice
            if other.match == rule.match:
                raise item.error(f"match {rule.match.describe()} is already given at line {other.line}"
                                 + (f" with irq_cpus {other.irq_cpus} (here {rule.irq_cpus})"
                                    if other.irq_cpus != rule.irq_cpus else "") + ": one rule per interface")
        nics.append(rule)
    services, seen = [], {}
    for item in (m["services"].items() if "services" in m else []):
        s = item.mapping(("name", "gpu"), required=("name", "gpu"))
        rule = ServiceRule(s["name"].string(r"[^/\s]{1,15}", "a process name (comm, at most 15 characters)"),
                           s["gpu"].integer(0, 63))
        if rule.name in seen:
            raise item.error(f"service {rule.name} is already placed at line {seen[rule.name]}: one GPU per service")
        seen[rule.name] = item.line
        services.append(rule)
    return AffinityProfile(tuple(nics), m["irqbalance_ban"].boolean() if "irqbalance_ban" in m else False,
                           tuple(services))


# ------------------------------------------------------------------ topology from /sys and /proc
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


# ------------------------------------------------------------------ GPU placement (for the Triton issue)
def sysfs_pci(bus_id: str) -> str:
    """NVML's PCI bus id (8-digit domain) as sysfs names the device (4-digit domain, lower case)."""
    pci = bus_id.lower()
    return pci[4:] if len(pci) == 16 else pci


def service_placement(backends, gpu_index: int) -> dict:
    """CPUs and NUMA memory node for a service that drives GPU `gpu_index`.

    Returns {"cpus": [ints], "mems": [ints], "numa_node": int|None, "source": str}. With no GPU or
    no NVML: all online CPUs, no memory binding, and the source says why. For a unit:
    CPUAffinity=<cpus> NUMAPolicy=bind NUMAMask=<mems>; for a container: --cpuset-cpus/--cpuset-mems.
    """
    fs = backends.sysfs
    allc = online_cpus(fs)
    try:
        g = backends.nvml.gpu(gpu_index, ("pci_bus_id", "cpu_affinity", "numa_node"))
    except UnsupportedError as e:
        return {"cpus": allc, "mems": [], "numa_node": None, "source": f"all CPUs: {e}"}
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


def _processes(fs, name: str) -> list[dict]:
    out = []
    for pid in fs.listdir("/proc"):
        if pid.isdigit() and (fs.read(f"/proc/{pid}/comm") or "") == name:
            st = dict(line.split(":\t", 1) for line in (fs.read(f"/proc/{pid}/status") or "").splitlines()
                      if ":\t" in line)
            out.append({"pid": int(pid), "cpus": st.get("Cpus_allowed_list", "").strip(),
                        "mems": st.get("Mems_allowed_list", "").strip()})
    return out


def _irqbalance_args(text: str) -> tuple[str, list[int]]:
    for line in (text or "").splitlines():
        mt = re.match(r"\s*IRQBALANCE_ARGS\s*=\s*(.*)$", line)
        if mt:
            try:
                args = " ".join(shlex.split(mt.group(1)))
            except ValueError:
                args = mt.group(1)
            return args, sorted(int(x) for x in re.findall(r"--banirq[= ](\d+)", args))
    return "", []


def _irqbalance_text(text: str, irqs: list[int]) -> str:
    args, _ = _irqbalance_args(text)
    keep = re.sub(r"\s*--banirq[= ]\d+", "", args).strip()
    new = " ".join([keep] * bool(keep) + [f"--banirq={i}" for i in irqs])
    line = f'IRQBALANCE_ARGS="{new}"'
    lines = [ln for ln in (text or "").splitlines()]
    for i, ln in enumerate(lines):
        if re.match(r"\s*IRQBALANCE_ARGS\s*=", ln):
            lines[i] = line
            break
    else:
        lines.append(line)
    return "\n".join(lines) + "\n"


class Plugin(Subsystem):
    name = "affinity"

    @property
    def cfg(self) -> AffinityProfile:
        return self.profile.section("affinity") or AffinityProfile()

    def _gpus(self) -> dict:
        try:
            n = self.b.nvml.count()
        except UnsupportedError as e:
            return {"unsupported": str(e)}
        return {"placement": {i: service_placement(self.b, i) for i in range(n)}}

    def read(self) -> dict:
        fs = self.b.sysfs
        st = {"cpus": format_cpulist(online_cpus(fs)),
              "nodes": {n: format_cpulist(c) for n, c in numa_nodes(fs).items()},
              "nics": nics(fs), "irqs": {}, "irq_names": irq_names(fs)}
        for nic in st["nics"]:
            for irq in nic["msi_irqs"]:
                st["irqs"][irq] = irq_affinity(fs, irq)
        st["gpus"] = self._gpus() if (self.cfg.services or not self.cfg.nics) else {}
        if self.cfg.irqbalance_ban:
            path = next((p for p in IRQBALANCE_FILES if fs.exists(p)), IRQBALANCE_FILES[0])
            procs = _processes(fs, "irqbalance")
            st["irqbalance"] = {"file": path, "text": fs.read(path), "running": bool(procs)}
        st["services"] = {s.name: _processes(fs, s.name) for s in self.cfg.services}
        return st

    def facts(self) -> dict:
        st = self.read()
        st["gpus"] = self._gpus()
        return st

    def compare(self, st):
        res, pinned = [], []
        nodes = {n: parse_cpulist(c) for n, c in st["nodes"].items()}
        for rule in self.cfg.nics:
            found = [n for n in st["nics"] if matches(rule.match, n)]
            if not found:
                res.append(self.result(f"match {rule.match.describe()}", "irq_affinity", None, rule.irq_cpus,
                                       OK if rule.optional else UNSUPPORTED, "no PCI network interface matches",
                                       required=not rule.optional))
            for nic in found:
                want = parse_cpulist(rule.irq_cpus) if rule.irq_cpus != "local" else nic["local_cpus"]
                want = want or parse_cpulist(st["cpus"])
                where = f"node {nic['numa_node']}" if nic["numa_node"] is not None else "this host (no NUMA node reported)"
                if not nic["msi_irqs"]:
                    res.append(self.result(nic["name"], "irq_affinity", None, format_cpulist(want), UNSUPPORTED,
                                           "no MSI interrupts listed for this device", required=False))
                for irq in nic["msi_irqs"]:
                    a = st["irqs"].get(irq) or {}
                    cur = a.get("smp_affinity_list")
                    t = f"{nic['name']} irq{irq}" + (f" ({st['irq_names'][irq]})" if irq in st["irq_names"] else "")
                    if cur is None:
                        res.append(self.result(t, "smp_affinity_list", None, format_cpulist(want), UNSUPPORTED,
                                               "no /proc/irq entry", required=False))
                        continue
                    pinned.append(irq)
                    if set(parse_cpulist(cur)) <= set(want):
                        res.append(self.result(t, "smp_affinity_list", cur, format_cpulist(want), OK,
                                               f"NIC local to {where}"))
                        continue
                    off = _node_of(parse_cpulist(cur), nodes)
                    res.append(self.result(
                        t, "smp_affinity_list", cur, format_cpulist(want), DRIFT,
                        f"interrupt on CPUs {cur} (node {','.join(map(str, off)) or '?'}); NIC local to {where}",
                        write=format_cpulist(want), data={"irq": irq}))
        if self.cfg.irqbalance_ban:
            ib = st["irqbalance"]
            _, banned = _irqbalance_args(ib["text"])
            want = sorted(set(pinned))
            if set(want) <= set(banned):
                res.append(self.result("irqbalance", "banned_irqs", banned, want, OK,
                                       "running" if ib["running"] else "not running"))
            else:
                res.append(self.result("irqbalance", "banned_irqs", banned, want, DRIFT,
                                       f"irqbalance may move pinned interrupts ({ib['file']})",
                                       write=_irqbalance_text(ib["text"], sorted(set(banned) | set(want))),
                                       data={"file": ib["file"], "old": ib["text"], "running": ib["running"]}))
        for s in self.cfg.services:
            pl = (st["gpus"].get("placement") or {}).get(s.gpu)
            if pl is None:
                why = st["gpus"].get("unsupported") or f"no GPU {s.gpu} on this host"
                res.append(self.result(s.name, "cpus", None, None, UNSUPPORTED, why))
                continue
            procs = st["services"].get(s.name) or []
            if not procs:
                res.append(self.result(s.name, "cpus", None, format_cpulist(pl["cpus"]), UNSUPPORTED,
                                       "not running", required=False))
            for p in procs:
                cur = parse_cpulist(p["cpus"])
                ok = bool(cur) and set(cur) <= set(pl["cpus"])
                res.append(self.result(f"{s.name} pid {p['pid']}", "cpus", p["cpus"], format_cpulist(pl["cpus"]),
                                       OK if ok else DRIFT, "" if ok else
                                       f"not on GPU {s.gpu}'s local CPUs: restart it with " + " ".join(unit_lines(pl))))
                if pl["mems"]:
                    okm = set(parse_cpulist(p["mems"])) <= set(pl["mems"])
                    res.append(self.result(f"{s.name} pid {p['pid']}", "mems", p["mems"],
                                           format_cpulist(pl["mems"]), OK if okm else DRIFT,
                                           "" if okm else f"memory not bound to GPU {s.gpu}'s NUMA node"))
        return res

    def write(self, target, key, value, data):
        fs = self.b.sysfs
        if key == "smp_affinity_list":
            set_irq_affinity(fs, data["irq"], value)
        elif key == "banned_irqs":
            text = value if isinstance(value, str) else data["old"]
            if text is None:
                return
            try:
                fs.write(data["file"], text)
            except OSError as e:
                raise ApplyError(f"{data['file']}: {e.strerror}", e.errno) from None
            if data.get("running") and self.b.systemd.available():
                self.b.cmd.run(["systemctl", "try-restart", "irqbalance.service"])
        else:
            raise HkError(f"affinity: cannot write {key}")

    def restore(self, change):
        if change.key == "banned_irqs":
            # the original file text (None: there was none; leave ours, it only bans)
            self.write(change.target, change.key, change.data.get("old"), change.data)
        else:
            super().restore(change)
