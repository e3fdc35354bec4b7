"""The checks a saved entry's fields pass (tune/settings.py and each subsystem's setting types):
strings without control characters, bounded numbers, interface names, paths. Each raises
ValueError naming the field.

>>> integer(9000, "desired", 68, 65535)
>>> SettingType("sysctl.key", "sysctl", lambda c: None).version
1
"""
from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from typing import Callable

VERSION = 1
_CTRL = re.compile("[\x00-\x08\x0a-\x1f\x7f]")           # tab is allowed, line breaks are not
_IFNAME_BAD = re.compile(r"[/:\s\x00-\x1f\x7f]")
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5,19}")
MAX_DEPTH = 8


@dataclass(frozen=True)
class SettingType:
    """One kind of saved original: its name ("sysctl.key"), the subsystem that restores it, the
    check every entry of it passes before the state file is believed, and its payload version."""
    name: str
    subsystem: str
    check: Callable
    version: int = VERSION


def fail(msg: str):
    raise ValueError(msg)


def text(v, what: str, lines: bool = False, maxlen: int = 4096, none: bool = False) -> None:
    """A string without NUL (and without line breaks or control characters unless `lines`)."""
    if v is None and none:
        return
    if not isinstance(v, str):
        fail(f"{what}: expected a string, got {type(v).__name__}")
    if len(v) > maxlen:
        fail(f"{what}: longer than {maxlen} characters")
    if "\x00" in v or (not lines and _CTRL.search(v)):
        fail(f"{what}: line breaks or control characters are not allowed")


def integer(v, what: str, lo: int, hi: int, none: bool = False) -> None:
    if v is None and none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        fail(f"{what}: expected an integer {lo}..{hi}, got {v!r}")


def number(v, what: str, lo: float, hi: float, none: bool = False) -> None:
    if v is None and none:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        fail(f"{what}: expected a number {lo:g}..{hi:g}, got {v!r}")


def boolean(v, what: str, none: bool = False) -> None:
    if v is None and none:
        return
    if not isinstance(v, bool):
        fail(f"{what}: expected true or false, got {v!r}")


def ifname(v, what: str = "target") -> None:
    """A Linux interface name (dev_valid_name: 1-15 bytes, not . or .., no '/', ':' or spaces)."""
    if not isinstance(v, str) or not 0 < len(v.encode()) < 16 or v in (".", "..") or _IFNAME_BAD.search(v):
        fail(f"{what}: {v!r} is not a valid interface name")


def plain(v, what: str, depth: int = 0) -> None:
    """Any JSON value of bounded depth whose strings carry no NUL (payload fields no check names)."""
    if depth > MAX_DEPTH:
        fail(f"{what}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(v, dict):
        for k, x in v.items():
            text(k, f"{what}: key", maxlen=256)
            plain(x, f"{what}.{k}", depth + 1)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            plain(x, f"{what}[{i}]", depth + 1)
    elif isinstance(v, str):
        text(v, what, lines=True, maxlen=1 << 20)
    elif v is not None and not isinstance(v, (bool, int, float)):
        fail(f"{what}: unexpected {type(v).__name__}")


def one_of(v, what: str, allowed) -> None:
    if v not in allowed:
        fail(f"{what}: {v!r} is not one of {', '.join(map(str, allowed))}")


def abspath(v, what: str) -> None:
    """An absolute, normalised path without '..' parts or NUL."""
    text(v, what, maxlen=4096)
    if not v.startswith("/") or os.path.normpath(v) != v or ".." in v.split("/"):
        fail(f"{what}: {v!r} is not a plain absolute path")


def identity(data: dict) -> None:
    """The device a network entry belongs to: {"name": ifname, "perm_mac": mac or None, "mac": mac}."""
    if "identity" not in data:
        return
    ident = data["identity"]
    if not isinstance(ident, dict) or set(ident) - {"name", "perm_mac", "mac"} or "name" not in ident:
        fail("data.identity: expected {name, perm_mac, mac}")
    ifname(ident["name"], "data.identity.name")
    for k in ("perm_mac", "mac"):
        mac = ident.get(k)
        if mac not in (None, "") and (not isinstance(mac, str) or not _MAC.fullmatch(mac.lower())):
            fail(f"data.identity.{k}: {mac!r} is not a MAC address")


def ip(v, what: str) -> None:
    if v is None:
        return
    try:
        ipaddress.ip_address(v)
    except ValueError:
        fail(f"{what}: {v!r} is not an IP address")
