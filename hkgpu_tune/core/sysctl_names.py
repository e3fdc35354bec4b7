"""Is a sysctl name a misspelling? A name this kernel has, or one Linux is known to have had
(data/sysctl-names.txt), is a name; one that is neither but close to a known one is a profile
error ("no such sysctl ...; did you mean ..."); one far from every known name is left to the host
(`unsupported` where its kernel lacks it: a module's or a newer kernel's setting).

>>> misspelt("net.core.rmem_mx")
'net.core.rmem_max'
>>> misspelt("net.ipv4.conf.ens1f0np0.rp_filter") is None
True
"""
from __future__ import annotations

import difflib
import functools
import os
import re
from pathlib import Path

NAMES_FILE = Path(__file__).resolve().parent.parent / "data" / "sysctl-names.txt"
# per-interface trees: the interface's name is any name; compare as "default"
PER_IF = re.compile(r"(net\.(?:ipv4|ipv6|mpls)\.(?:conf|neigh))\.([^.]+)\.(.+)")
CUTOFF = 0.9


@functools.lru_cache(maxsize=1)
def known() -> frozenset:
    try:
        text = NAMES_FILE.read_text()
    except OSError:
        return frozenset()
    return frozenset(ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#"))


def normalise(key: str) -> str:
    m = PER_IF.fullmatch(key)
    return f"{m.group(1)}.default.{m.group(3)}" if m else key


def misspelt(key: str, proc: str = "/proc/sys") -> str | None:
    """The known name `key` was probably meant to be, or None (a name, or nothing close)."""
    names = known()
    norm = normalise(key)
    if norm in names or os.path.exists(os.path.join(proc, *key.split("."))) \
            or os.path.exists(os.path.join(proc, *norm.split("."))):
        return None
    near = difflib.get_close_matches(norm, names, n=1, cutoff=CUTOFF)
    if not near:
        return None
    m = PER_IF.fullmatch(key)
    if m and PER_IF.fullmatch(near[0]):   # say it with the profile's own interface name
        return f"{m.group(1)}.{m.group(2)}.{PER_IF.fullmatch(near[0]).group(3)}"
    return near[0]
