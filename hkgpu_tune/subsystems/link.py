"""Link MTU, WAN route MTUs, and the don't-fragment probe that decides whether jumbo frames stay."""
from __future__ import annotations

from ..errors import ApplyError
from ..report import DRIFT, ERROR, OK, UNSUPPORTED
from .base import Subsystem


def matches(match, link: dict) -> bool:
    if match.name and link["name"] != match.name:
        return False
    if match.mac and link["mac"] != match.mac:
        return False
    if match.driver and link["driver"] != match.driver:
        return False
    if match.pci and link["pci"] != match.pci:
        return False
    if match.default_route and not link["default_route"]:
        return False
    return True


def matched(profile, links: list[dict], attrs) -> list[dict]:
    """The links some rule that sets one of `attrs` matches, each once."""
    rules = [r for r in profile.network.interfaces if any(getattr(r, a) not in (None, {}, "") for a in attrs)]
    return [ln for ln in links if any(matches(r.match, ln) for r in rules)]


def resolve(sub: Subsystem, links: list[dict], attr: str):
    """Yield (interface rule, link) for rules that set `attr`; results for rules that match nothing."""
    pairs, missing = [], []
    for rule in sub.profile.network.interfaces:
        if getattr(rule, attr) in (None, {}, ""):
            continue
        found = [ln for ln in links if matches(rule.match, ln)]
        if not found:
            status = OK if rule.optional else UNSUPPORTED
            want = getattr(rule, attr)
            if hasattr(want, "__dataclass_fields__"):
                want = {k: v for k, v in vars(want).items() if v is not None}
            missing.append(sub.result(f"match {rule.match.describe()}", attr, None, want, status,
                                      "no interface on this host matches", required=not rule.optional))
        pairs += [(rule, ln) for ln in found]
    return pairs, missing


class Plugin(Subsystem):
    name = "link"

    def read(self) -> dict:
        st = {"links": self.b.net.links(), "routes": {}}
        for r in self.profile.network.wan_routes:
            st["routes"][r.prefix] = self.b.net.route_mtu(r.prefix)
        return st

    def compare(self, state):
        pairs, res = resolve(self, state["links"], "mtu")
        for rule, ln in pairs:
            if ln["mtu"] == rule.mtu:
                res.append(self.result(ln["name"], "mtu", ln["mtu"], rule.mtu, OK))
            else:
                res.append(self.result(ln["name"], "mtu", ln["mtu"], rule.mtu, DRIFT, "differs",
                                       write=rule.mtu, data={"index": ln["index"]}))
        for r in self.profile.network.wan_routes:
            exists, mtu = state["routes"].get(r.prefix, (False, None))
            data = {"via": r.via, "dev": r.dev}
            if mtu == r.mtu:
                res.append(self.result(f"route {r.prefix}", "mtu", mtu, r.mtu, OK))
            elif not exists and not r.via and not r.dev:
                res.append(self.result(f"route {r.prefix}", "mtu", None, r.mtu, ERROR,
                                       "no such route and no 'via' or 'dev' to create it"))
            else:
                res.append(self.result(f"route {r.prefix}", "mtu", mtu, r.mtu, DRIFT,
                                       "route missing" if not exists else "route MTU differs",
                                       write=r.mtu, data={**data, "existed": exists}))
        return res

    def write(self, target, key, value, data):
        if target.startswith("route "):
            prefix = target.split(" ", 1)[1]
            oif = None
            if data.get("dev"):
                idx = [ln["index"] for ln in self.b.net.links() if ln["name"] == data["dev"]]
                oif = idx[0] if idx else None
            # value None: the original had no MTU metric (keep the route) or no route at all (delete it)
            self.b.net.set_route_mtu(prefix, value, data.get("via"), oif,
                                     delete=value is None and not data.get("existed"))
            return
        self.b.net.set_mtu(data["index"], value, target)

    # ------------------------------------------------------------ the probe
    def probe_targets(self, index: int) -> list[tuple[str, str]]:
        """(address, why) pairs that must pass with DF at this interface's MTU."""
        net = self.profile.network
        out = []
        if net.probe_gateway:
            out += [(gw, "gateway") for gw in self.b.net.gateways(index)]
        for p in net.fabric_peers:
            if self.b.net.route_oif(p) == index and p not in [a for a, _ in out]:
                out.append((p, "fabric peer"))
        return out

    def ping(self, addr: str, size: int) -> bool:
        net = self.profile.network
        argv = ["ping", "-n", "-q", "-M", "do", "-s", str(size), "-c", str(net.probe_count), "-i", "0.2",
                "-W", str(int(net.probe_timeout_s)), addr]
        return self.b.cmd.run(argv, timeout=10 + net.probe_count * net.probe_timeout_s).rc == 0

    def after_apply(self, changes):
        """Jumbo MTU stays only if every peer answers a DF ping of MTU-28 bytes; WAN peers at 1472."""
        raised = [c for c in changes if c.key == "mtu" and not c.target.startswith("route ")
                  and c.applied and int(c.desired) > int(c.current or 0)]
        if not raised:
            return
        failures = []
        for c in raised:
            idx = c.data["index"]
            size = int(c.desired) - 28
            for addr, why in self.probe_targets(idx):
                if not self.ping(addr, size):
                    failures.append(f"{why} {addr} did not answer a {size}-byte don't-fragment ping via {c.target}")
            for w in self.profile.network.wan_peers:
                if self.b.net.route_oif(w.address) == idx and not self.ping(w.address, 1472):
                    name = f" ({w.name})" if w.name else ""
                    failures.append(f"WAN peer {w.address}{name} did not answer a 1472-byte don't-fragment ping")
        if failures:
            raise ApplyError("MTU probe failed, the old MTU is restored: " + "; ".join(failures))

    def probe(self) -> list:
        """Read-only probe of the live MTU (for verify --probe)."""
        res = []
        pairs, _ = resolve(self, self.b.net.links(), "mtu")
        for _, ln in pairs:
            size = ln["mtu"] - 28
            for addr, why in self.probe_targets(ln["index"]):
                ok = self.ping(addr, size)
                res.append(self.result(ln["name"], f"path mtu to {addr}", size if ok else "fails", size,
                                       OK if ok else DRIFT, why))
        return res
