"""Where a setting lives: the host (machine id), the network namespace (its inode) for settings
that exist per namespace, and the device (permanent MAC, else MAC, from the change's identity; a
GPU's UUID).
Apply records it with every original; an original recorded somewhere else is a separate setting
(a replaced device or another namespace gets its own originals) and rollback never writes it
here: it is reported and kept.

>>> sorted(here())
['host', 'netns']
"""
from __future__ import annotations

import os

from hkgpu_tune.core.errors import TargetGone

# subsystems whose settings belong to one network namespace (sysctl: the net.* keys)
NETNS_SUBSYSTEMS = ("link", "ethtool", "qdisc")


def machine_id() -> str:
    for p in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(p) as f:
                v = f.read(64).strip()
        except OSError:
            continue
        if v:
            return v
    return ""


def netns() -> int:
    return os.stat("/proc/self/ns/net").st_ino


def here() -> dict:
    return {"host": machine_id(), "netns": netns()}


def _netns_scoped(c) -> bool:
    return c.subsystem in NETNS_SUBSYSTEMS or (c.subsystem == "sysctl" and str(c.key).startswith("net."))


def scope(c, now: dict | None = None) -> dict:
    """The place of change c: host always, netns for a per-namespace setting."""
    now = now or here()
    return {"host": now["host"], **({"netns": now["netns"]} if _netns_scoped(c) else {})}


def stamp(changes, now: dict | None = None) -> None:
    """Record the place of each change (not the files of --persist: those name their own path)."""
    now = now or here()
    for c in changes:
        if c.subsystem != "persist" and isinstance(c.data, dict):
            c.data["where"] = scope(c, now)


def device(data) -> str:
    """The device a change names (a NIC's permanent MAC, else MAC; a GPU's UUID), or ''."""
    if not isinstance(data, dict):
        return ""
    dev = data.get("identity")
    if isinstance(dev, dict):
        return dev.get("perm_mac") or dev.get("mac") or ""
    return data["uuid"] if isinstance(data.get("uuid"), str) else ""


def key(data) -> tuple:
    """The part of a change's identity beyond (subsystem, target, key)."""
    w = (data.get("where") if isinstance(data, dict) else None) or {}
    mac = device(data)
    if not w and not mac:
        return ()
    return (str(w.get("host", "")), w.get("netns"), mac)


def same_setting(saved, c) -> bool:
    """Whether a saved entry is c's: the same setting in the same place; an entry saved before
    places were kept, by name and device."""
    if saved.setting == c.setting:
        return True
    old = not (isinstance(saved.data, dict) and saved.data.get("where"))
    return old and saved.ident == c.ident and device(saved.data) == device(c.data)


def check(c, now: dict | None = None) -> None:
    """TargetGone when c was recorded on another host or in another network namespace."""
    w = c.data.get("where") if isinstance(c.data, dict) else None
    if not w:
        return   # recorded before places were kept
    now = now or here()
    if w.get("host") and now["host"] and w["host"] != now["host"]:
        raise TargetGone(f"recorded on another host (machine id {w['host']}, this one {now['host']}): "
                         "not touched, its original is kept")
    if w.get("netns") is not None and w["netns"] != now["netns"]:
        raise TargetGone(f"recorded in another network namespace (netns inode {w['netns']}, this one "
                         f"{now['netns']}): not touched, its original is kept; run rollback in that namespace")
