"""Facts: packet filtering on the serving path (nftables rules that name a serving port, and the
policy of each base chain), and connection tracking's use against its limit. Nothing is written
here; the conntrack limit is a sysctl (net.netfilter.nf_conntrack_max).

The serving ports are the triton section's HTTP, gRPC and metrics ports (Triton's 8000-8002
without one). Rules are read as `nft -j list ruleset` prints them (iptables-nft rules are there
too); a host with neither nft nor nf_tables says so.
"""
from __future__ import annotations

import json

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.subsystems.base import Spec, Subsystem

TRITON_PORTS = (8000, 8001, 8002)
VERDICTS = ("accept", "drop", "reject", "jump", "goto", "return", "queue")


def serving_ports(profile) -> list[int]:
    """Every Triton service's HTTP, gRPC and metrics ports (none in the profile: Triton's defaults)."""
    from hkgpu_tune.serve.schema.config import each
    ports = [getattr(getattr(x, k, None), "port", None) for x in each(profile.section("triton"))
             for k in ("http", "grpc", "metrics")]
    return sorted({p for p in ports if isinstance(p, int)} or set(TRITON_PORTS))


def _ports(right, sets: dict) -> list | None:
    """The ports an nft match's right-hand side names: int, {"set": [...]}, {"range": [a, b]}, "@set"."""
    if isinstance(right, bool):
        return None
    if isinstance(right, int):
        return [right]
    if isinstance(right, str) and right.startswith("@"):
        return _ports({"set": sets.get(right[1:], [])}, sets)
    if isinstance(right, dict):
        if "range" in right and len(right["range"]) == 2 and all(isinstance(x, int) for x in right["range"]):
            return [tuple(right["range"])]
        if "set" in right and isinstance(right["set"], list):
            out = []
            for x in right["set"]:
                out += _ports(x, sets) or []
            return out
    return None


def _hits(ports, serving) -> list[int]:
    return sorted({s for s in serving for p in ports if (p == s if isinstance(p, int) else p[0] <= s <= p[1])})


def read_nft(doc: dict, serving: list[int]) -> dict:
    """Base chains with their policy, and the rules that match a serving port (with their verdict)."""
    items = doc.get("nftables", []) if isinstance(doc, dict) else []
    sets = {}
    for it in items:
        s = it.get("set") if isinstance(it, dict) else None
        if isinstance(s, dict) and isinstance(s.get("elem"), list):
            sets[s.get("name")] = s["elem"]
    chains, rules = [], []
    for it in items:
        if not isinstance(it, dict):
            continue
        c = it.get("chain")
        if isinstance(c, dict) and c.get("hook"):
            chains.append({k: c.get(k) for k in ("family", "table", "name", "hook", "prio", "policy")})
        r = it.get("rule")
        if not isinstance(r, dict):
            continue
        ports, verdict = [], None
        for e in r.get("expr") or []:
            if not isinstance(e, dict):
                continue
            m = e.get("match")
            if isinstance(m, dict):
                field = ((m.get("left") or {}).get("payload") or {}).get("field") if isinstance(m.get("left"), dict) \
                    else None
                if field in ("dport", "sport"):
                    ports += [(field, p) for p in (_ports(m.get("right"), sets) or [])]
            for v in VERDICTS:
                if v in e:
                    verdict = v
        hit = _hits([p for _, p in ports], serving)
        if hit:
            rules.append({"family": r.get("family"), "table": r.get("table"), "chain": r.get("chain"),
                          "handle": r.get("handle"), "ports": hit, "verdict": verdict})
    return {"chains": chains, "rules": rules}


class Plugin(Subsystem):
    name = "firewall"
    facts_only = True

    # facts only: verify and plan have nothing to compare and read nothing
    def verify(self):
        return []

    def plan(self, state=None):
        return [], []

    def compare(self, state):
        return []

    def read(self) -> dict:
        serving = serving_ports(self.profile)
        return {"serving_ports": serving, "nftables": self._nft(serving), "conntrack": self._conntrack()}

    def _nft(self, serving) -> dict:
        if self.b.cmd.which("nft") is None:
            return {"unsupported": "the nft command is not installed (nftables)"}
        try:
            r = self.b.cmd.run(["nft", "-j", "list", "ruleset"], timeout=10)
        except HkError as e:
            return {"error": str(e)}
        if r.rc != 0:
            msg = (r.err or r.out).strip().splitlines()
            return {"unsupported": f"nft: {msg[0] if msg else f'exit {r.rc}'}"}
        try:
            return read_nft(json.loads(r.out or "{}"), serving)
        except ValueError as e:
            return {"error": f"nft -j printed no JSON ({e})"}

    def _conntrack(self) -> dict:
        cnt = self.b.sysctl.read("net.netfilter.nf_conntrack_count")
        mx = self.b.sysctl.read("net.netfilter.nf_conntrack_max")
        if cnt is None or mx is None:
            return {"unsupported": "no connection tracking here (nf_conntrack not loaded)"}
        try:
            c, m = int(cnt), int(mx)
        except ValueError:
            return {"error": f"nf_conntrack_count {cnt!r}, nf_conntrack_max {mx!r}: not numbers"}
        return {"count": c, "max": m, "used": c / m if m else None}


SPEC = Spec(name="firewall", order=50, section="network", plugin=Plugin, persist="none")
