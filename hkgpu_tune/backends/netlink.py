"""Netlink through pyroute2: links, routes, qdiscs, ethtool."""
from __future__ import annotations

import ctypes
import errno
import os
import re
import socket
import time

from ..errors import ApplyError, HkError, UnsupportedError

TC_H_ROOT = 0xFFFFFFFF
CLONE_NEWNET = 0x40000000
PCI_ADDR = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _nl_errno(e) -> int | None:
    return getattr(e, "code", None) or getattr(e, "errno", None)


def _wrap(e, what: str):
    code = _nl_errno(e)
    if code in (errno.EPERM, errno.EACCES):
        return HkError(f"{what}: permission denied (run as root)", code)
    if code in (errno.EOPNOTSUPP, errno.ENOENT, errno.ENOTSUP):
        return UnsupportedError(f"{what}: not supported by this kernel or driver ({os.strerror(code)})", code)
    return ApplyError(f"{what}: {e}", code)


_shared = {"ip": None, "users": 0}


def _light_pyroute2() -> None:
    """Import pyroute2's IPRoute and ethtool without the package __init__, which also loads
    NDB, IPDB and conntrack (two thirds of the import time, none of it used here)."""
    import importlib.util
    import sys
    import types
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or not spec.submodule_search_locations:
        return
    stub = types.ModuleType("pyroute2")
    stub.__path__ = list(spec.submodule_search_locations)
    stub.__spec__ = spec
    sys.modules["pyroute2"] = stub
    try:
        from pyroute2.iproute.linux import IPRoute  # noqa: F401
        from pyroute2.netlink.exceptions import NetlinkError  # noqa: F401
        stub.IPRoute = IPRoute
    except Exception:  # noqa: BLE001 - fall back to the normal import
        for name in [m for m in sys.modules if m == "pyroute2" or m.startswith("pyroute2.")]:
            del sys.modules[name]


def _iproute():
    """One netlink socket per process, shared by Net and Tc."""
    if _shared["ip"] is None:
        _light_pyroute2()
        from pyroute2.iproute.linux import IPRoute
        _shared["ip"] = IPRoute()
    _shared["users"] += 1
    return _shared["ip"]


def _release():
    _shared["users"] -= 1
    if _shared["users"] <= 0 and _shared["ip"] is not None:
        _shared["ip"].close()
        _shared["ip"] = None


class Net:
    """Links and routes."""

    def __init__(self):
        self.ip = _iproute()
        self._links = None

    def close(self):
        _release()

    def links(self) -> list[dict]:
        """Cached until this process changes a link (three subsystems read the same list)."""
        if self._links is None:
            self._links = self._read_links()
        return [dict(x) for x in self._links]

    def _read_links(self) -> list[dict]:
        out = []
        default = self.default_oif()
        for msg in self.ip.get_links():
            name = msg.get_attr("IFLA_IFNAME")
            if name == "lo":
                continue
            info = msg.get_attr("IFLA_LINKINFO")
            kind = info.get_attr("IFLA_INFO_KIND") if info else None
            dev = f"/sys/class/net/{name}/device"
            driver = pci = None
            if os.path.exists(dev):
                drv = os.path.realpath(dev + "/driver")
                driver = os.path.basename(drv) if os.path.exists(drv) else None
                base = os.path.basename(os.path.realpath(dev))
                pci = base if PCI_ADDR.match(base) else None
            out.append({
                "name": name, "index": msg["index"], "mac": (msg.get_attr("IFLA_ADDRESS") or "").lower(),
                "mtu": msg.get_attr("IFLA_MTU"), "driver": driver or kind, "kind": kind, "pci": pci,
                "state": msg.get_attr("IFLA_OPERSTATE"), "tx_queues": msg.get_attr("IFLA_NUM_TX_QUEUES") or 1,
                "default_route": msg["index"] == default,
            })
        return out

    @staticmethod
    def tx_queues(link: dict) -> int:
        """Transmit queues in use, read now: ethtool -L changes them, and only those carry a qdisc
        (IFLA_NUM_TX_QUEUES counts those allocated, the fallback where /sys shows another
        namespace's device)."""
        base = f"/sys/class/net/{link['name']}"
        try:
            with open(f"{base}/ifindex") as f:
                if int(f.read()) == link["index"]:
                    return sum(1 for q in os.listdir(f"{base}/queues") if q.startswith("tx-")) or 1
        except (OSError, ValueError):
            pass
        return link["tx_queues"]

    def default_oif(self) -> int | None:
        for r in self.ip.get_default_routes(family=socket.AF_INET):
            oif = r.get_attr("RTA_OIF")
            if oif:
                return oif
            mp = r.get_attr("RTA_MULTIPATH")
            if mp:
                return mp[0]["oif"]
        return None

    def gateways(self, index: int) -> list[str]:
        gws = []
        for r in self.ip.get_routes(family=socket.AF_INET, oif=index):
            gw = r.get_attr("RTA_GATEWAY")
            if gw and gw not in gws:
                gws.append(gw)
        return gws

    def route_oif(self, dst: str) -> int | None:
        try:
            r = self.ip.route("get", dst=dst)
        except Exception:  # noqa: BLE001 - no route is an answer
            return None
        return r[0].get_attr("RTA_OIF") if r else None

    def mtu(self, index: int) -> int:
        return self.ip.get_links(index)[0].get_attr("IFLA_MTU")

    def set_mtu(self, index: int, mtu: int, name: str = "") -> None:
        self._links = None
        try:
            self.ip.link("set", index=index, mtu=int(mtu))
        except Exception as e:  # noqa: BLE001 - NetlinkError carries errno
            raise _wrap(e, f"{name}: set mtu {mtu}") from None
        self._poll(lambda: self.mtu(index) == int(mtu), f"{name}: mtu {mtu}")

    def route_mtu(self, prefix: str) -> tuple[bool, int | None]:
        """(route exists, its mtu metric or None)."""
        dst, plen = prefix.split("/")
        for r in self.ip.get_routes(family=socket.AF_INET, table=254):  # a dump, not a lookup
            if r["dst_len"] != int(plen) or r.get_attr("RTA_DST") != dst:
                continue
            m = r.get_attr("RTA_METRICS")
            if isinstance(m, dict):
                return True, dict(m.get("attrs", [])).get("RTAX_MTU")
            return True, (m.get_attr("RTAX_MTU") if m else None)
        return False, None

    def set_route_mtu(self, prefix: str, mtu: int | None, via: str | None, oif: int | None, delete=False) -> None:
        dst, plen = prefix.split("/")
        args = {"dst": dst, "dst_len": int(plen)}
        if via:
            args["gateway"] = via
        if oif:
            args["oif"] = oif
        try:
            if delete:
                self.ip.route("del", **args)
            elif mtu is None:
                self.ip.route("replace", **args)
            else:
                self.ip.route("replace", metrics={"mtu": int(mtu)}, **args)
        except Exception as e:  # noqa: BLE001
            raise _wrap(e, f"route {prefix} mtu {mtu}") from None

    @staticmethod
    def _poll(cond, what, timeout=2.0):
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise ApplyError(f"{what}: the kernel did not show the change within {timeout} s")
            time.sleep(0.01)


# ethtool's short offload names -> kernel feature names (ethtool -k shows these)
FEATURES = {
    "gro": ["rx-gro"],
    "gso": ["tx-generic-segmentation"],
    "tso": ["tx-tcp-segmentation", "tx-tcp-ecn-segmentation", "tx-tcp-accecn-segmentation",
            "tx-tcp-mangleid-segmentation", "tx-tcp6-segmentation"],
    "lro": ["rx-lro"],
    "rx_checksum": ["rx-checksum"],
    "tx_checksum": ["tx-checksum-ip-generic", "tx-checksum-ipv4", "tx-checksum-ipv6"],
    "sg": ["tx-scatter-gather"],
    "rxhash": ["rx-hashing"],
}


class Ethtool:
    """Channels, rings and features (pyroute2.ethtool: netlink, ioctl where needed)."""

    def __init__(self):
        _light_pyroute2()
        from pyroute2.ethtool.ethtool import Ethtool as _E
        self.e = _E()

    def close(self):
        self.e.close()

    def channels(self, ifname: str) -> dict:
        try:
            c = self.e.get_channels(ifname)
        except Exception as e:  # noqa: BLE001
            raise _unsupported(e, f"{ifname}: channels") from None
        return c._asdict()

    def set_channels(self, ifname: str, values: dict) -> None:
        try:
            self.e.set_channels(ifname, {f"{k}_count": int(v) for k, v in values.items()})
        except Exception as e:  # noqa: BLE001
            raise _wrap(e, f"{ifname}: set channels {values}") from None

    def rings(self, ifname: str) -> dict:
        try:
            r = self.e.get_rings(ifname)
        except Exception as e:  # noqa: BLE001
            raise _unsupported(e, f"{ifname}: ring parameters") from None
        return {k: r._asdict()[k] for k in ("rx", "tx", "rx_max", "tx_max")}

    def set_rings(self, ifname: str, values: dict) -> None:
        cur = self.rings(ifname)
        args = {"rx": cur["rx"], "tx": cur["tx"], **{k: int(v) for k, v in values.items()}}
        try:
            self.e.set_rings(ifname, **args)
        except Exception as e:  # noqa: BLE001
            raise _wrap(e, f"{ifname}: set rings {values}") from None

    def features(self, ifname: str) -> dict[str, dict]:
        """short name -> {on, fixed, names} for the names the device has."""
        try:
            f = self.e.get_features(ifname).features
        except Exception as e:  # noqa: BLE001
            raise _unsupported(e, f"{ifname}: features") from None
        out = {}
        for short, names in FEATURES.items():
            have = [f[n] for n in names if n in f]
            if not have:
                continue
            first = have[0]
            out[short] = {"on": bool(first.enable), "fixed": not any(x.available for x in have),
                          "names": [x.name for x in have if x.available]}
        return out

    def set_feature(self, ifname: str, short: str, on: bool) -> None:
        try:
            feats = self.e.get_features(ifname)
            for n in FEATURES[short]:
                if n in feats.features and feats.features[n].available:
                    feats.features[n].enable = bool(on)
            self.e.set_features(ifname, feats)
        except Exception as e:  # noqa: BLE001
            raise _wrap(e, f"{ifname}: set {short} {'on' if on else 'off'}") from None


def _unsupported(e, what):
    if "NotSupported" in type(e).__name__ or _nl_errno(e) in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL):
        return UnsupportedError(f"{what}: not supported by the driver", errno.EOPNOTSUPP)
    if _nl_errno(e) == errno.ENODEV or "No such device" in str(e):
        return HkError(f"{what}: no such device", errno.ENODEV)
    return _wrap(e, what)


def _handle(h: int) -> str:
    return f"{h >> 16:x}:{h & 0xFFFF:x}"


class Tc:
    """Qdiscs: the kernel's own view, per interface and per transmit queue."""

    cache_file = "/run/hkgpu-tune/qdisc-support.json"

    def __init__(self):
        self.ip = _iproute()
        self._supported: dict[str, tuple[bool, str]] = {}

    def close(self):
        _release()

    def _boot(self) -> str:
        try:
            return open("/proc/sys/kernel/random/boot_id").read().strip() + os.uname().release
        except OSError:
            return ""

    def _cached(self, kind: str):
        import json
        try:
            doc = json.load(open(self.cache_file))
            if doc.get("boot") == self._boot():
                v = doc["kinds"].get(kind)
                return tuple(v) if v else None
        except (OSError, ValueError, KeyError):
            return None
        return None

    def _remember(self, kind: str, ans) -> None:
        import json
        try:
            try:
                doc = json.load(open(self.cache_file))
            except (OSError, ValueError):
                doc = {}
            if doc.get("boot") != self._boot():
                doc = {"boot": self._boot(), "kinds": {}}
            doc["kinds"][kind] = list(ans)
            os.makedirs(os.path.dirname(self.cache_file), mode=0o755, exist_ok=True)
            tmp = f"{self.cache_file}.{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, self.cache_file)
        except OSError:
            pass  # not root: probe again next time

    def qdiscs(self, index: int) -> dict:
        """{'root': kind, 'root_handle': 'h:0', 'children': {'8001:1': kind, ...}}"""
        root, root_handle, children = None, None, {}
        msgs = self.ip.get_qdiscs(index)
        for m in msgs:
            if m["parent"] == TC_H_ROOT:
                root, root_handle = m.get_attr("TCA_KIND"), m["handle"]
        # the mq the kernel attaches by itself has handle 0: (its queues are 0:1, 0:2, ...)
        for m in msgs:
            if root is not None and m["parent"] != TC_H_ROOT and (m["parent"] >> 16) == (root_handle >> 16):
                children[_handle(m["parent"])] = m.get_attr("TCA_KIND")
        return {"root": root or "noqueue", "root_handle": _handle(root_handle) if root is not None else None,
                "children": dict(sorted(children.items(), key=lambda kv: int(kv[0].split(":")[1], 16)))}

    def _opts(self, kind: str, index: int) -> dict:
        # pyroute2 sends pfifo's limit as 0 unless given, which drops every packet
        if kind in ("pfifo", "bfifo"):
            qlen = self.ip.get_links(index)[0].get_attr("IFLA_TXQLEN") or 1000
            return {"limit": qlen if kind == "pfifo" else qlen * 1514}
        return {}

    def replace_root(self, index: int, kind: str, name="") -> None:
        try:
            if kind == "mq":
                self.ip.tc("replace", "mq", index, handle=0x10000, parent=TC_H_ROOT)
            else:
                self.ip.tc("replace", kind, index, parent=TC_H_ROOT, **self._opts(kind, index))
        except Exception as e:  # noqa: BLE001
            raise _wrap(e, f"{name}: qdisc {kind}") from None

    def replace_child(self, index: int, parent: str, kind: str, name="") -> None:
        maj, mn = (int(x, 16) for x in parent.split(":"))
        try:
            self.ip.tc("replace", kind, index, parent=(maj << 16) | mn, **self._opts(kind, index))
        except Exception as e:  # noqa: BLE001
            raise _wrap(e, f"{name}: qdisc {kind} on queue {parent}") from None

    def delete_root(self, index: int, name="") -> None:
        try:
            self.ip.tc("del", index=index, parent=TC_H_ROOT)
        except Exception as e:  # noqa: BLE001
            if _nl_errno(e) in (errno.ENOENT, errno.EINVAL):
                return  # already the default
            raise _wrap(e, f"{name}: delete root qdisc") from None

    def supported(self, kind: str) -> tuple[bool, str]:
        """Does the kernel know this qdisc? Tried on 'lo' of a throwaway namespace, so the host is untouched."""
        if kind in self._supported:
            return self._supported[kind]
        cached = self._cached(kind)  # known for this boot and kernel
        if cached is not None:
            self._supported[kind] = cached
            return cached
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: own network namespace, then try it
            os.close(r)
            code = 3
            try:
                if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) != 0:
                    os.write(w, b"cannot create a network namespace to probe qdiscs")
                else:
                    _light_pyroute2()
                    from pyroute2.iproute.linux import IPRoute
                    with IPRoute() as ip:
                        try:
                            ip.tc("add", kind, 1, parent=TC_H_ROOT)
                            code = 0
                        except Exception as e:  # noqa: BLE001
                            os.write(w, os.strerror(_nl_errno(e) or 0).encode())
                            code = 2 if _nl_errno(e) in (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL) else 3
            finally:
                os._exit(code)
        os.close(w)
        msg = os.read(r, 4096).decode()
        os.close(r)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            ans = (True, "")
        elif code == 2:
            ans = (False, f"qdisc {kind} is unsupported by this kernel (sch_{kind} missing: {msg})")
        else:
            ans = (True, f"could not probe qdisc {kind}: {msg}")
            self._supported[kind] = ans
            return ans
        self._supported[kind] = ans
        self._remember(kind, ans)
        return ans
