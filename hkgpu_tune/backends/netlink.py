"""Netlink through pyroute2: links, routes, qdiscs, ethtool."""
from __future__ import annotations

import ctypes
import errno
import os
import re
import socket
import time

from hkgpu_tune.core.errors import ApplyError, HkError, UnsupportedError

TC_H_ROOT = 0xFFFFFFFF
RTN_UNICAST, RTN_LOCAL = 1, 2
CLONE_NEWNET = 0x40000000
IFF_UP = 0x1
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


def sysfs_links() -> list[dict]:
    """Name, current MAC, driver and PCI address of each device of this namespace, from /sys
    alone (driver None for a virtual device: its kind is known only to netlink)."""
    out = []
    try:
        names = sorted(os.listdir("/sys/class/net"))
    except OSError:
        return out
    for name in names:
        if name == "lo" or not os.path.isdir(f"/sys/class/net/{name}"):
            continue
        try:
            with open(f"/sys/class/net/{name}/address") as f:
                mac = f.read().strip().lower()
        except OSError:
            mac = ""
        driver, pci = _bus_device(name)
        out.append({"name": name, "mac": mac, "driver": driver, "pci": pci})
    return out


def _bus_device(name: str) -> tuple[str | None, str | None]:
    """(driver, PCI address) of a device's bus device in /sys; (None, None) for a virtual one."""
    dev = f"/sys/class/net/{name}/device"
    if not os.path.exists(dev):
        return None, None
    drv = os.path.realpath(dev + "/driver")
    base = os.path.basename(os.path.realpath(dev))
    return (os.path.basename(drv) if os.path.exists(drv) else None), (base if PCI_ADDR.match(base) else None)


class Net:
    """Links and routes."""

    def __init__(self):
        self._ip = None
        self._links = None

    @property
    def ip(self):
        """The netlink socket, opened on first use (importing pyroute2 costs about 70 ms)."""
        if self._ip is None:
            self._ip = _iproute()
        return self._ip

    def close(self):
        if self._ip is not None:
            self._ip = None
            _release()

    def links(self, could_match=None) -> list[dict]:
        """Cached until this process changes a link (three subsystems read the same list).
        could_match: a test on what /sys shows of a device (sysfs_links); where no device passes
        it, no rule can match any and the answer is [] without opening netlink."""
        if self._links is None:
            if could_match is not None and not any(could_match(d) for d in sysfs_links()):
                return []
            self._links = self._read_links()
        return [dict(x) for x in self._links]

    def _read_links(self) -> list[dict]:
        default = self.default_oif()
        return [d for d in (self._link_dict(m, default) for m in self.ip.get_links()) if d["name"] != "lo"]

    def link(self, name: str) -> dict | None:
        """The device of this name in this namespace, read now (not from the cache); None if gone."""
        try:
            msgs = self.ip.link("get", ifname=name)
        except Exception as e:  # noqa: BLE001 - ENODEV is an answer
            if _nl_errno(e) in (errno.ENODEV, errno.ENOENT) or "No such device" in str(e):
                return None
            raise _wrap(e, f"{name}: read link") from None
        return self._link_dict(msgs[0], self.default_oif()) if msgs else None

    @staticmethod
    def _link_dict(msg, default) -> dict:
        name = msg.get_attr("IFLA_IFNAME")
        info = msg.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info else None
        driver, pci = _bus_device(name)
        perm = (msg.get_attr("IFLA_PERM_ADDRESS") or "").lower()
        return {
            "name": name, "index": msg["index"], "mac": (msg.get_attr("IFLA_ADDRESS") or "").lower(),
            # ethtool's permanent address; none on veth and other virtual links
            "perm_mac": perm if perm.strip("0:") else None,
            "mtu": msg.get_attr("IFLA_MTU"), "driver": driver or kind, "kind": kind, "pci": pci,
            "state": msg.get_attr("IFLA_OPERSTATE"), "up": bool(msg["flags"] & IFF_UP),
            "tx_queues": msg.get_attr("IFLA_NUM_TX_QUEUES") or 1,
            "default_route": msg["index"] == default,
        }

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
        for fam in (socket.AF_INET, socket.AF_INET6):
            for r in self.ip.get_routes(family=fam, oif=index):
                gw = r.get_attr("RTA_GATEWAY")
                if gw and gw not in gws and not gw.startswith("fe80:"):
                    gws.append(gw)
        return gws

    def route_get(self, dst: str) -> dict | None:
        """The kernel's answer to RTM_GETROUTE: {'oif', 'gateway'}; None when unreachable."""
        fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
        try:
            r = self.ip.route("get", dst=dst, family=fam)
        except Exception:  # noqa: BLE001 - no route is an answer
            return None
        if not r or r[0]["type"] not in (RTN_UNICAST, RTN_LOCAL):
            return None
        return {"oif": r[0].get_attr("RTA_OIF"), "gateway": r[0].get_attr("RTA_GATEWAY")}

    def mtu(self, index: int) -> int:
        return self.ip.get_links(index)[0].get_attr("IFLA_MTU")

    def set_mtu(self, index: int, mtu: int, name: str = "") -> None:
        self._links = None
        try:
            self.ip.link("set", index=index, mtu=int(mtu))
        except Exception as e:  # noqa: BLE001 - NetlinkError carries errno
            raise _wrap(e, f"{name}: set mtu {mtu}") from None
        self._poll(lambda: self.mtu(index) == int(mtu), f"{name}: mtu {mtu}")

    def route(self, prefix: str, table: int = 254) -> dict | None:
        """The route to exactly this prefix in this table (the one of lowest metric), whole:
        {dst, family, table, gateway, oif, dev, priority, proto, scope, type, mtu, multipath}."""
        dst, plen = prefix.split("/")
        fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
        found = []
        for r in self.ip.get_routes(family=fam, table=table):  # a dump, not a lookup
            rdst = r.get_attr("RTA_DST")
            if r["dst_len"] != int(plen) or (rdst or ("::" if fam == socket.AF_INET6 else "0.0.0.0")) != dst:
                continue
            if (r.get_attr("RTA_TABLE") or r["table"]) != table:
                continue
            found.append(r)
        if not found:
            return None
        r = min(found, key=lambda m: m.get_attr("RTA_PRIORITY") or 0)
        oif = r.get_attr("RTA_OIF")
        names = {m["index"]: m.get_attr("IFLA_IFNAME") for m in self.ip.get_links()} if oif else {}
        return {"dst": prefix, "family": 6 if fam == socket.AF_INET6 else 4, "table": table,
                "gateway": r.get_attr("RTA_GATEWAY"), "oif": oif, "dev": names.get(oif),
                "priority": r.get_attr("RTA_PRIORITY") or 0, "proto": r["proto"], "scope": r["scope"],
                "type": r["type"], "mtu": _route_mtu(r), "multipath": bool(r.get_attr("RTA_MULTIPATH"))}

    def set_route(self, r: dict, delete: bool = False) -> None:
        """Replace (or delete) the route to r['dst'] in r['table'] of metric r['priority'] with
        exactly r's attributes: gateway, oif, proto, scope, type and mtu (None: no MTU metric)."""
        dst, plen = r["dst"].split("/")
        fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
        args = {"dst": dst, "dst_len": int(plen), "family": fam, "table": r.get("table", 254),
                "priority": r.get("priority") or 0}
        what = f"route {r['dst']}"
        try:
            if delete:
                self.ip.route("del", **args)
                return
            for k in ("proto", "scope", "type"):
                if r.get(k) is not None:
                    args[k] = r[k]
            if r.get("gateway"):
                args["gateway"] = r["gateway"]
            if r.get("oif"):
                args["oif"] = r["oif"]
            if r.get("mtu"):
                args["metrics"] = {"mtu": int(r["mtu"])}
            self.ip.route("replace", **args)
        except Exception as e:  # noqa: BLE001
            raise _wrap(e, f"{what} {'delete' if delete else 'replace'}") from None

    @staticmethod
    def _poll(cond, what, timeout=2.0):
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise ApplyError(f"{what}: the kernel did not show the change within {timeout} s")
            time.sleep(0.01)


# ethtool's short offload names -> the kernel features behind each, as ethtool's own patterns
# (ethtool.c off_flag_def): `ethtool -K dev tso off` changes every feature its pattern matches
FEATURES = {
    "gro": ["rx-gro"],
    "gso": ["tx-generic-segmentation"],
    "tso": ["tx-tcp*-segmentation"],   # tcp, tcp-ecn, tcp-accecn, tcp-mangleid, tcp6
    "lro": ["rx-lro"],
    "rx_checksum": ["rx-checksum"],
    "tx_checksum": ["tx-checksum-*"],
    "sg": ["tx-scatter-gather*"],
    "rxhash": ["rx-hashing"],
}


def feature_names(short: str, have) -> list[str]:
    """The kernel features among `have` (names, in order) behind the offload `short`."""
    from fnmatch import fnmatchcase
    return [n for n in have if any(fnmatchcase(n, p) for p in FEATURES[short])]


class Ethtool:
    """Channels, rings and features (pyroute2.ethtool: netlink, ioctl where needed)."""

    def __init__(self):
        self._e = None

    @property
    def e(self):
        """pyroute2's Ethtool, made on first use (a verify with no matched NIC never imports it)."""
        if self._e is None:
            _light_pyroute2()
            from pyroute2.ethtool.ethtool import Ethtool as _E
            self._e = _E()
        return self._e

    def close(self):
        if self._e is not None:
            self._e.close()
            self._e = None

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
        """short name -> {on, fixed, names, each}: `each` holds every kernel feature behind the
        offload that the device lets change, with its state; `on` is true when all of them are on."""
        try:
            f = self.e.get_features(ifname).features
        except Exception as e:  # noqa: BLE001
            raise _unsupported(e, f"{ifname}: features") from None
        out = {}
        for short in FEATURES:
            have = [f[n] for n in feature_names(short, f)]
            if not have:
                continue
            each = {x.name: bool(x.enable) for x in have if x.available}
            out[short] = {"on": all(each.values()) if each else bool(have[0].enable), "fixed": not each,
                          "names": list(each), "each": each}
        return out

    def set_feature(self, ifname: str, short: str, on) -> None:
        """Set every changeable kernel feature behind `short` to `on` (a bool), or each named one
        to its own value (`on` a dict {kernel feature: bool}, as saved)."""
        want = on if isinstance(on, dict) else None
        unknown = sorted(set(want or ()) - set(feature_names(short, want or ())))
        if unknown:
            raise ApplyError(f"{ifname}: {short}: not a feature behind it: {', '.join(unknown)}")
        try:
            feats = self.e.get_features(ifname)
            for n in feature_names(short, feats.features):
                if feats.features[n].available:
                    if want is None:
                        feats.features[n].enable = bool(on)
                    elif n in want:
                        feats.features[n].enable = bool(want[n])
            self.e.set_features(ifname, feats)
        except Exception as e:  # noqa: BLE001
            what = on if isinstance(on, dict) else ("on" if on else "off")
            raise _wrap(e, f"{ifname}: set {short} {what}") from None


def _route_mtu(r) -> int | None:
    m = r.get_attr("RTA_METRICS")
    if isinstance(m, dict):
        return dict(m.get("attrs", [])).get("RTAX_MTU")
    return m.get_attr("RTAX_MTU") if m else None


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
        self._ip = None  # opened on first use: supported() answered from the boot cache needs no netlink
        self._supported: dict[str, tuple[bool, str]] = {}

    @property
    def ip(self):
        if self._ip is None:
            self._ip = _iproute()
        return self._ip

    @ip.setter
    def ip(self, value):
        self._ip = value

    def close(self):
        if self.__dict__.get("_ip") is not None:
            self._ip = None
            _release()

    def _boot(self) -> str:
        try:
            return open("/proc/sys/kernel/random/boot_id").read().strip() + os.uname().release
        except OSError:
            return ""

    CACHE_MAX = 64 << 10

    def _load_cache(self) -> dict | None:
        """The boot cache, trusted only as a regular file of at most CACHE_MAX bytes, in a
        directory, both owned by this user and writable by no one else, of the expected shape
        ({"boot": str, "kinds": {kind: [bool, str]}}); anything else is ignored (probed again)."""
        import json
        import stat
        try:
            d = os.lstat(os.path.dirname(self.cache_file))
            fd = os.open(self.cache_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            uid = os.geteuid()
            if not (stat.S_ISREG(st.st_mode) and stat.S_ISDIR(d.st_mode)) or st.st_size > self.CACHE_MAX \
                    or st.st_uid != uid or d.st_uid != uid or (st.st_mode | d.st_mode) & 0o022:
                return None
            doc = json.loads(os.read(fd, self.CACHE_MAX + 1))
        except (OSError, ValueError, RecursionError):
            return None
        finally:
            os.close(fd)
        if not (isinstance(doc, dict) and isinstance(doc.get("boot"), str) and isinstance(doc.get("kinds"), dict)
                and all(isinstance(v, list) and len(v) == 2 and isinstance(v[0], bool) and isinstance(v[1], str)
                        for v in doc["kinds"].values())):
            return None
        return doc

    def _cached(self, kind: str):
        doc = self._load_cache()
        if doc and doc["boot"] == self._boot():
            v = doc["kinds"].get(kind)
            return tuple(v) if v else None
        return None

    def _remember(self, kind: str, ans) -> None:
        import json
        from hkgpu_tune.core.fsutil import atomic_write
        doc = self._load_cache()
        if not doc or doc["boot"] != self._boot():
            doc = {"boot": self._boot(), "kinds": {}}
        doc["kinds"][kind] = list(ans)
        try:
            os.makedirs(os.path.dirname(self.cache_file), mode=0o755, exist_ok=True)
            atomic_write(self.cache_file, json.dumps(doc), mode=0o644)
        except (OSError, HkError):
            pass  # not root, or not a file it may replace: probe again next time

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
