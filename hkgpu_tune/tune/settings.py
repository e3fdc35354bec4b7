"""Setting types: what state.json may hold, and the check each saved entry must pass.

An entry is one saved original: its setting type and payload version, the target (with the
device's identity where the subsystem records one), the key, the original and the value written,
and what the subsystem needs to restore it (`data`). An entry of an unknown type or version, or
one that fails its type's check, makes the whole state file refused before anything is written.

>>> to_entry(Change("sysctl", "host", "net.core.rmem_max", "212992", "268435456"))["type"]
'sysctl.key'
"""
from __future__ import annotations

import re

from hkgpu_tune import subsystems
from hkgpu_tune.core.fields import SettingType, abspath, fail as _fail, integer, plain, text
from hkgpu_tune.core.report import Change

_HEX64 = re.compile(r"[0-9a-f]{64}")


# ---------------------------------------------------------------- the types


























# the files `apply --persist` writes, by the end of their path (any --root before it)
PERSIST_FILES = ("*/etc/sysctl.d/60-hkgpu-tune.conf", "*/etc/hkgpu-tune/profile.yaml",
                 "*/etc/systemd/system/hkgpu-tune.service",
                 "*/etc/systemd/system/multi-user.target.wants/hkgpu-tune.service",
                 "*/etc/netplan/60-hkgpu-tune.yaml", "*/etc/systemd/network/*.network.d/60-hkgpu-tune.conf",
                 "*/etc/NetworkManager/system-connections/*.nmconnection")


def _sha(v, what: str) -> None:
    if not (isinstance(v, str) and _HEX64.fullmatch(v)):
        _fail(f"{what}: expected a sha256 hex digest")


def _persist(c: Change) -> None:
    import fnmatch
    abspath(c.target, "target")
    if c.key == "dir":
        if "/etc/" not in c.target + "/":
            _fail(f"target: {c.target!r} is not a directory under etc/")
        if c.current is not None or c.desired is not None:
            _fail("a made directory has no original or content")
    elif c.key in ("file", "link"):
        if not any(fnmatch.fnmatchcase(c.target, p) for p in PERSIST_FILES):
            _fail(f"target: {c.target!r} is not a file apply --persist writes")
        if c.current is not None:
            if not isinstance(c.current, dict) or not {"backup", "sha256"} <= set(c.current) <= \
                    {"backup", "sha256", "mode"}:
                _fail("original: expected {backup, sha256, mode} or null")
            abspath(c.current["backup"], "original.backup")
            _sha(c.current["sha256"], "original.sha256")
            integer(c.current.get("mode", 0o644), "original.mode", 0, 0o7777)
        if not isinstance(c.desired, dict):
            _fail("desired: expected what the tool wrote")
        if c.key == "file":
            hs = c.desired.get("sha256")
            if not isinstance(hs, list) or not 0 < len(hs) <= 16:
                _fail("desired.sha256: expected the list of contents the tool wrote")
            for h in hs:
                _sha(h, "desired.sha256")
        else:
            abspath(c.desired.get("target"), "desired.target")
    else:
        _fail(f"key: {c.key!r}, expected file, link or dir")
    if c.data:
        _fail("data: a persisted file carries none")


PERSIST_TYPE = SettingType("persist.file", "persist", _persist)


def registry() -> dict[str, SettingType]:
    """Every setting type by name: each subsystem's (its SPEC.types), and the files of --persist."""
    out = {t.name: t for s in subsystems.specs() for t in s.types}
    out[PERSIST_TYPE.name] = PERSIST_TYPE
    return out


def type_of(c: Change) -> str:
    """The setting type of a Change (ValueError for one no type covers)."""
    if c.subsystem == "persist":
        return PERSIST_TYPE.name
    s = next((s for s in subsystems.specs() if s.name == c.subsystem), None)
    if s is None or not s.types:
        _fail(f"subsystem {c.subsystem!r} has no setting type")
    return s.type_of(c)


def validate(c: Change) -> str:
    """Check a Change against its type; returns the type name, raises ValueError naming the field."""
    for f in ("subsystem", "target", "key"):
        text(getattr(c, f), f, maxlen=4096)
    if not isinstance(c.data, dict):
        _fail("data: expected an object")
    plain(c.data, "data")
    plain(c.current, "original")
    plain(c.desired, "desired")
    t = type_of(c)
    if "where" in c.data:   # core.place: the host and network namespace the original was read in
        w = c.data["where"]
        if not (isinstance(w, dict) and set(w) <= {"host", "netns", "netns_id", "init"}
                and isinstance(w.get("host", ""), str)
                and re.fullmatch(r"[0-9a-fA-F]{0,64}", w.get("host", "")) and
                (w.get("netns") is None or isinstance(w["netns"], int) and not isinstance(w["netns"], bool))
                and (w.get("netns_id") is None or isinstance(w["netns_id"], str)
                     and re.fullmatch(r"[0-9a-f-]{1,64}:[0-9]{1,20}", w["netns_id"]))
                and isinstance(w.get("init", False), bool)):
            _fail("data.where: expected {host: machine id, netns: inode, netns_id: boot id:cookie, init}")
        import dataclasses
        c = dataclasses.replace(c, data={k: v for k, v in c.data.items() if k != "where"})
    registry()[t].check(c)   # a network entry's check includes data.identity
    return t


def to_entry(c: Change) -> dict:
    t = validate(c)
    return {"type": t, "version": registry()[t].version, "subsystem": c.subsystem, "target": c.target,
            "key": c.key, "original": c.current, "desired": c.desired, "data": c.data,
            "applied": bool(c.applied)}


_ENTRY_KEYS = {"type", "version", "subsystem", "target", "key", "original", "desired", "data", "applied"}


def from_entry(e) -> Change:
    """A saved entry back as a Change, after its type's check (ValueError otherwise)."""
    if not isinstance(e, dict):
        _fail("not an object")
    extra = set(e) - _ENTRY_KEYS
    if extra:
        _fail(f"unexpected field(s) {', '.join(sorted(map(str, extra)))}")
    missing = {"type", "version", "subsystem", "target", "key", "original", "desired", "data"} - set(e)
    if missing:
        _fail(f"missing field(s) {', '.join(sorted(missing))}")
    t = registry().get(e["type"]) if isinstance(e["type"], str) else None
    if t is None:
        _fail(f"unknown setting type {e['type']!r}")
    if e["version"] != t.version or isinstance(e["version"], bool):
        _fail(f"payload version {e['version']!r} of {t.name} is not one this version reads ({t.version})")
    if e["subsystem"] != t.subsystem:
        _fail(f"subsystem {e['subsystem']!r} does not go with type {t.name}")
    c = Change(e["subsystem"], e["target"], e["key"], e["original"], e["desired"], e["data"],
               applied=bool(e.get("applied")))
    if validate(c) != t.name:
        _fail(f"the entry is not a {t.name}")
    return c


def from_v1(d) -> Change:
    """A format-1 change (no type): converted, then checked like any entry."""
    if not isinstance(d, dict):
        _fail("not an object")
    for k in ("subsystem", "target", "key"):
        if not isinstance(d.get(k), str):
            _fail(f"{k}: missing or not a string")
    c = Change(d["subsystem"], d["target"], d["key"], d.get("current"), d.get("desired"),
               d.get("data") if d.get("data") is not None else {}, applied=bool(d.get("applied")))
    if c.subsystem == "persist":
        _fail("persist records are not in format 1")
    validate(c)
    return c


def describe(e) -> str:
    """' (type target key)' for an error line, from whatever the entry holds."""
    if not isinstance(e, dict):
        return ""
    parts = [str(e.get(k))[:80] for k in ("type", "subsystem", "target", "key") if isinstance(e.get(k), str)]
    return f" ({' '.join(parts)})" if parts else ""
