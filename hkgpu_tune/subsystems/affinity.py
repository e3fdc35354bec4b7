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

The readers of /sys and /proc are in backends.topology.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from hkgpu_tune.core.errors import ApplyError, HkError, UnsupportedError
from hkgpu_tune.core.match import matches
from hkgpu_tune.core.profile import IFNAME_RE, MAC_RE, PCI_RE, Match
from hkgpu_tune.core.report import DRIFT, OK, UNSUPPORTED
from hkgpu_tune.core import fields
from hkgpu_tune.core.fields import SettingType
from hkgpu_tune.subsystems.base import Spec, Subsystem
from hkgpu_tune.backends.topology import _node_of, format_cpulist, irq_affinity, irq_names, nics, numa_nodes, online_cpus, parse_cpulist, service_placement, set_irq_affinity, unit_lines

IRQBALANCE_FILES = ("/etc/default/irqbalance", "/etc/sysconfig/irqbalance")


# ------------------------------------------------------------------ CPU lists


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
        default_route=mm["default_route"].boolean() if "default_route" in mm else None)


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


# ------------------------------------------------------------------ GPU placement (for the Triton issue)


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


# ---------------------------------------------------------------- the setting types (state.json)
def _check_irq(c) -> None:
    fields.text(c.target, "target", maxlen=256)
    d = c.data
    if c.key == "smp_affinity_list":
        fields.integer(d.get("irq"), "data.irq", 0, 1 << 20)
        for k, v in (("original", c.current), ("desired", c.desired)):
            if not (isinstance(v, str) and re.fullmatch(r"[0-9,-]{1,8192}", v)):
                fields.fail(f"{k}: {v!r} is not a CPU list")
    elif c.key == "banned_irqs":
        fields.one_of(d.get("file"), "data.file", IRQBALANCE_FILES)
        fields.text(d.get("old"), "data.old", lines=True, maxlen=1 << 20, none=True)
        fields.boolean(d.get("running"), "data.running", none=True)
        if not isinstance(c.current, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                      for i in c.current):
            fields.fail("original: expected a list of interrupt numbers")
        fields.text(c.desired, "desired", lines=True, maxlen=1 << 20, none=True)
    else:
        fields.fail(f"key: {c.key!r} is not an affinity setting")


SPEC = Spec(name="affinity", order=100, section="affinity", plugin=Plugin, persist="boot",
            sections={"affinity": parse_profile}, types=(SettingType("affinity.irq", "affinity", _check_irq),))
