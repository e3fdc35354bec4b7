"""The one place interfaces are matched to profile rules, and a saved target is found again.

A rule's match keys: name (exact, or a shell glob such as ``ens*``), mac (the current or the
permanent address), driver, pci and default_route; all given keys must hold. Where several
rules match one device, their settings are merged; two rules that set the same key of one
device differently are a ProfileError naming both rules.

>>> from hkgpu_tune.core.profile import Match
>>> matches(Match(name="ens*f0"), {"name": "ens1f0", "mac": "", "driver": None, "pci": None})
True
"""
from __future__ import annotations

import dataclasses
from fnmatch import fnmatchcase

from hkgpu_tune.core.errors import ProfileError, StateError, TargetGone
from hkgpu_tune.core.report import OK, UNSUPPORTED

GLOB = frozenset("*?[")


def _name(pattern: str, name: str) -> bool:
    return fnmatchcase(name, pattern) if GLOB & set(pattern) else name == pattern


def matches(match, link: dict) -> bool:
    mac = (match.mac or "").lower()
    return all((
        not match.name or _name(match.name, link["name"]),
        not mac or mac in (link.get("mac"), link.get("perm_mac")),
        not match.driver or link.get("driver") == match.driver,
        not match.pci or link.get("pci") == match.pci,
        not match.default_route or bool(link.get("default_route")),
    ))


# the kinds of Linux's virtual links (rtnl_link_ops .kind): netlink gives one of these as the
# driver of a device that has no bus driver in /sys
LINK_KINDS = frozenset((
    "amt bareudp batadv bond bridge can dummy erspan geneve gre gretap gtp hsr ifb ip6erspan ip6gre "
    "ip6gretap ip6tnl ipip ipoib ipvlan ipvtap lowpan macsec macvlan macvtap netkit nlmon pfcp rmnet "
    "sit team tun vcan veth vrf vti vti6 vxcan vxlan wireguard wwan xfrm virt_wifi").split())


def could_match(rules):
    """A test on what /sys shows of a device (name, current MAC, driver, PCI address) that is False
    only where no rule can match it: a key /sys cannot settle (the permanent MAC, a virtual
    device's kind where the rule names a link kind, the default route) counts as a possible match."""
    def test(dev: dict) -> bool:
        for r in rules:
            m = r.match
            if m.name and not _name(m.name, dev["name"]):
                continue
            if m.driver and dev["driver"] is not None and dev["driver"] != m.driver:
                continue
            if m.driver and dev["driver"] is None and m.driver not in LINK_KINDS:
                continue   # a bus driver's name is never a virtual link's kind
            if m.pci and dev["pci"] != m.pci:
                continue
            return True
        return False
    return test


def _set(v) -> bool:
    return v not in (None, {}, "")


def _keys(rule, attr) -> dict:
    """The keys a rule sets under attr: {key: value}."""
    v = getattr(rule, attr)
    if not _set(v):
        return {}
    if isinstance(v, dict):
        return dict(v)
    if dataclasses.is_dataclass(v):
        return {k: x for k, x in vars(v).items() if x is not None}
    return {attr: v}


def _where(profile, rule) -> str:
    return f"{getattr(profile, 'path', '') or '<profile>'}:{rule.line}"


def _merged(profile, attr, rules, link):
    """One rule for this link carrying every key the matching rules set under attr."""
    have: dict = {}
    by: dict = {}
    for r in rules:
        for k, v in _keys(r, attr).items():
            if k in have and have[k] != v:
                first = by[k]
                key = attr if k == attr else f"{attr}.{k}"
                raise ProfileError(
                    f"{_where(profile, first)}: network.interfaces: the rules at lines {first.line} and "
                    f"{r.line} both match {link['name']} and set {key} differently ({have[k]!r} and {v!r})")
            have[k], by[k] = v, by.get(k, r)
    first = rules[0]
    if len(rules) == 1:
        return first
    cur = getattr(first, attr)
    if isinstance(cur, dict):
        val = have
    elif dataclasses.is_dataclass(cur):
        val = type(cur)(**have)
    else:
        val = have[attr]
    return dataclasses.replace(first, **{attr: val}, optional=all(r.optional for r in rules))


def matched(profile, links: list[dict], attrs) -> list[dict]:
    """The links some rule that sets one of `attrs` matches, each once."""
    rules = [r for r in profile.network.interfaces if any(_set(getattr(r, a)) for a in attrs)]
    return [ln for ln in links if any(matches(r.match, ln) for r in rules)]


def resolve(sub, links: list[dict], attr: str):
    """(rule, link) pairs, one per link, for the rules that set `attr` (merged where several
    match one link); and a result for each such rule that matches nothing."""
    rules = [r for r in sub.profile.network.interfaces if _set(getattr(r, attr))]
    pairs, missing = [], []
    for rule in rules:
        if not any(matches(rule.match, ln) for ln in links):
            want = getattr(rule, attr)
            if dataclasses.is_dataclass(want):
                want = {k: v for k, v in vars(want).items() if v is not None}
            missing.append(sub.result(f"match {rule.match.describe()}", attr, None, want,
                                      OK if rule.optional else UNSUPPORTED, "no interface on this host matches",
                                      required=not rule.optional))
    for ln in links:
        mine = [r for r in rules if matches(r.match, ln)]
        if mine:
            pairs.append((_merged(sub.profile, attr, mine, ln), ln))
    return pairs, missing


# ---------------------------------------------------------------- identity
def identity(link: dict) -> dict:
    """What a saved original names its device by: the name, and the permanent MAC inside this
    network namespace (the current MAC where the device has none, as veth)."""
    return {"name": link["name"], "perm_mac": link.get("perm_mac") or None, "mac": link.get("mac") or ""}


def same_device(ident: dict, link: dict) -> bool:
    if link is None or link["name"] != ident["name"]:
        return False
    if ident.get("perm_mac"):
        return link.get("perm_mac") == ident["perm_mac"]
    return not link.get("perm_mac") and link.get("mac") == ident.get("mac")


def find(net, data: dict, what: str) -> dict:
    """The live link a saved change belongs to, read now; TargetGone when it is gone or replaced."""
    ident = data.get("identity")
    if not isinstance(ident, dict) or not isinstance(ident.get("name"), str):
        raise StateError(f"{what}: the saved entry names no device identity")
    ln = net.link(ident["name"])
    addr = ident.get("perm_mac") or ident.get("mac")
    if ln is None:
        raise TargetGone(f"{ident['name']}: {what}: the device is gone (was {addr}); its original is kept "
                         "until it returns or 'rollback --forget'")
    if not same_device(ident, ln):
        now = ln.get("perm_mac") or ln.get("mac")
        raise TargetGone(f"{ident['name']}: {what}: the device was replaced ({addr} then, {now} now); "
                         "not touched, its original is kept until it returns or 'rollback --forget'")
    return ln
