"""NIC channels (RSS queues), ring sizes, offloads, interrupt coalescing and pause frames; the
link's speed against the speed the profile expects.

    network:
      interfaces:
        - match: {driver: mlx5_core}
          coalesce: {rx_usecs: 8, tx_usecs: 16, adaptive_rx: true}   # ethtool -C
          pause: {rx: true, tx: true, autoneg: false}                 # ethtool -A
          speed_mbit: 100000    # a link that trained slower is drift (a cable, optic or switch port)
"""
from __future__ import annotations

import re

from hkgpu_tune.core.errors import HkError, UnsupportedError
from hkgpu_tune.core.report import DRIFT, ERROR, OK, UNSUPPORTED
from hkgpu_tune.core.profile import COALESCE, PAUSE
from hkgpu_tune.core.match import could_match, find, identity, matched, resolve
from hkgpu_tune.core import fields
from hkgpu_tune.core.fields import SettingType
from hkgpu_tune.subsystems.base import Spec, Subsystem


# what each profile attribute needs read, by backend call
PARTS = {"channels": "channels", "rings": "rings", "offloads": "features", "coalesce": "coalesce",
         "pause": "pause", "speed_mbit": "link_info"}


def _want(v, maximum):
    return maximum if v == "max" else v


class Plugin(Subsystem):
    name = "ethtool"

    def read(self, every: bool = False) -> dict:
        ifaces = self.profile.network.interfaces
        st = {"links": self.b.net.links(None if every else could_match(ifaces)), "dev": {}}
        used = [a for a in PARTS if any(getattr(r, a) not in (None, {}) for r in ifaces)]
        links = st["links"] if every else matched(self.profile, st["links"], used)
        for ln in links:
            d = st["dev"][ln["name"]] = {}
            for part in dict.fromkeys(PARTS[a] for a in (PARTS if every else used)):
                try:
                    d[part] = getattr(self.b.ethtool, part)(ln["name"])
                except HkError as e:
                    d[part] = e
        return st

    def facts(self) -> dict:
        st = self.read(every=True)
        return {n: {k: (str(v) if isinstance(v, Exception) else v) for k, v in d.items()}
                for n, d in st["dev"].items()}

    def compare(self, state):
        res = []
        for attr, fn in (("channels", self._channels), ("rings", self._rings), ("offloads", self._offloads),
                         ("coalesce", self._coalesce), ("pause", self._pause), ("speed_mbit", self._speed)):
            pairs, missing = resolve(self, state["links"], attr)
            res += missing
            for rule, ln in pairs:
                for r in fn(rule, ln["name"], state["dev"].get(ln["name"], {})):
                    if r.write is not None:
                        r.data["identity"] = identity(ln)
                    res.append(r)
        return res

    def _err(self, name, key, desired, e):
        status = UNSUPPORTED if isinstance(e, UnsupportedError) else ERROR
        return self.result(name, key, None, desired, status, str(e))

    def _channels(self, rule, name, dev):
        c = dev.get("channels")
        want = {k: v for k, v in vars(rule.channels).items() if v is not None}
        if isinstance(c, Exception):
            return [self._err(name, f"channels {k}", v, c) for k, v in want.items()]
        res = []
        if "combined" in want and c["max_combined"] == 0:
            # driver has separate rx/tx queues only (veth, some older NICs): fall back
            if c["max_rx"] and c["max_tx"]:
                v = want.pop("combined")
                want.setdefault("rx", v)
                want.setdefault("tx", v)
                note = "no combined channels on this driver; using rx/tx"
            else:
                return [self.result(name, "channels combined", None, want["combined"], UNSUPPORTED,
                                    "the driver has no combined channels")]
        else:
            note = ""
        for k, v in want.items():
            mx = c[f"max_{k}"]
            cur = c[f"{k}_count"]
            desired = _want(v, mx)
            key = f"channels {k}"
            if mx == 0:
                res.append(self.result(name, key, cur, v, UNSUPPORTED, f"the driver has no {k} channels"))
            elif desired > mx:
                res.append(self.result(name, key, cur, desired, UNSUPPORTED, f"above the driver's maximum {mx}"))
            elif cur == desired:
                res.append(self.result(name, key, cur, desired, OK, note))
            else:
                res.append(self.result(name, key, cur, desired, DRIFT, note or "differs", write=desired,
                                       data={"part": "channels", "field": k}))
        return res

    def _rings(self, rule, name, dev):
        r = dev.get("rings")
        want = {k: v for k, v in vars(rule.rings).items() if v is not None}
        if isinstance(r, Exception):
            return [self._err(name, f"rings {k}", v, r) for k, v in want.items()]
        res = []
        for k, v in want.items():
            mx, cur = r[f"{k}_max"], r[k]
            desired = _want(v, mx)
            key = f"rings {k}"
            if not mx:
                res.append(self.result(name, key, cur, v, UNSUPPORTED, f"the driver reports no {k} ring maximum"))
            elif desired > mx:
                res.append(self.result(name, key, cur, desired, UNSUPPORTED, f"above the driver's maximum {mx}"))
            elif cur == desired:
                res.append(self.result(name, key, cur, desired, OK))
            else:
                res.append(self.result(name, key, cur, desired, DRIFT, "differs", write=desired,
                                       data={"part": "rings", "field": k}))
        return res

    def _offloads(self, rule, name, dev):
        f = dev.get("features")
        if isinstance(f, Exception):
            return [self._err(name, k, v, f) for k, v in rule.offloads.items()]
        res = []
        for k, v in rule.offloads.items():
            have = f.get(k)
            if have is None:
                res.append(self.result(name, k, None, v, UNSUPPORTED, "the driver has no such feature"))
                continue
            # every kernel feature behind the offload (tso: tx-tcp-segmentation, tx-tcp6-segmentation, ...)
            each = have.get("each") or ({n: have["on"] for n in have["names"]} if not have["fixed"] else {})
            off = sorted(n for n, on in each.items() if on != v)
            cur = have["on"] if not each or len(set(each.values())) == 1 else {n: each[n] for n in sorted(each)}
            if (each and not off) or (not each and have["on"] == v):
                res.append(self.result(name, k, v, v, OK))
            elif have["fixed"]:
                res.append(self.result(name, k, have["on"], v, UNSUPPORTED, "fixed by the driver"))
            elif v and k in ("gso", "tso") and f.get("sg", {}).get("fixed") and not f["sg"]["on"]:
                # the kernel keeps segmentation off without scatter-gather ("[requested on]")
                res.append(self.result(name, k, cur, v, UNSUPPORTED,
                                       "needs scatter-gather (sg), which the driver keeps off"))
            else:
                why = "differs" if len(off) == len(each) else f"differs: {', '.join(off)}"
                # the original of each feature is saved, and put back one by one
                res.append(self.result(name, k, cur, v, DRIFT, why, write=v,
                                       data={"part": "offloads", "field": k, "orig": dict(each)}))
        return res

    def _simple(self, part, rule, name, dev):
        """coalesce and pause: each key read, compared and written on its own."""
        have = dev.get(part)
        want = getattr(rule, part)
        if isinstance(have, Exception):
            return [self._err(name, f"{part} {k}", v, have) for k, v in want.items()]
        res = []
        for k, v in want.items():
            key = f"{part} {k}"
            if have.get(k) is None:
                res.append(self.result(name, key, None, v, UNSUPPORTED, f"the driver reports no {k}"))
            elif have[k] == v:
                res.append(self.result(name, key, have[k], v, OK))
            else:
                res.append(self.result(name, key, have[k], v, DRIFT, "differs", write=v,
                                       data={"part": part, "field": k}))
        return res

    def _coalesce(self, rule, name, dev):
        return self._simple("coalesce", rule, name, dev)

    def _pause(self, rule, name, dev):
        return self._simple("pause", rule, name, dev)

    def _speed(self, rule, name, dev):
        info = dev.get("link_info")
        want = rule.speed_mbit
        if isinstance(info, Exception):
            return [self._err(name, "speed_mbit", want, info)]
        cur = info.get("speed_mbit")
        if cur is None:
            return [self.result(name, "speed_mbit", None, want, DRIFT,
                                "no link speed: the link is down or the driver reports none")]
        if cur < want:
            return [self.result(name, "speed_mbit", cur, want, DRIFT,
                                f"link at {cur} Mb/s, below the expected {want}: check the cable or optic, the "
                                "switch port and autonegotiation (not fixable by this tool)")]
        return [self.result(name, "speed_mbit", cur, want, OK, f"{info.get('duplex') or ''} duplex".strip())]

    def write(self, target, key, value, data):
        find(self.b.net, data, key)   # the same device, or TargetGone: nothing is touched
        part, field = data["part"], data["field"]
        if part == "channels":
            self.b.ethtool.set_channels(target, {field: value})
            got = self.b.ethtool.channels(target)[f"{field}_count"]
        elif part == "rings":
            self.b.ethtool.set_rings(target, {field: value})
            got = self.b.ethtool.rings(target)[field]
        elif part in ("coalesce", "pause"):
            getattr(self.b.ethtool, f"set_{part}")(target, {field: value})
            got = getattr(self.b.ethtool, part)(target).get(field)
        else:
            return self._set_offload(target, key, field, value)
        if got != value:
            raise UnsupportedError(f"{target}: {key}: wrote {value}, the driver shows {got}")

    def _set_offload(self, target, key, field, value):
        """value: a bool for every feature behind the offload, or {feature: bool} (an original)."""
        shown = value if not isinstance(value, dict) else ", ".join(f"{n} {'on' if on else 'off'}"
                                                                      for n, on in sorted(value.items()))
        try:
            self.b.ethtool.set_feature(target, field, value)
        except HkError as e:
            raise UnsupportedError(f"{target}: the driver refused {key} {shown} ({e})") from None
        have = self.b.ethtool.features(target)[field]
        each = have.get("each") or {n: have["on"] for n in have["names"]}
        want = value if isinstance(value, dict) else {n: value for n in each} or {field: value}
        got = {n: each.get(n, have["on"]) for n in want}
        bad = sorted(n for n in want if got[n] != want[n])
        if bad:
            raise UnsupportedError(f"{target}: {key}: wrote {shown}, the driver shows "
                                   + ", ".join(f"{n} {'on' if got[n] else 'off'}" for n in bad))

    def restore(self, change):
        orig = change.data.get("orig")
        value = orig if change.data.get("part") == "offloads" and orig else change.current
        self.write(change.target, change.key, value, change.data)


# ---------------------------------------------------------------- the setting types (state.json)
_CHANNELS = ("rx", "tx", "other", "combined")


def _check_part(part: str):
    def check(c) -> None:
        fields.identity(c.data)
        fields.ifname(c.target)
        fields.one_of(c.data.get("part"), "data.part", (part,))
        field = c.data.get("field")
        if part == "channels":
            fields.one_of(field, "data.field", _CHANNELS)
        elif part in ("coalesce", "pause"):
            fields.one_of(field, "data.field", tuple(COALESCE if part == "coalesce" else PAUSE))
            for k, v in (("original", c.current), ("desired", c.desired)):
                if field.startswith("adaptive") or part == "pause":
                    fields.boolean(v, k)
                else:
                    fields.integer(v, k, 0, 1 << 20)
            return
        else:
            fields.text(field, "data.field", maxlen=64)
            if not re.fullmatch(r"[a-z0-9_-]{1,64}", field):
                fields.fail(f"data.field: {field!r} is not an ethtool name")
        if part == "offloads":
            for k, v in (("original", c.current), ("desired", c.desired)):
                if isinstance(v, dict):   # several kernel features behind one offload
                    for f, on in v.items():
                        if not re.fullmatch(r"[a-z0-9_-]{1,64}", f):
                            fields.fail(f"{k}: {f!r} is not a kernel feature name")
                        fields.boolean(on, f"{k}.{f}", none=True)
                else:
                    fields.boolean(v, k)
        else:
            fields.integer(c.current, "original", 0, 1 << 24)
            fields.integer(c.desired, "desired", 0, 1 << 24)
    return check


_TYPES = {"channels": "ethtool.channels", "rings": "ethtool.rings", "offloads": "ethtool.offload",
          "coalesce": "ethtool.coalesce", "pause": "ethtool.pause"}


def _kind(c) -> str:
    part = c.data.get("part") if isinstance(c.data, dict) else None
    if part not in _TYPES:
        fields.fail(f"data.part: {part!r} is not channels, rings, offloads, coalesce or pause")
    return _TYPES[part]


SPEC = Spec(name="ethtool", order=30, section="network", plugin=Plugin, persist="boot", netns=True, kind_of=_kind,
            types=tuple(SettingType(t, "ethtool", _check_part(part)) for part, t in _TYPES.items()))
