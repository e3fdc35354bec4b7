"""Kernel settings through /proc/sys, and TCP buffer maxima derived from the path (tcp_buffers)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from hkgpu_tune.core.errors import HkError, ProfileError, UnsupportedError
from hkgpu_tune.core.profile import parse_sysctl, valid_sysctl_key
from hkgpu_tune.core.sysctl_names import forbidden
from hkgpu_tune.core.normalize import at_least, same
from hkgpu_tune.core.report import DRIFT, ERROR, OK, UNSUPPORTED
from hkgpu_tune.core import fields
from hkgpu_tune.core.fields import SettingType
from hkgpu_tune.subsystems.base import Spec, Subsystem

# ---------------------------------------------------------------- tcp_buffers: sizes from the path
SEED_FLOOR = 268435456      # the seed's rmem_max/wmem_max and tcp_rmem/tcp_wmem maximum
INT_MAX = 2147483647        # the kernel keeps these as int
MIB = 1 << 20
BUFFER_KEYS = {"net.core.rmem_max": None, "net.core.wmem_max": None,
               "net.ipv4.tcp_rmem": "4096 87380", "net.ipv4.tcp_wmem": "4096 65536"}


@dataclass(frozen=True)
class PathGroup:
    name: str
    bandwidth_gbit: float
    rtt_ms: float | None      # None: the largest wan_peers[].rtt_ms
    line: int = 0


@dataclass(frozen=True)
class TcpBuffers:
    """tcp_buffers: {GROUP: {bandwidth_gbit, rtt_ms}, ..., min_bytes, headroom}."""
    groups: tuple
    min_bytes: int = SEED_FLOOR
    headroom: float = 2.0
    file: str = ""


def _num(n, lo, hi, what):
    v = n.value()
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo < v <= hi):
        raise n.error(f"expected {what} (more than {lo:g}, at most {hi:g}), got {n._desc()}")
    return float(v)


def parse_tcp_buffers(n) -> TcpBuffers:
    """
    tcp_buffers:
      fabric: {bandwidth_gbit: 200, rtt_ms: 0.1}
      wan:    {bandwidth_gbit: 10}        # rtt_ms: the largest wan_peers[].rtt_ms
      min_bytes: 268435456                # the floor (the seed's value); lower only when set lower
      headroom: 2                         # buffer = BDP x headroom (the kernel counts overhead too)
    """
    groups, kw = [], {}
    for key, v in n.mapping().items():
        if key == "min_bytes":
            kw["min_bytes"] = v.integer(4096, INT_MAX)
        elif key == "headroom":
            kw["headroom"] = _num(v, 0, 16, "a multiplier")
        else:
            if not v.kind() == "mapping":
                raise v.error("expected a peer group {bandwidth_gbit: N, rtt_ms: M} (or min_bytes, headroom)")
            g = v.mapping(("bandwidth_gbit", "rtt_ms"), required=("bandwidth_gbit",))
            groups.append(PathGroup(key, _num(g["bandwidth_gbit"], 0, 3200, "Gbit/s"),
                                    _num(g["rtt_ms"], 0, 5000, "milliseconds") if "rtt_ms" in g else None, v.line))
    if not groups:
        raise n.error("expected at least one peer group, e.g. wan: {bandwidth_gbit: 10, rtt_ms: 60}")
    return TcpBuffers(tuple(groups), file=n.file, **kw)


def derive_buffer(profile) -> tuple[int, str] | None:
    """(bytes, the arithmetic in words) for the profile's tcp_buffers, or None without one.
    bytes = max over groups of ceil(Gbit/s x 1e9 / 8 x RTT s x headroom, to a MiB), never below
    min_bytes, at most INT_MAX."""
    tb = profile.section("tcp_buffers")
    if tb is None:
        return None
    wan_rtts = [p.rtt_ms for p in profile.network.wan_peers if p.rtt_ms is not None]
    parts, best = [], 0
    for g in tb.groups:
        rtt = g.rtt_ms
        src = ""
        if rtt is None:
            if not wan_rtts:
                raise ProfileError(f"{tb.file}:{g.line}: tcp_buffers.{g.name}.rtt_ms: missing, and no "
                                   "network.wan_peers[].rtt_ms to take it from")
            rtt, src = max(wan_rtts), " (largest wan_peers rtt_ms)"
        bdp = g.bandwidth_gbit * 1e9 / 8 * rtt / 1000
        need = math.ceil(bdp * tb.headroom / MIB) * MIB
        parts.append(f"{g.name}: {g.bandwidth_gbit:g} Gbit/s x {rtt:g} ms{src} = {bdp:,.0f} B BDP"
                     f" x {tb.headroom:g} = {need:,} B ({need // MIB} MiB)")
        best = max(best, need)
    value = max(best, tb.min_bytes)
    floor = f"floor {tb.min_bytes:,}" + (" (the seed's)" if tb.min_bytes == SEED_FLOOR else " (min_bytes)")
    capped = ""
    if value > INT_MAX:
        value, capped = INT_MAX, f", capped at the kernel's {INT_MAX:,}"
    return value, f"tcp_buffers: {'; '.join(parts)}; {floor} -> {value:,}{capped}"


def buffer_settings(profile):
    """The profile's sysctl settings with the four buffer keys set from tcp_buffers (which decides
    them: a value in the sysctl section is replaced, its min/default fields kept); and
    {key: the arithmetic} for the reasons."""
    from hkgpu_tune.core.profile import SysctlSetting
    settings = list(profile.sysctl)
    got = derive_buffer(profile)
    if got is None:
        return settings, {}
    value, why = got
    have = {s.key: i for i, s in enumerate(settings)}
    for key, head in BUFFER_KEYS.items():
        old = settings[have[key]] if key in have else None
        if head is not None:
            fields = old.value.split() if old is not None else []
            head = " ".join(fields[:2]) if len(fields) == 3 else head
            val = f"{head} {value}"
        else:
            val = str(value)
        new = SysctlSetting(key, val, "at_least", old.optional if old else False, old.line if old else 0)
        if old is not None:
            settings[have[key]] = new
        else:
            settings.append(new)
    return settings, {k: why for k in BUFFER_KEYS}


class Plugin(Subsystem):
    name = "sysctl"

    def settings(self):
        if not hasattr(self, "_settings"):
            self._settings, self._why = buffer_settings(self.profile)
        return self._settings

    def read(self) -> dict:
        out = {}
        for s in self.settings():
            try:
                v = self.b.sysctl.read(s.key)
                out[s.key] = " ".join(v.split()) if v is not None else None
            except HkError as e:
                out[s.key] = e
        return out

    def compare(self, state):
        res = []
        for s in self.settings():
            cur = state.get(s.key)
            kw = {"required": not s.optional}
            if isinstance(cur, Exception):
                res.append(self.result("host", s.key, None, s.value, ERROR, str(cur), **kw))
            elif cur is None:
                res.append(self.result("host", s.key, None, s.value, UNSUPPORTED,
                                       "no such sysctl in this kernel or network namespace", **kw))
            elif same(cur, s.value):
                res.append(self.result("host", s.key, cur, s.value, OK, **kw))
            elif s.compare == "at_least" and at_least(cur, s.value):
                res.append(self.result("host", s.key, cur, s.value, OK, "at least the desired value", **kw))
            elif why := self._unsupported_value(s):
                res.append(self.result("host", s.key, cur, s.value, UNSUPPORTED, why, **kw))
            else:
                want = s.value
                if s.compare == "at_least" and len(cur.split()) == len(s.value.split()):
                    # raise only the fields that are short
                    want = " ".join(str(max(int(c), int(d))) for c, d in zip(cur.split(), s.value.split()))
                res.append(self.result("host", s.key, cur, s.value, DRIFT,
                                       "below the desired value" if s.compare == "at_least" else "differs",
                                       write=want, **kw))
        for r in res:   # the plan shows how a derived buffer size was reached
            if r.key in self._why:
                r.reason = f"{r.reason}; {self._why[r.key]}" if r.reason else self._why[r.key]
        return res

    def _unsupported_value(self, s) -> str:
        """Why a differing value cannot be written here ('' when it can)."""
        ro = getattr(self.b.sysctl, "read_only", None)
        if ro and ro(s.key):
            return "read-only here: a global setting owned by the initial network namespace"
        # a qdisc name the kernel lacks cannot be the default qdisc
        if s.key == "net.core.default_qdisc":
            ok, why = self.b.tc.supported(s.value)
            if not ok:
                return why
        return ""

    def write(self, target, key, value, data):
        self.b.sysctl.write(key, value)
        got = self.b.sysctl.read(key)
        if got is None or not same(got, value):
            raise UnsupportedError(f"sysctl {key}: wrote {value!r}, the kernel shows {got!r}")


# ---------------------------------------------------------------- the setting types (state.json)
def _check_key(c) -> None:
    if c.target != "host":
        fields.fail(f"target: {c.target!r}, expected 'host'")
    fields.text(c.key, "key", maxlen=255)
    if not valid_sysctl_key(c.key):
        fields.fail(f"key: {c.key!r} is not a sysctl under /proc/sys")
    why = forbidden(c.key)   # the profile's own rule: a state file names no key a profile could not
    if why:
        fields.fail(f"key: {why}")
    fields.text(c.current, "original", maxlen=1024)
    fields.text(c.desired, "desired", maxlen=1024, none=True)
    if set(c.data) - {"identity"}:
        fields.fail(f"data: unexpected {', '.join(sorted(set(c.data) - {'identity'}))}")


SPEC = Spec(name="sysctl", order=10, section="sysctl", plugin=Plugin, persist="sysctl.d",
            netns=lambda key: key.startswith("net."),   # the net.* keys belong to one namespace
            sections={"sysctl": parse_sysctl, "tcp_buffers": parse_tcp_buffers}, also=("tcp_buffers",),
            types=(SettingType("sysctl.key", "sysctl", _check_key),))
