"""Where a setting lives: the host (machine id), the network namespace for settings that exist
per namespace (its inode for people; its identity: the boot id and the namespace's cookie,
SO_NETNS_COOKIE, which the kernel never reuses within a boot, where an inode is reused as soon as a
namespace is gone), and the device (permanent MAC, else MAC, from the change's identity; a
GPU's UUID).
Apply records it with every original; an original recorded somewhere else is a separate setting
(a replaced device or another namespace gets its own originals) and rollback never writes it
here: it is reported and kept.

>>> sorted(here())
['host', 'init', 'netns', 'netns_id']
"""
from __future__ import annotations

import os

from hkgpu_tune.core.errors import TargetGone

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


SO_NETNS_COOKIE = 71    # asm-generic/socket.h, Linux 5.14


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read(64).strip()
    except OSError:
        return ""


def netns_id() -> str:
    """BOOT_ID:COOKIE for this network namespace, unique for as long as the machine runs; '' where
    the kernel has no cookie (before 5.14)."""
    import socket
    import struct
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            cookie = struct.unpack("Q", s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8))[0]
    except OSError:
        return ""
    b = boot_id()
    return f"{b}:{cookie}" if b else ""


def initial_netns() -> bool:
    """Whether this is the host's own network namespace (PID 1's): the one that outlives a reboot."""
    try:
        return os.stat("/proc/1/ns/net").st_ino == netns()
    except OSError:
        return False


def here() -> dict:
    return {"host": machine_id(), "netns": netns(), "netns_id": netns_id(), "init": initial_netns()}


def scope(c, per_netns: bool, now: dict | None = None) -> dict:
    """The place of change c: host always, netns for a per-namespace setting (which settings are
    is each subsystem's to say: its SPEC.netns)."""
    now = now or here()
    if not per_netns:
        return {"host": now["host"]}
    w = {"host": now["host"], "netns": now["netns"], "init": bool(now.get("init"))}
    if now.get("netns_id"):
        w["netns_id"] = now["netns_id"]
    return w


def stamp(changes, per_netns, now: dict | None = None) -> None:
    """Record the place of each change (not the files of --persist: those name their own path);
    per_netns(c): whether c's setting lives in one network namespace."""
    now = now or here()
    for c in changes:
        if c.subsystem != "persist" and isinstance(c.data, dict):
            c.data["where"] = scope(c, per_netns(c), now)


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
    ns = w.get("netns_id") or ("initial" if w.get("init") else w.get("netns"))
    return (str(w.get("host", "")), ns, mac)


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
    if w.get("netns") is None and not w.get("netns_id"):
        return   # not a per-namespace setting
    if w.get("netns_id") and w["netns_id"] == now.get("netns_id"):
        return
    if w.get("init") and now.get("init"):
        return   # the host's own namespace, also after a reboot (a new boot id and cookie)
    if not w.get("netns_id") and now.get("init") and w.get("netns") == now["netns"]:
        return   # recorded before namespaces had an identity: honoured in the initial namespace only
    why = ("recorded without a namespace identity outside the host's own namespace" if not w.get("netns_id")
           else f"recorded in another network namespace (id {w['netns_id']}, this one {now.get('netns_id') or '?'})")
    raise TargetGone(f"{why} (netns inode {w.get('netns')}, this one {now['netns']}): not touched, its original "
                     "is kept; run rollback in that namespace")
