"""Kernel settings through /proc/sys."""
from __future__ import annotations

from ..errors import HkError, UnsupportedError
from ..normalize import at_least, same
from ..report import DRIFT, ERROR, OK, UNSUPPORTED
from .base import Subsystem


class Plugin(Subsystem):
    name = "sysctl"

    def read(self) -> dict:
        out = {}
        for s in self.profile.sysctl:
            try:
                v = self.b.sysctl.read(s.key)
                out[s.key] = " ".join(v.split()) if v is not None else None
            except HkError as e:
                out[s.key] = e
        return out

    def compare(self, state):
        res = []
        for s in self.profile.sysctl:
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
