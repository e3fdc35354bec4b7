"""NIC channels (RSS queues), ring sizes and offloads."""
from __future__ import annotations

from hkgpu_tune.core.errors import HkError, UnsupportedError
from hkgpu_tune.core.report import DRIFT, ERROR, OK, UNSUPPORTED
from hkgpu_tune.core.match import could_match, find, identity, matched, resolve
from hkgpu_tune.subsystems.base import Subsystem


def _want(v, maximum):
    return maximum if v == "max" else v


class Plugin(Subsystem):
    name = "ethtool"

    def read(self) -> dict:
        st = {"links": self.b.net.links(could_match(self.profile.network.interfaces)), "dev": {}}
        for ln in matched(self.profile, st["links"], ("channels", "rings", "offloads")):
            d = st["dev"][ln["name"]] = {}
            for part, fn in (("channels", self.b.ethtool.channels), ("rings", self.b.ethtool.rings),
                             ("features", self.b.ethtool.features)):
                try:
                    d[part] = fn(ln["name"])
                except HkError as e:
                    d[part] = e
        return st

    def facts(self) -> dict:
        st = self.read()
        return {n: {k: (str(v) if isinstance(v, Exception) else v) for k, v in d.items()}
                for n, d in st["dev"].items()}

    def compare(self, state):
        res = []
        for attr, fn in (("channels", self._channels), ("rings", self._rings), ("offloads", self._offloads)):
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

    def write(self, target, key, value, data):
        find(self.b.net, data, key)   # the same device, or TargetGone: nothing is touched
        part, field = data["part"], data["field"]
        if part == "channels":
            self.b.ethtool.set_channels(target, {field: value})
            got = self.b.ethtool.channels(target)[f"{field}_count"]
        elif part == "rings":
            self.b.ethtool.set_rings(target, {field: value})
            got = self.b.ethtool.rings(target)[field]
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
