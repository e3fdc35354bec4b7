"""CPU frequency governor: scaling_governor of every online CPU under /sys/devices/system/cpu
(`unsupported`, with the reason, where the kernel has no cpufreq: most VMs).

    cpufreq:
      governor: performance    # one of the kernel's governors
      optional: true           # no cpufreq here is ok rather than a failed verify

docs/architecture.md walks through this module as the example of adding a subsystem.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from hkgpu_tune.backends.topology import online_cpus
from hkgpu_tune.core import fields
from hkgpu_tune.core.errors import ApplyError
from hkgpu_tune.core.fields import SettingType
from hkgpu_tune.core.report import DRIFT, OK, UNSUPPORTED
from hkgpu_tune.subsystems.base import Spec, Subsystem

CPU_DIR = "/sys/devices/system/cpu"
GOVERNORS = ("performance", "powersave", "schedutil", "ondemand", "conservative", "userspace")
NO_CPUFREQ = (f"the kernel has no cpufreq ({CPU_DIR}/cpu*/cpufreq is absent: a VM, or no frequency driver "
              "for this CPU)")


@dataclass(frozen=True)
class CpufreqProfile:
    governor: str
    optional: bool = False


def parse_profile(n) -> CpufreqProfile:
    m = n.mapping(("governor", "optional"), required=("governor",))
    return CpufreqProfile(m["governor"].choice(GOVERNORS), m["optional"].boolean() if "optional" in m else False)


def _path(cpu: str, leaf: str = "scaling_governor") -> str:
    return f"{CPU_DIR}/{cpu}/cpufreq/{leaf}"


class Plugin(Subsystem):
    name = "cpufreq"

    def read(self) -> dict:
        """{cpuN: {governor, available}} for each online CPU that has cpufreq."""
        out = {}
        for n in online_cpus(self.b.sysfs):
            gov = self.b.sysfs.read(_path(f"cpu{n}"))
            if gov is not None:
                avail = self.b.sysfs.read(_path(f"cpu{n}", "scaling_available_governors"))
                out[f"cpu{n}"] = {"governor": gov, "available": (avail or "").split()}
        return out

    def compare(self, state: dict) -> list:
        want = self.profile.section("cpufreq")
        kw = {"required": not want.optional}
        if not state:
            return [self.result("cpu", "governor", None, want.governor, UNSUPPORTED, NO_CPUFREQ, **kw)]
        res = []
        for cpu, s in state.items():
            if s["governor"] == want.governor:
                res.append(self.result(cpu, "governor", s["governor"], want.governor, OK, **kw))
            elif s["available"] and want.governor not in s["available"]:
                res.append(self.result(cpu, "governor", s["governor"], want.governor, UNSUPPORTED,
                                       f"this CPU's driver offers {', '.join(s['available'])}", **kw))
            else:
                res.append(self.result(cpu, "governor", s["governor"], want.governor, DRIFT, "differs",
                                       write=want.governor, **kw))
        return res

    def write(self, target, key, value, data) -> None:
        try:
            self.b.sysfs.write(_path(target), value)
        except OSError as e:
            raise ApplyError(f"{_path(target)}: cannot write {value!r}: {e.strerror}", e.errno) from None


# ---------------------------------------------------------------- the setting type (state.json)
def _check_governor(c) -> None:
    if not re.fullmatch(r"cpu[0-9]{1,5}", c.target):
        fields.fail(f"target: {c.target!r} is not cpuN")
    fields.one_of(c.key, "key", ("governor",))
    for k, v in (("original", c.current), ("desired", c.desired)):
        if not (isinstance(v, str) and re.fullmatch(r"[a-z_]{1,32}", v)):
            fields.fail(f"{k}: {v!r} is not a governor name")
    if c.data:
        fields.fail(f"data: unexpected {', '.join(sorted(c.data))}")


SPEC = Spec(name="cpufreq", order=65, section="cpufreq", plugin=Plugin, persist="boot",
            sections={"cpufreq": parse_profile}, types=(SettingType("cpufreq.governor", "cpufreq", _check_governor),))
