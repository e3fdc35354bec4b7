"""Setting types: what state.json may hold, and the check each saved entry must pass.

An entry is one saved original: its setting type and payload version, the target (with the
device's identity where the subsystem records one), the key, the original and the value written,
and what the subsystem needs to restore it (`data`). An entry of an unknown type or version, or
one that fails its type's check, makes the whole state file refused before anything is written.

>>> to_entry(Change("sysctl", "host", "net.core.rmem_max", "212992", "268435456"))["type"]
'sysctl.key'
"""
from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from typing import Callable

from hkgpu_tune.core.report import Change

VERSION = 1
_CTRL = re.compile("[\x00-\x08\x0a-\x1f\x7f]")           # tab is allowed, line breaks are not
_IFNAME_BAD = re.compile(r"[/:\s\x00-\x1f\x7f]")
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5,19}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9_.@:+-]{1,128}")
_QDISC_KIND = re.compile(r"[a-z0-9_]{1,16}")
_HANDLE = re.compile(r"[0-9a-f]{1,4}:[0-9a-f]{0,4}")
MAX_DEPTH = 8


def _fail(msg: str):
    raise ValueError(msg)


def text(v, what: str, lines: bool = False, maxlen: int = 4096, none: bool = False) -> None:
    """A string without NUL (and without line breaks or control characters unless `lines`)."""
    if v is None and none:
        return
    if not isinstance(v, str):
        _fail(f"{what}: expected a string, got {type(v).__name__}")
    if len(v) > maxlen:
        _fail(f"{what}: longer than {maxlen} characters")
    if "\x00" in v or (not lines and _CTRL.search(v)):
        _fail(f"{what}: line breaks or control characters are not allowed")


def integer(v, what: str, lo: int, hi: int, none: bool = False) -> None:
    if v is None and none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        _fail(f"{what}: expected an integer {lo}..{hi}, got {v!r}")


def number(v, what: str, lo: float, hi: float, none: bool = False) -> None:
    if v is None and none:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        _fail(f"{what}: expected a number {lo:g}..{hi:g}, got {v!r}")


def boolean(v, what: str, none: bool = False) -> None:
    if v is None and none:
        return
    if not isinstance(v, bool):
        _fail(f"{what}: expected true or false, got {v!r}")


def ifname(v, what: str = "target") -> None:
    """A Linux interface name (dev_valid_name: 1-15 bytes, not . or .., no '/', ':' or spaces)."""
    if not isinstance(v, str) or not 0 < len(v.encode()) < 16 or v in (".", "..") or _IFNAME_BAD.search(v):
        _fail(f"{what}: {v!r} is not a valid interface name")


def plain(v, what: str, depth: int = 0) -> None:
    """Any JSON value of bounded depth whose strings carry no NUL (payload fields no check names)."""
    if depth > MAX_DEPTH:
        _fail(f"{what}: nested deeper than {MAX_DEPTH} levels")
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
        _fail(f"{what}: unexpected {type(v).__name__}")


def one_of(v, what: str, allowed) -> None:
    if v not in allowed:
        _fail(f"{what}: {v!r} is not one of {', '.join(map(str, allowed))}")


def abspath(v, what: str) -> None:
    """An absolute, normalised path without '..' parts or NUL."""
    text(v, what, maxlen=4096)
    if not v.startswith("/") or os.path.normpath(v) != v or ".." in v.split("/"):
        _fail(f"{what}: {v!r} is not a plain absolute path")


def identity(data: dict) -> None:
    """The device a network entry belongs to: {"name": ifname, "perm_mac": mac or None, "mac": mac}."""
    if "identity" not in data:
        return
    ident = data["identity"]
    if not isinstance(ident, dict) or set(ident) - {"name", "perm_mac", "mac"} or "name" not in ident:
        _fail("data.identity: expected {name, perm_mac, mac}")
    ifname(ident["name"], "data.identity.name")
    for k in ("perm_mac", "mac"):
        mac = ident.get(k)
        if mac not in (None, "") and (not isinstance(mac, str) or not _MAC.fullmatch(mac.lower())):
            _fail(f"data.identity.{k}: {mac!r} is not a MAC address")


def ip(v, what: str) -> None:
    if v is None:
        return
    try:
        ipaddress.ip_address(v)
    except ValueError:
        _fail(f"{what}: {v!r} is not an IP address")


# ---------------------------------------------------------------- the types
def _sysctl(c: Change) -> None:
    from hkgpu_tune.core.profile import valid_sysctl_key
    if c.target != "host":
        _fail(f"target: {c.target!r}, expected 'host'")
    text(c.key, "key", maxlen=255)
    if not valid_sysctl_key(c.key):
        _fail(f"key: {c.key!r} is not a sysctl under /proc/sys")
    from hkgpu_tune.core.sysctl_names import forbidden
    why = forbidden(c.key)   # the profile's own rule: a state file names no key a profile could not
    if why:
        _fail(f"key: {why}")
    text(c.current, "original", maxlen=1024)
    text(c.desired, "desired", maxlen=1024, none=True)
    if set(c.data) - {"identity"}:
        _fail(f"data: unexpected {', '.join(sorted(set(c.data) - {'identity'}))}")


def _mtu(c: Change) -> None:
    ifname(c.target)
    one_of(c.key, "key", ("mtu",))
    integer(c.current, "original", 68, 65535)
    integer(c.desired, "desired", 68, 65535)
    integer(c.data.get("index"), "data.index", 1, 2**31 - 1, none=True)


def _route(c: Change) -> None:
    if not c.target.startswith("route "):
        _fail(f"target: {c.target!r}, expected 'route PREFIX'")
    try:
        ipaddress.ip_network(c.target[6:], strict=False)
    except ValueError:
        _fail(f"target: {c.target[6:]!r} is not an IP prefix")
    one_of(c.key, "key", ("mtu",))
    integer(c.current, "original", 68, 65535, none=True)
    integer(c.desired, "desired", 68, 65535, none=True)
    d = c.data
    for k in ("via", "gateway"):
        ip(d.get(k), f"data.{k}")
    if d.get("dev") is not None:
        ifname(d["dev"], "data.dev")
    boolean(d.get("existed"), "data.existed", none=True)
    for part in ("orig", "want"):
        r = d.get(part)
        if r is None:
            continue
        if not isinstance(r, dict):
            _fail(f"data.{part}: expected a route")
        ip(r.get("gateway"), f"data.{part}.gateway")
        if r.get("dev") is not None:
            ifname(r["dev"], f"data.{part}.dev")
        integer(r.get("mtu"), f"data.{part}.mtu", 68, 65535, none=True)
        for k in ("oif", "priority", "table", "proto", "scope", "type", "family"):
            integer(r.get(k), f"data.{part}.{k}", 0, 2**32 - 1, none=True)
        if r.get("dst") is not None and r["dst"] != c.target[6:]:
            _fail(f"data.{part}.dst: {r['dst']!r} is not the entry's prefix {c.target[6:]}")


_CHANNELS = ("rx", "tx", "other", "combined")


def _ethtool(part: str) -> Callable[[Change], None]:
    def check(c: Change) -> None:
        ifname(c.target)
        one_of(c.data.get("part"), "data.part", (part,))
        field = c.data.get("field")
        if part == "channels":
            one_of(field, "data.field", _CHANNELS)
        elif part in ("coalesce", "pause"):
            from hkgpu_tune.core.profile import COALESCE, PAUSE
            one_of(field, "data.field", tuple(COALESCE if part == "coalesce" else PAUSE))
            for k, v in (("original", c.current), ("desired", c.desired)):
                if field.startswith("adaptive") or part == "pause":
                    boolean(v, k)
                else:
                    integer(v, k, 0, 1 << 20)
            return
        else:
            text(field, "data.field", maxlen=64)
            if not re.fullmatch(r"[a-z0-9_-]{1,64}", field):
                _fail(f"data.field: {field!r} is not an ethtool name")
        if part == "offloads":
            for k, v in (("original", c.current), ("desired", c.desired)):
                if isinstance(v, dict):   # several kernel features behind one offload
                    for f, on in v.items():
                        if not re.fullmatch(r"[a-z0-9_-]{1,64}", f):
                            _fail(f"{k}: {f!r} is not a kernel feature name")
                        boolean(on, f"{k}.{f}", none=True)
                else:
                    boolean(v, k)
        else:
            integer(c.current, "original", 0, 1 << 24)
            integer(c.desired, "desired", 0, 1 << 24)
    return check


def _qdisc(c: Change) -> None:
    ifname(c.target)
    if c.key != "root" and not re.fullmatch(r"queue [0-9]{1,5}", c.key):
        _fail(f"key: {c.key!r}, expected 'root' or 'queue N'")
    text(c.current, "original", maxlen=64, none=True)
    text(c.desired, "desired", maxlen=64, none=True)
    for k, v in (("original", c.current), ("desired", c.desired)):
        if c.key != "root" and v is not None and not _QDISC_KIND.fullmatch(v):
            _fail(f"{k}: {v!r} is not a qdisc kind")
    d = c.data
    integer(d.get("index"), "data.index", 1, 2**31 - 1, none=True)
    if "parent" in d and not (isinstance(d["parent"], str) and
                              (_HANDLE.fullmatch(d["parent"]) or re.fullmatch(r"queue [0-9]{1,5}", d["parent"]))):
        _fail(f"data.parent: {d['parent']!r} is not a qdisc handle")
    orig = d.get("orig")
    if not isinstance(orig, dict):
        _fail("data.orig: expected the original qdiscs")
    root, handle, children = orig.get("root"), orig.get("root_handle"), orig.get("children", {})
    if root is not None and not (isinstance(root, str) and _QDISC_KIND.fullmatch(root)):
        _fail(f"data.orig.root: {root!r} is not a qdisc kind")
    if handle is not None and not (isinstance(handle, str) and _HANDLE.fullmatch(handle)):
        _fail(f"data.orig.root_handle: {handle!r} is not a qdisc handle")
    if not isinstance(children, dict) or len(children) > 4096:
        _fail("data.orig.children: expected handle: kind")
    for h, k in children.items():
        if not _HANDLE.fullmatch(h) or not (isinstance(k, str) and _QDISC_KIND.fullmatch(k)):
            _fail(f"data.orig.children: {h!r}: {k!r} is not a handle and a qdisc kind")


_GPU_KEYS = ("persistence", "compute_mode", "application_clocks", "power_limit_w")


def _gpu(c: Change) -> None:
    text(c.target, "target", maxlen=64)
    one_of(c.key, "key", _GPU_KEYS)
    integer(c.data.get("index"), "data.index", 0, 1023)
    text(c.data.get("uuid"), "data.uuid", maxlen=96, none=True)
    one_of(c.data.get("how"), "data.how", (None, "service", "nvml"))
    for k, v in (("original", c.current), ("desired", c.desired)):
        if c.key == "persistence":
            boolean(v, k, none=True)
        elif c.key == "compute_mode":
            if v is not None and not (isinstance(v, str) and re.fullmatch(r"[a-z_]{1,32}", v)):
                _fail(f"{k}: {v!r} is not a compute mode")
        elif c.key == "application_clocks":
            if v is not None:
                if not isinstance(v, dict) or set(v) - {"sm", "mem"}:
                    _fail(f"{k}: expected {{sm, mem}}")
                for f in ("sm", "mem"):
                    integer(v.get(f), f"{k}.{f}", 0, 100000, none=True)
        else:
            number(v, k, 0, 100000, none=True)


_MIG_NAME = re.compile(r"[1-8]g\.[0-9]{1,4}gb(\+[a-z]{1,8})*")


def _mig(c: Change) -> None:
    if not re.fullmatch(r"gpu[0-9]{1,4}", c.target):
        _fail(f"target: {c.target!r} is not gpuN")
    one_of(c.key, "key", ("mig_mode", "mig_devices"))
    integer(c.data.get("index"), "data.index", 0, 1023)
    text(c.data.get("uuid"), "data.uuid", maxlen=96, none=True)
    for k, v in (("original", c.current), ("desired", c.desired)):
        if c.key == "mig_mode":
            boolean(v, k)
        elif not isinstance(v, dict) or len(v) > 16:
            _fail(f"{k}: expected {{profile name: count}}")
        else:
            for name, n in v.items():
                if not _MIG_NAME.fullmatch(name):
                    _fail(f"{k}: {name!r} is not a MIG profile name")
                integer(n, f"{k}.{name}", 1, 8)


def _mps(c: Change) -> None:
    from hkgpu_tune.backends.mps import safe_root
    text(c.target, "target", maxlen=64)
    d = c.data
    if c.key in ("pipe_dir", "log_dir"):
        abspath(d.get("path"), "data.path")
        if not safe_root(d["path"]):
            _fail(f"data.path: {d['path']!r} is not a directory the tool may manage")
        integer(d.get("mode"), "data.mode", 0, 0o777)
        for k, v in (("original", c.current), ("desired", c.desired)):
            if v is not None and not (isinstance(v, str) and re.fullmatch(r"[0-7]{3,4} [A-Za-z0-9_.-]{1,32}|link|"
                                                                            r"not a directory", v)):
                _fail(f"{k}: {v!r} is not 'MODE OWNER'")
    elif c.key == "unit":
        text(d.get("unit"), "data.unit", maxlen=128)
        if not re.fullmatch(r"[A-Za-z0-9:_.@-]+\.service", d["unit"]):
            _fail(f"data.unit: {d['unit']!r} is not a service unit name")
        text(d.get("old"), "data.old", lines=True, maxlen=1 << 20, none=True)
        one_of(c.current, "original", (None, "differs"))
        text(c.desired, "desired", lines=True, maxlen=1 << 20, none=True)
        from hkgpu_tune.subsystems.mps import unit_is_rendered
        if d.get("old") is not None and not unit_is_rendered(d["old"]):   # the text rollback writes back
            _fail("data.old: not a unit hkgpu-tune renders for any mps section: refused")
    elif c.key == "daemon":
        one_of(c.current, "original", ("running", "stopped"))
        one_of(c.desired, "desired", ("running", "stopped"))
        boolean(d.get("systemd"), "data.systemd", none=True)
    elif c.key == "running_daemon":   # a restart; its original is what the daemon ran with
        text(c.current, "original", maxlen=1024, none=True)
        one_of(c.desired, "desired", ("restarted",))
        boolean(d.get("systemd"), "data.systemd", none=True)
    elif c.key == "default_active_thread_percentage":
        number(c.current, "original", 0, 100, none=True)
        number(c.desired, "desired", 0, 100, none=True)
    elif c.key == "default_pinned_mem_limit":
        integer(d.get("device"), "data.device", 0, 1023)
        for k, v in (("original", c.current), ("desired", c.desired)):
            if v is not None and not (isinstance(v, str) and re.fullmatch(r"[0-9A-Za-z.]{1,32}", v)):
                _fail(f"{k}: {v!r} is not a memory size")
    else:
        _fail(f"key: {c.key!r} is not an MPS setting")


def _affinity(c: Change) -> None:
    from hkgpu_tune.subsystems.affinity import IRQBALANCE_FILES
    text(c.target, "target", maxlen=256)
    d = c.data
    if c.key == "smp_affinity_list":
        integer(d.get("irq"), "data.irq", 0, 1 << 20)
        for k, v in (("original", c.current), ("desired", c.desired)):
            if not (isinstance(v, str) and re.fullmatch(r"[0-9,-]{1,8192}", v)):
                _fail(f"{k}: {v!r} is not a CPU list")
    elif c.key == "banned_irqs":
        one_of(d.get("file"), "data.file", IRQBALANCE_FILES)
        text(d.get("old"), "data.old", lines=True, maxlen=1 << 20, none=True)
        boolean(d.get("running"), "data.running", none=True)
        if not isinstance(c.current, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                      for i in c.current):
            _fail("original: expected a list of interrupt numbers")
        text(c.desired, "desired", lines=True, maxlen=1 << 20, none=True)
    else:
        _fail(f"key: {c.key!r} is not an affinity setting")


def _triton(c: Change) -> None:
    text(c.target, "target", maxlen=4096)
    one_of(c.key, "key", ("repository", "unit", "served_config", "service", "command"))
    if "unit" in c.data:   # the service of several (triton.services) the change belongs to
        u = c.data["unit"]
        from hkgpu_tune.serve.config import UNIT_RE   # the profile's own rule for a unit name
        if not (isinstance(u, str) and re.fullmatch(UNIT_RE, u)):
            _fail(f"data.unit: {u!r} is not a unit name")
    if c.key == "repository":
        m = c.data.get("model")
        if not (isinstance(m, str) and _NAME.fullmatch(m)) or m in (".", ".."):
            _fail(f"data.model: {m!r} is not a model name")
        if "model_dir" in c.data:  # paths rollback moves and removes (triton/redeploy.py)
            from hkgpu_tune.core.errors import StateError
            from hkgpu_tune.serve.redeploy import check_record
            try:
                check_record(c.data)
            except StateError as e:
                _fail(str(e))
    if c.key == "unit" and c.data.get("before") is not None:   # the text rollback writes back
        from hkgpu_tune.core.errors import HkError
        from hkgpu_tune.serve.shapes import check_unit_text
        try:
            check_unit_text(c.data["before"])
        except HkError as e:
            _fail(str(e))
    if c.key == "command":   # a respawn record: only a Triton server command (serve.records)
        from hkgpu_tune.core.errors import HkError
        from hkgpu_tune.serve.records import check_record
        try:
            check_record(c.data.get("before"))
        except HkError as e:
            _fail(str(e))
    plain(c.current, "original")
    plain(c.desired, "desired")


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


@dataclass(frozen=True)
class SettingType:
    name: str
    subsystem: str
    check: Callable[[Change], None]
    version: int = VERSION


REGISTRY = {t.name: t for t in (
    SettingType("sysctl.key", "sysctl", _sysctl),
    SettingType("link.mtu", "link", _mtu),
    SettingType("link.route", "link", _route),
    SettingType("ethtool.channels", "ethtool", _ethtool("channels")),
    SettingType("ethtool.rings", "ethtool", _ethtool("rings")),
    SettingType("ethtool.offload", "ethtool", _ethtool("offloads")),
    SettingType("ethtool.coalesce", "ethtool", _ethtool("coalesce")),
    SettingType("ethtool.pause", "ethtool", _ethtool("pause")),
    SettingType("qdisc.queue", "qdisc", _qdisc),
    SettingType("gpu.attr", "gpu", _gpu),
    SettingType("mig.layout", "mig", _mig),
    SettingType("mps.param", "mps", _mps),
    SettingType("affinity.irq", "affinity", _affinity),
    SettingType("triton.service", "triton", _triton),
    SettingType("persist.file", "persist", _persist),
)}
_NETWORK = ("link", "ethtool", "qdisc")


def type_of(c: Change) -> str:
    """The setting type of a Change (ValueError for one no type covers)."""
    s = c.subsystem
    if s == "link":
        return "link.route" if str(c.target).startswith("route ") else "link.mtu"
    if s == "ethtool":
        part = c.data.get("part") if isinstance(c.data, dict) else None
        t = {"channels": "ethtool.channels", "rings": "ethtool.rings", "offloads": "ethtool.offload",
             "coalesce": "ethtool.coalesce", "pause": "ethtool.pause"}.get(part)
        if t:
            return t
        _fail(f"data.part: {part!r} is not channels, rings, offloads, coalesce or pause")
    for t in REGISTRY.values():
        if t.subsystem == s:
            return t.name
    _fail(f"subsystem {s!r} has no setting type")


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
    if c.subsystem in _NETWORK:
        identity(c.data)
        for k, v in c.data.items():
            if k not in ("identity",):
                plain(v, f"data.{k}")
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
    REGISTRY[t].check(c)
    return t


def to_entry(c: Change) -> dict:
    t = validate(c)
    return {"type": t, "version": REGISTRY[t].version, "subsystem": c.subsystem, "target": c.target,
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
    t = REGISTRY.get(e["type"]) if isinstance(e["type"], str) else None
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
