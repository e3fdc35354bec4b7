"""Link MTU, WAN routes, and the don't-fragment probe that decides whether jumbo frames stay.

Every change names its device by identity (match.identity: name and permanent MAC in this
network namespace), never by ifindex; a route's original is saved whole and put back whole.
"""
from __future__ import annotations

import ipaddress

from hkgpu_tune.core.errors import ApplyError, CheckFailed, HkError
from hkgpu_tune.core.profile import parse_network
from hkgpu_tune.core.match import could_match, find, identity, matched, matches, resolve  # noqa: F401 - matches/matched: one import site
from hkgpu_tune.core.report import DRIFT, ERROR, OK, UNSUPPORTED
from hkgpu_tune.core import fields
from hkgpu_tune.core.fields import SettingType
from hkgpu_tune.subsystems.base import Check, Spec, Subsystem

# a don't-fragment ping of MTU - header bytes fills the MTU: IPv4 20 + ICMP 8, IPv6 40 + ICMPv6 8
HEADER = {4: 28, 6: 48}
WAN_MTU = 1500
ROUTE_KEYS = ("gateway", "oif", "priority", "table", "proto", "scope", "type", "mtu")


def family(addr: str) -> int:
    return ipaddress.ip_address(addr).version


class Plugin(Subsystem):
    name = "link"

    def read(self) -> dict:
        net = self.profile.network
        # route checks need every link (the device of a next hop); interface rules only those they can match
        st = {"links": self.b.net.links(None if net.wan_routes else could_match(net.interfaces)),
              "routes": {}, "via": {}}
        for r in self.profile.network.wan_routes:
            st["routes"][r.prefix] = self.b.net.route(r.prefix)
            if r.via and not r.dev:
                st["via"][r.via] = self.b.net.route_get(r.via)
        return st

    def compare(self, state):
        pairs, res = resolve(self, state["links"], "mtu")
        for rule, ln in pairs:
            if ln["mtu"] == rule.mtu:
                res.append(self.result(ln["name"], "mtu", ln["mtu"], rule.mtu, OK))
            else:
                res.append(self.result(ln["name"], "mtu", ln["mtu"], rule.mtu, DRIFT, "differs",
                                       write=rule.mtu, data={"identity": identity(ln)}))
        for r in self.profile.network.wan_routes:
            res.append(self._route(r, state))
        return res

    def _route(self, r, state):
        target = f"route {r.prefix}"
        orig = state["routes"].get(r.prefix)
        cur = orig["mtu"] if orig else None
        if ipaddress.ip_network(r.prefix).prefixlen == 0:
            return self.result(target, "mtu", cur, r.mtu, ERROR, "refused: a profile route may not cover the "
                               "default route")
        if orig and (orig["multipath"] or not orig["oif"]):
            return self.result(target, "mtu", cur, r.mtu, UNSUPPORTED,
                               "a multipath or device-less route: left as it is")
        by_name = {ln["name"]: ln for ln in state["links"]}
        by_index = {ln["index"]: ln for ln in state["links"]}
        if orig:
            dev = by_index.get(orig["oif"])
        elif r.dev:
            dev = by_name.get(r.dev)
        elif r.via:
            via = state["via"].get(r.via)
            dev = by_index.get(via["oif"]) if via else None
        else:
            return self.result(target, "mtu", None, r.mtu, ERROR, "no such route and no 'via' or 'dev' to create it")
        if r.dev and r.dev not in by_name:
            return self.result(target, "mtu", cur, r.mtu, ERROR, f"no device {r.dev} in this namespace")
        if dev is None:
            return self.result(target, "mtu", cur, r.mtu, ERROR, f"no route to its next hop {r.via}")
        wrong = []
        if orig and r.via and orig["gateway"] != r.via:
            wrong.append(f"next hop {orig['gateway'] or 'none'}, the profile says {r.via}")
        if orig and r.dev and by_index.get(orig["oif"], {}).get("name") != r.dev:
            wrong.append(f"device {orig['dev']}, the profile says {r.dev}")
        if orig and cur == r.mtu and not wrong:
            return self.result(target, "mtu", cur, r.mtu, OK)
        reason = "route missing" if not orig else "; ".join(wrong + (["route MTU differs"] if cur != r.mtu else []))
        data = {"identity": identity(dev), "orig": orig,
                "want": {"gateway": r.via, "dev": r.dev, "mtu": r.mtu}}
        return self.result(target, "mtu", cur, r.mtu, DRIFT, reason, write=r.mtu, data=data)

    # ------------------------------------------------------------ writes
    def write(self, target, key, value, data):
        if target.startswith("route "):
            return self._set_route(target.split(" ", 1)[1], value, data)
        ln = find(self.b.net, data, f"mtu {value}")
        self.b.net.set_mtu(ln["index"], value, target)

    def restore(self, change):
        if not change.target.startswith("route "):
            return self.write(change.target, change.key, change.current, change.data)
        prefix, data = change.target.split(" ", 1)[1], change.data
        orig, want = data.get("orig"), data.get("want") or {}
        now = self.b.net.route(prefix)
        if orig is None:
            # this run added it: delete exactly that route, never a default route, never another one
            if now is None:
                return
            if ipaddress.ip_network(prefix).prefixlen == 0:
                raise ApplyError(f"route {prefix}: rollback never deletes a default route")
            if now["mtu"] != want.get("mtu") or (want.get("gateway") and now["gateway"] != want["gateway"]):
                raise ApplyError(f"route {prefix}: changed since apply (via {now['gateway']}, mtu {now['mtu']}); "
                                 "left as it is")
            self.b.net.set_route(now, delete=True)
            return
        ln = find(self.b.net, data, f"route {prefix}")
        back = {**orig, "oif": ln["index"]}
        if now is not None and all(now.get(k) == back.get(k) for k in ROUTE_KEYS):
            return   # already as it was
        self.b.net.set_route(back)
        self._check(prefix, back)

    def _set_route(self, prefix, mtu, data):
        ln = find(self.b.net, data, f"route {prefix}")
        orig, want = data.get("orig"), data.get("want") or {}
        new = dict(orig) if orig else {"dst": prefix, "table": 254, "priority": None, "proto": None,
                                       "scope": None, "type": None, "gateway": None, "oif": None}
        new["mtu"] = mtu
        if orig:
            new["oif"] = ln["index"]
        hop = {"gateway": want.get("gateway") or new["gateway"], "oif": new["oif"]}
        if want.get("dev"):
            hop["oif"] = ln["index"]
        elif want.get("gateway") and want["gateway"] != new["gateway"]:
            hop["oif"] = None   # another next hop: the kernel finds its device
        if hop != {"gateway": new["gateway"], "oif": new["oif"]}:
            new.update(hop, scope=None)   # the old scope may not suit the new next hop
        self.b.net.set_route(new)
        try:
            self._check(prefix, {k: v for k, v in new.items() if v is not None})
        except HkError:
            # the kernel took a route other than asked: put the original back (or remove the one
            # just added) before failing, so the failed write leaves nothing behind without a record
            now = self.b.net.route(prefix)
            if orig:
                self.b.net.set_route({**orig, "oif": ln["index"]})
            elif now is not None and ipaddress.ip_network(prefix).prefixlen:
                self.b.net.set_route(now, delete=True)
            raise

    def _check(self, prefix, want):
        got = self.b.net.route(prefix)
        bad = [k for k in ROUTE_KEYS if k in want and (got or {}).get(k) != want[k]]
        if got is None or bad:
            shown = ", ".join(f"{k} {(got or {}).get(k)} (wanted {want[k]})" for k in bad) or "no route"
            raise ApplyError(f"route {prefix}: the kernel shows {shown}")

    # ------------------------------------------------------------ the probe
    def ping(self, addr: str, size: int) -> bool:
        net = self.profile.network
        argv = ["ping", f"-{family(addr)}", "-n", "-q", "-M", "do", "-s", str(size), "-c", str(net.probe_count),
                "-i", "0.2", "-W", str(int(net.probe_timeout_s)), addr]
        return self.b.cmd.run(argv, timeout=10 + net.probe_count * net.probe_timeout_s).rc == 0

    def targets(self, links: list[dict], proving: list[dict]):
        """(address, label, link, size) to ping, and the failures found before any ping as
        (device or "-", peer or "-", message): a fabric or WAN peer with no route, a fabric peer not
        routed through an interface whose MTU this profile sets, an interface being proven that is
        down or that nothing is routed through."""
        net = self.profile.network
        managed = {ln["index"]: ln for _, ln in resolve(self, links, "mtu")[0]}
        by_index = {ln["index"]: ln for ln in links}
        out, fails = [], []
        for ln in proving:
            if not ln.get("up", True):
                fails.append((ln["name"], "-", f"{ln['name']} is down: its MTU {ln['mtu']} cannot be proven"))
            if net.probe_gateway:
                out += [(gw, f"gateway {gw}", ln, ln["mtu"] - HEADER[family(gw)]) for gw in self.b.net.gateways(ln["index"])]
        for p in net.fabric_peers:
            r = self.b.net.route_get(p)
            ln = managed.get(r["oif"]) if r else None
            if r is None:
                fails.append(("-", p, f"fabric peer {p}: no route to it"))
            elif ln is None:
                via = by_index.get(r["oif"], {}).get("name", f"ifindex {r['oif']}")
                fails.append((via, p, f"fabric peer {p} is routed through {via}, not through an interface whose "
                              "MTU the profile sets: its path cannot be proven"))
            else:
                out.append((p, f"fabric peer {p}", ln, ln["mtu"] - HEADER[family(p)]))
        for w in net.wan_peers:
            label = f"WAN peer {w.address}" + (f" ({w.name})" if w.name else "")
            r = self.b.net.route_get(w.address)
            ln = by_index.get(r["oif"]) if r else None
            if ln is None:
                fails.append(("-", w.address, f"{label}: no route to it"))
            else:
                out.append((w.address, label, ln,
                            min(WAN_MTU, ln["mtu"]) - HEADER[family(w.address)]))
        for ln in proving:
            if ln.get("up", True) and not any(t[2]["index"] == ln["index"] and not t[1].startswith("WAN")
                                              for t in out):
                fails.append((ln["name"], "-", f"{ln['name']}: its MTU {ln['mtu']} is unproven: no gateway or "
                              "fabric peer is routed through it"))
        return out, fails

    def checks(self, changes):
        """The MTU proof, a check of the apply's transaction: jumbo MTU stays only if every gateway
        and peer answers a don't-fragment ping that fills the MTU of the interface carrying it (WAN
        peers at 1500), through that interface. A failure undoes the whole run (the engine's journal)."""
        raised = [c for c in changes if c.key == "mtu" and not c.target.startswith("route ")
                  and c.applied and int(c.desired) > int(c.current or 0)]
        if not raised:
            return []
        return [Check("mtu proof", lambda: self._prove(raised))]

    def _prove(self, raised):
        links = self.b.net.links()
        names = {c.target for c in raised}
        out, pre = self.targets(links, [ln for ln in links if ln["name"] in names])
        fails = [m for _, _, m in pre]
        done = set()
        for addr, label, ln, size in out:
            if (addr, size) in done:
                continue
            done.add((addr, size))
            if not self.ping(addr, size):
                fails.append(f"{label} did not answer a {size}-byte don't-fragment ping via {ln['name']}")
        if fails:
            raise CheckFailed("MTU probe failed: " + "; ".join(fails), undone="the old MTU is restored")

    def probe(self) -> list:
        """Read-only probe of the live MTU (for verify --probe)."""
        links = self.b.net.links()
        out, fails = self.targets(links, [ln for _, ln in resolve(self, links, "mtu")[0]])
        res = [self.result(dev, f"path mtu to {peer}" if peer != "-" else "path mtu", None, None, DRIFT, m)
               for dev, peer, m in fails]
        for addr, label, ln, size in out:
            ok = self.ping(addr, size)
            res.append(self.result(ln["name"], f"path mtu to {addr}", size if ok else "fails", size,
                                   OK if ok else DRIFT, label))
        return res


# ---------------------------------------------------------------- the setting types (state.json)
def _check_mtu(c) -> None:
    fields.identity(c.data)
    fields.ifname(c.target)
    fields.one_of(c.key, "key", ("mtu",))
    fields.integer(c.current, "original", 68, 65535)
    fields.integer(c.desired, "desired", 68, 65535)
    fields.integer(c.data.get("index"), "data.index", 1, 2**31 - 1, none=True)


def _check_route(c) -> None:
    fields.identity(c.data)
    if not c.target.startswith("route "):
        fields.fail(f"target: {c.target!r}, expected 'route PREFIX'")
    try:
        ipaddress.ip_network(c.target[6:], strict=False)
    except ValueError:
        fields.fail(f"target: {c.target[6:]!r} is not an IP prefix")
    fields.one_of(c.key, "key", ("mtu",))
    fields.integer(c.current, "original", 68, 65535, none=True)
    fields.integer(c.desired, "desired", 68, 65535, none=True)
    d = c.data
    for k in ("via", "gateway"):
        fields.ip(d.get(k), f"data.{k}")
    if d.get("dev") is not None:
        fields.ifname(d["dev"], "data.dev")
    fields.boolean(d.get("existed"), "data.existed", none=True)
    for part in ("orig", "want"):
        r = d.get(part)
        if r is None:
            continue
        if not isinstance(r, dict):
            fields.fail(f"data.{part}: expected a route")
        fields.ip(r.get("gateway"), f"data.{part}.gateway")
        if r.get("dev") is not None:
            fields.ifname(r["dev"], f"data.{part}.dev")
        fields.integer(r.get("mtu"), f"data.{part}.mtu", 68, 65535, none=True)
        for k in ("oif", "priority", "table", "proto", "scope", "type", "family"):
            fields.integer(r.get(k), f"data.{part}.{k}", 0, 2**32 - 1, none=True)
        if r.get("dst") is not None and r["dst"] != c.target[6:]:
            fields.fail(f"data.{part}.dst: {r['dst']!r} is not the entry's prefix {c.target[6:]}")


def _kind(c) -> str:
    return "link.route" if str(c.target).startswith("route ") else "link.mtu"


SPEC = Spec(name="link", order=20, section="network", plugin=Plugin, persist="network manager", netns=True,
            sections={"network": parse_network}, kind_of=_kind,
            types=(SettingType("link.mtu", "link", _check_mtu), SettingType("link.route", "link", _check_route)))
