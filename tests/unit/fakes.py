"""Swapped backends for unit tests: the same interfaces as hkgpu_tune.backends, in memory."""
from __future__ import annotations

import copy

from hkgpu_tune.backends import Backends
from hkgpu_tune.core.errors import ApplyError, UnsupportedError


class FakeSysctl:
    def __init__(self, values: dict, readonly=()):
        self.values = dict(values)
        self.readonly = set(readonly)
        self.writes = []

    def read(self, key):
        return self.values.get(key)

    def write(self, key, value):
        if key not in self.values:
            raise UnsupportedError(f"sysctl {key}: not in this kernel or namespace")
        if key in self.readonly:
            raise ApplyError(f"sysctl {key}={value}: Invalid argument")
        self.writes.append((key, value))
        self.values[key] = " ".join(str(value).split())


def link(name, index, **kw):
    d = {"name": name, "index": index, "mac": f"02:00:00:00:00:{index:02x}", "perm_mac": f"0c:42:a1:00:00:{index:02x}",
         "mtu": 1500, "driver": "mlx5_core", "kind": None, "pci": f"0000:{index:02x}:00.0", "state": "UP", "up": True,
         "tx_queues": 1, "default_route": False}
    d.update(kw)
    return d


class FakeNet:
    def __init__(self, links, gateways=None, routes=None, oif=None):
        self._links = links
        self.gw = gateways or {}
        self.routes = routes or {}
        self.oif = oif or {}

    _cache = None

    def links(self, could_match=None):   # cached like the real one, until a link change
        if self._cache is None:
            self._cache = copy.deepcopy(self._links)
        return copy.deepcopy(self._cache)

    def tx_queues(self, link):   # read now, like the real one (not from the cached list)
        return self._by(link["index"])["tx_queues"]

    def _by(self, index):
        return next(ln for ln in self._links if ln["index"] == index)

    def set_mtu(self, index, mtu, name=""):
        self._cache = None
        self._by(index)["mtu"] = int(mtu)

    def link(self, name):   # read now, by name (identity checks)
        found = [ln for ln in self._links if ln["name"] == name]
        return copy.deepcopy(found[0]) if found else None

    def gateways(self, index):
        return self.gw.get(index, [])

    def route_get(self, dst):
        """RTM_GETROUTE: from `oif`, else the link that has dst as a gateway."""
        oif = self.oif.get(dst) or next((i for i, gws in self.gw.items() if dst in gws), None)
        return {"oif": oif, "gateway": None} if oif else None

    # routes: `routes` maps prefix -> MTU metric; `route_info` holds the rest of each route
    route_info: dict = {}

    def route(self, prefix, table=254):
        if prefix not in self.routes:
            return None
        r = {"dst": prefix, "family": 6 if ":" in prefix else 4, "table": 254, "gateway": None, "oif": None,
             "dev": None, "priority": 0, "proto": 4, "scope": 0, "type": 1, "multipath": False}
        r.update(self.route_info.get(prefix, {}))
        r["dev"] = next((ln["name"] for ln in self._links if ln["index"] == r["oif"]), None)
        r["mtu"] = self.routes[prefix]
        return r

    def set_route(self, r, delete=False):
        self.route_info = dict(self.route_info)
        if delete:
            self.routes.pop(r["dst"], None)
            self.route_info.pop(r["dst"], None)
            return
        self.routes[r["dst"]] = r.get("mtu")
        self.route_info[r["dst"]] = {k: v for k, v in r.items() if v is not None and k not in ("mtu", "dev")}


class FakeEthtool:
    def __init__(self, devs):
        self.devs = devs  # name -> {"channels": {...} | Exception, "rings": ..., "features": ...}

    def _get(self, name, part):
        v = self.devs[name][part]
        if isinstance(v, Exception):
            raise v
        return copy.deepcopy(v)

    def channels(self, name):
        return self._get(name, "channels")

    def rings(self, name):
        return self._get(name, "rings")

    def features(self, name):
        """As the real one: `each` holds every changeable kernel feature behind an offload."""
        out = self._get(name, "features")
        for f in out.values():
            f.setdefault("each", {} if f["fixed"] else {n: f["on"] for n in f["names"]})
        return out

    def set_channels(self, name, values):
        for k, v in values.items():
            self.devs[name]["channels"][f"{k}_count"] = v

    def set_rings(self, name, values):
        self.devs[name]["rings"].update(values)

    def set_feature(self, name, short, on):
        f = self.devs[name]["features"][short]
        if isinstance(on, dict):   # each feature to its own value
            f["each"] = {**f.get("each", {n: f["on"] for n in f["names"]}), **on}
            f["on"] = all(f["each"].values())
        else:
            f["on"] = on
            if "each" in f:
                f["each"] = {n: on for n in f["each"]}


def nic(combined=(8, 63), rings=(1024, 8192), gro=False):
    return {
        "channels": {"max_rx": 0, "max_tx": 0, "max_other": 1, "max_combined": combined[1], "rx_count": 0,
                     "tx_count": 0, "other_count": 1, "combined_count": combined[0]},
        "rings": {"rx": rings[0], "tx": rings[0], "rx_max": rings[1], "tx_max": rings[1]},
        "features": {"gro": {"on": gro, "fixed": False, "names": ["rx-gro"]},
                     "gso": {"on": True, "fixed": False, "names": []},
                     "tso": {"on": True, "fixed": False, "names": ["tx-tcp-segmentation", "tx-tcp6-segmentation"]},
                     "lro": {"on": False, "fixed": True, "names": []}},
    }


class FakeTc:
    def __init__(self, qdiscs, supported=("fq_codel", "pfifo_fast", "mq")):
        self.q = qdiscs  # index -> {"root":..., "root_handle":..., "children": {...}}
        self.sup = set(supported)
        self.nq: dict = {}   # index -> transmit queues a new mq gets (the device's allocated queues)

    def qdiscs(self, index):
        return copy.deepcopy(self.q.get(index, {"root": "noqueue", "root_handle": None, "children": {}}))

    def supported(self, kind):
        return (True, "") if kind in self.sup else (False, f"qdisc {kind} is unsupported by this kernel")

    def replace_root(self, index, kind, name=""):
        if kind not in self.sup:
            raise UnsupportedError(f"{name}: qdisc {kind}: not supported")
        self.q[index] = {"root": kind, "root_handle": "1:0" if kind == "mq" else "8001:0",
                         "children": {f"1:{i}": self.default() for i in range(1, self.nq.get(index, 1) + 1)}
                         if kind == "mq" else {}}

    def replace_child(self, index, parent, kind, name=""):
        if parent.startswith("0:"):   # as the kernel: a parent of handle 0: cannot be found
            raise UnsupportedError(f"{name}: qdisc {kind} on queue {parent}: not supported by this kernel or "
                                   "driver (No such file or directory)")
        self.q[index]["children"][parent] = kind

    default = staticmethod(lambda: "pfifo_fast")   # the kernel's default_qdisc at that moment

    def delete_root(self, index, name=""):
        # as the kernel: a multi-queue device gets its own mq (handle 0:) back, each queue holding
        # the default qdisc
        n = self.nq.get(index, 1)
        if n > 1:
            self.q[index] = {"root": "mq", "root_handle": "0:0",
                             "children": {f"0:{i}": self.default() for i in range(1, n + 1)}}
        else:
            self.q.pop(index, None)


class FakeCmd:
    def __init__(self, answers=None):
        self.answers = answers or {}
        self.calls = []

    def run(self, argv, timeout=30, env=None):
        from hkgpu_tune.backends.command import Completed
        self.calls.append(argv)
        rc = self.answers.get(argv[-1], 0) if argv[0] == "ping" else 0
        return Completed(rc, "", "")


def backends(**kw):
    return Backends(**kw)
