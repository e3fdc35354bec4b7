"""YAML profile -> typed, validated objects. Every error names file:line and the key path.

>>> p = load_profile(default_profile_path())
>>> p.network.interfaces[0].mtu
9000
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hkgpu_tune.core import sections
from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.fsutil import FileRefused, read_regular
from hkgpu_tune.core.yamlnode import (MAX_BYTES, Node, _BAD_CHAR, _Loader, check_tree)

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"
DEFAULT_PROFILE = "hk-inference"


def default_profile_path() -> Path:
    return PROFILE_DIR / f"{DEFAULT_PROFILE}.yaml"


def shipped_profiles() -> list[str]:
    return sorted(f.stem for f in PROFILE_DIR.glob("*.yaml"))


# Which profile a command uses when none is named: --profile > $HKGPU_TUNE_PROFILE > the node's
# profile the roles write > the one `apply --persist` writes > the shipped default.
ENV_PROFILE = "HKGPU_TUNE_PROFILE"
ENV_ETC_DIR = "HKGPU_TUNE_ETC_DIR"         # tests and chroots: where node.yaml and profile.yaml are
ETC_DIR = "/etc/hkgpu-tune"
NODE_FILE = "node.yaml"                    # roles: hkgpu_profile_path
PERSIST_FILE = "profile.yaml"              # persist.PROFILE_FILE
SOURCES = {"--profile": "--profile", ENV_PROFILE: ENV_PROFILE, "node": "node profile",
           "persist": "persisted by apply --persist", "default": "shipped default",
           "none": "unreadable: the state file alone"}


def etc_dir() -> Path:
    return Path(os.environ.get(ENV_ETC_DIR) or ETC_DIR)


@dataclass(frozen=True)
class ProfileChoice:
    path: Path
    source: str            # a key of SOURCES
    system: bool = False   # found in etc_dir(): root reads it only when root owns it


def choose_profile(name: str | os.PathLike | None = None) -> ProfileChoice:
    """The profile a command uses, and why.

    >>> choose_profile("hk-latency").source
    '--profile'
    """
    if name:
        return ProfileChoice(resolve_profile(name), "--profile")
    env = os.environ.get(ENV_PROFILE)
    if env is not None:
        if not env.strip():
            raise ProfileError(f"{ENV_PROFILE} is set but empty: unset it or name a profile")
        return ProfileChoice(resolve_profile(env), ENV_PROFILE)
    for file, source in ((NODE_FILE, "node"), (PERSIST_FILE, "persist")):
        p = etc_dir() / file
        if os.path.lexists(p):   # a dangling link is an error below, not a silent fall-through
            return ProfileChoice(p, source, system=True)
    return ProfileChoice(default_profile_path(), "default")


def load_chosen(name: str | os.PathLike | None = None) -> "Profile":
    """load_profile() of choose_profile(name); the Profile carries its source."""
    c = choose_profile(name)
    if c.system:
        _check_dir(c.path.parent)
    text = read_profile_file(c.path, system=c.system)
    prof = parse_profile_text(text, c.path.name if c.source == "default" else str(c.path))
    prof.source = c.source
    return prof


def _check_dir(d: Path) -> None:
    """As root: the directory of a system profile must be root's and closed to others."""
    if os.geteuid() != 0:
        return
    try:
        st = os.stat(d)
    except OSError as e:
        raise ProfileError(f"{d}: cannot read: {e.strerror}") from None
    _check_owner(str(d), st, "directory", "chmod 755")


def _check_owner(p: str, st: os.stat_result, what: str, fix: str) -> None:
    if st.st_uid != 0:
        raise ProfileError(f"{p}: refused: the {what} is owned by uid {st.st_uid}, not root "
                           f"(root reads a profile from {etc_dir()} only when root owns it: chown root:root, {fix})")
    if st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != 0):
        raise ProfileError(f"{p}: refused: the {what} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}; "
                           f"{fix})")


def resolve_profile(name: str | os.PathLike | None) -> Path:
    """A bare name ('hk-inference': no '/', no .yaml or .yml suffix) is a shipped profile;
    anything else (a Path, a name with a '/' or a suffix) names a file."""
    if not name:
        return default_profile_path()
    if _BAD_CHAR.search(os.fspath(name)):
        raise ProfileError(f"{os.fspath(name)!r}: a profile path with a line break or control character")
    if isinstance(name, os.PathLike):
        return Path(name)
    if "/" in name or os.path.splitext(name)[1]:
        return Path(name)
    if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name) and (PROFILE_DIR / f"{name}.yaml").is_file():
        return PROFILE_DIR / f"{name}.yaml"
    raise ProfileError(f"{name!r}: no shipped profile of that name (shipped: {', '.join(shipped_profiles())}); "
                       f"a file needs a '/' or a .yaml suffix, e.g. ./{name}.yaml")




# Linux: at most 15 bytes, not '.' or '..', no '/', ':' or whitespace (net/core/dev.c dev_valid_name)
IFNAME_RE = r"(?!\.{1,2}$)[^/:\s]{1,15}"
MAC_RE = r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}"
PCI_RE = r"([0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"


# ---------------------------------------------------------------- network section
@dataclass(frozen=True)
class Match:
    name: str | None = None
    mac: str | None = None
    driver: str | None = None
    pci: str | None = None
    default_route: bool | None = None   # None: either; False: only links without the default route

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in (("name", self.name), ("mac", self.mac),
                                         ("driver", self.driver), ("pci", self.pci)) if v]
        if self.default_route is not None:
            parts.append("default_route" if self.default_route else "not default_route")
        return ",".join(parts)


@dataclass(frozen=True)
class Channels:
    combined: int | str | None = None
    rx: int | str | None = None
    tx: int | str | None = None


@dataclass(frozen=True)
class Rings:
    rx: int | str | None = None
    tx: int | str | None = None


OFFLOADS = ("gro", "gso", "tso", "lro", "rx_checksum", "tx_checksum", "sg", "rxhash")


@dataclass(frozen=True)
class Interface:
    match: Match
    mtu: int | None = None
    channels: Channels | None = None
    rings: Rings | None = None
    offloads: dict[str, bool] = field(default_factory=dict)
    qdisc: str | None = None
    coalesce: dict = field(default_factory=dict)   # subsystems/ethtool.py COALESCE keys
    pause: dict = field(default_factory=dict)      # {rx, tx, autoneg}: bools
    speed_mbit: int | None = None                  # expected link speed: below it is drift
    optional: bool = False   # no interface matched: ok instead of error
    line: int = 0


@dataclass(frozen=True)
class WanPeer:
    address: str
    name: str = ""
    rtt_ms: float | None = None
    jitter_ms: float | None = None      # the alert threshold for this peer's jitter


@dataclass(frozen=True)
class WanRoute:
    prefix: str
    mtu: int = 1500
    via: str | None = None
    dev: str | None = None


@dataclass(frozen=True)
class Network:
    interfaces: list[Interface] = field(default_factory=list)
    fabric_peers: list[str] = field(default_factory=list)
    wan_peers: list[WanPeer] = field(default_factory=list)
    wan_routes: list[WanRoute] = field(default_factory=list)
    probe_gateway: bool = True
    probe_count: int = 2
    probe_timeout_s: float = 1.0


QDISCS = ("fq_codel", "fq", "cake", "pfifo_fast", "pfifo", "sfq", "codel")


def parse_network(n: Node) -> Network:
    m = n.mapping(("interfaces", "fabric_peers", "wan_peers", "wan_routes", "probe"))
    ifaces = []
    for item in (m["interfaces"].items() if "interfaces" in m else []):
        f = item.mapping(("match", "mtu", "channels", "rings", "offloads", "qdisc", "coalesce", "pause", "speed_mbit",
                          "optional"), required=("match",))
        mm = f["match"].mapping(("name", "mac", "driver", "pci", "default_route"))
        if not mm:
            raise f["match"].error("expected at least one of name, mac, driver, pci, default_route")
        match = Match(
            name=mm["name"].string(IFNAME_RE, "an interface name (1-15 characters, no '/', ':' or spaces)") if "name" in mm else None,
            mac=mm["mac"].string(MAC_RE, "a MAC address like 0c:42:a1:00:00:01").lower() if "mac" in mm else None,
            driver=mm["driver"].string(r"[A-Za-z0-9_.-]{1,32}", "a driver name") if "driver" in mm else None,
            pci=mm["pci"].string(PCI_RE, "a PCI address like 0000:3b:00.0").lower() if "pci" in mm else None,
            default_route=mm["default_route"].boolean() if "default_route" in mm else None,
        )
        if match.pci and len(match.pci) == 7:
            match = Match(match.name, match.mac, match.driver, "0000:" + match.pci, match.default_route)
        ch = rings = None
        if "channels" in f:
            c = f["channels"].mapping(("combined", "rx", "tx"))
            ch = Channels(**{k: v.int_or_max(1, 4096) for k, v in c.items()})
        if "rings" in f:
            r = f["rings"].mapping(("rx", "tx"))
            rings = Rings(**{k: v.int_or_max(1, 1 << 16) for k, v in r.items()})
        offloads = {}
        if "offloads" in f:
            for k, v in f["offloads"].mapping(OFFLOADS).items():
                offloads[k] = v.boolean()
        ifaces.append(Interface(
            match=match,
            mtu=f["mtu"].integer(68, 65535) if "mtu" in f else None,
            channels=ch, rings=rings, offloads=offloads,
            qdisc=f["qdisc"].choice(QDISCS) if "qdisc" in f else None,
            **_nic_extras(f),
            optional=f["optional"].boolean() if "optional" in f else False,
            line=item.line,
        ))
    peers = [p.address() for p in m["fabric_peers"].items()] if "fabric_peers" in m else []
    wan = []
    for p in (m["wan_peers"].items() if "wan_peers" in m else []):
        if isinstance(p.node, yaml.ScalarNode):
            wan.append(WanPeer(p.address()))
            continue
        pm = p.mapping(("address", "name", "rtt_ms", "jitter_ms"), required=("address",))
        ms = {}
        for k in ("rtt_ms", "jitter_ms"):
            v = pm[k].value() if k in pm else None
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e6):
                raise pm[k].error(f"expected a number of milliseconds, got {v!r}")
            ms[k] = v
        wan.append(WanPeer(pm["address"].address(), pm["name"].string() if "name" in pm else "", **ms))
    routes = []
    for r in (m["wan_routes"].items() if "wan_routes" in m else []):
        rm = r.mapping(("prefix", "mtu", "via", "dev"), required=("prefix",))
        if rm["prefix"].network().endswith("/0"):
            raise rm["prefix"].error("a default route (0.0.0.0/0 or ::/0) cannot be a wan_route: "
                                     "rollback could cost the node its default route")
        routes.append(WanRoute(
            prefix=rm["prefix"].network(),
            mtu=rm["mtu"].integer(552, 65535) if "mtu" in rm else 1500,
            via=rm["via"].address() if "via" in rm else None,
            dev=rm["dev"].string(IFNAME_RE, "an interface name") if "dev" in rm else None,
        ))
    probe = {}
    if "probe" in m:
        pm = m["probe"].mapping(("gateway", "count", "timeout_s"))
        if "gateway" in pm:
            probe["probe_gateway"] = pm["gateway"].boolean()
        if "count" in pm:
            probe["probe_count"] = pm["count"].integer(1, 20)
        if "timeout_s" in pm:
            probe["probe_timeout_s"] = pm["timeout_s"].integer(1, 30)
    return Network(ifaces, peers, wan, routes, **probe)


COALESCE = {"rx_usecs": (0, 1 << 20), "tx_usecs": (0, 1 << 20), "rx_frames": (0, 1 << 16),
            "tx_frames": (0, 1 << 16), "adaptive_rx": None, "adaptive_tx": None}
# network.interfaces[].coalesce and .pause (applied by subsystems/ethtool.py)
PAUSE = ("rx", "tx", "autoneg")


def _nic_extras(f: dict) -> dict:
    """coalesce, pause and speed_mbit of one network.interfaces[] entry (profile nodes)."""
    out = {}
    if "coalesce" in f:
        out["coalesce"] = {k: (v.boolean() if COALESCE[k] is None else v.integer(*COALESCE[k]))
                           for k, v in f["coalesce"].mapping(COALESCE).items()}
    if "pause" in f:
        out["pause"] = {k: v.boolean() for k, v in f["pause"].mapping(PAUSE).items()}
    if "speed_mbit" in f:
        out["speed_mbit"] = f["speed_mbit"].integer(10, 1_600_000)
    return out


# ---------------------------------------------------------------- sysctl section
# dotted names: a lower-case top directory (net, vm, kernel, fs), then names such as an interface's
SYSCTL_KEY_RE = r"[a-z][a-z0-9_]*(\.[A-Za-z0-9_-]+)+"
SYSCTL_KEY_MAX = 255
SYSCTL_VALUE_MAX = 1024


@dataclass(frozen=True)
class SysctlSetting:
    key: str
    value: str
    compare: str = "exact"   # exact | at_least
    optional: bool = False
    line: int = 0

    @property
    def path(self) -> str:
        return "/proc/sys/" + self.key.replace(".", "/")


# keys where more is fine (buffer sizes, backlogs)
AT_LEAST = {"net.core.rmem_max", "net.core.wmem_max", "net.core.rmem_default", "net.core.wmem_default",
            "net.core.netdev_max_backlog", "net.core.optmem_max", "net.core.somaxconn",
            "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.udp_rmem_min", "net.ipv4.udp_wmem_min",
            "net.ipv4.tcp_max_syn_backlog", "net.core.netdev_budget", "net.netfilter.nf_conntrack_max"}


def _sysctl_value(n: Node) -> str:
    v = n.value()
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, (int, str)) and str(v).strip():
        return " ".join(str(v).split())
    raise n.error(f"expected a number or a string, got {n._desc()}")


def sysctl_path(key: str) -> str:
    """/proc/sys/... for a dotted key; ProfileError-free check used by the parser and state checks."""
    return "/proc/sys/" + key.replace(".", "/")


def valid_sysctl_key(key: str) -> bool:
    return (len(key) <= SYSCTL_KEY_MAX and re.fullmatch(SYSCTL_KEY_RE, key) is not None
            and os.path.normpath(sysctl_path(key)) == sysctl_path(key))


def _check_shape(key: str, value: str, n: Node) -> None:
    """The value's shape against what this kernel has under that name: a directory of the tree is
    no setting, and a key holding one value takes one (a list or several words are refused)."""
    path = sysctl_path(key)
    if os.path.isdir(path):
        raise n.error(f"{key} is a directory of /proc/sys, not a setting (name one below it, e.g. {key}.<name>)")
    try:
        with open(path) as f:
            cur = f.read(4096)
    except OSError:
        return   # absent or unreadable here: plan reports it unsupported
    if len(cur.split()) == 1 and len(value.split()) != 1:
        raise n.error(f"{key} takes one value on this kernel, got {len(value.split())}: {value!r}")


def parse_sysctl(n: Node) -> list[SysctlSetting]:
    out = []
    for key, v in n.mapping().items():
        if not valid_sysctl_key(key):
            raise v.error("not a sysctl key (expected dotted names under /proc/sys such as net.core.rmem_max: "
                          f"letters, digits, '_' and '-', at most {SYSCTL_KEY_MAX} characters)")
        from hkgpu_tune.core.sysctl_names import forbidden, misspelt
        why = forbidden(key)
        if why:
            raise v.error(f"{why}: refused")
        near = misspelt(key)
        if near:
            raise v.error(f"no such sysctl {key}; did you mean {near}?")
        compare = "at_least" if key in AT_LEAST else "exact"
        optional = False
        if isinstance(v.node, yaml.MappingNode):
            vm = v.mapping(("value", "compare", "optional"), required=("value",))
            value = _sysctl_value(vm["value"])
            if "compare" in vm:
                compare = vm["compare"].choice(("exact", "at_least"))
            if "optional" in vm:
                optional = vm["optional"].boolean()
        elif isinstance(v.node, yaml.SequenceNode):
            value = " ".join(str(_sysctl_value(i)) for i in v.items())
        else:
            value = _sysctl_value(v)
        if len(value) > SYSCTL_VALUE_MAX:
            raise v.error(f"a sysctl value longer than {SYSCTL_VALUE_MAX} characters")
        _check_shape(key, value, v)
        if compare == "at_least" and not all(t.lstrip("-").isdigit() for t in value.split()):
            raise v.error(f"'at_least' needs numbers, got {value!r}")
        out.append(SysctlSetting(key, value, compare, optional, v.line))
    return out


# ---------------------------------------------------------------- the profile
# the sections come from core/sections.py: each registered by the module that owns it (network
# and sysctl above by subsystems/link.py and subsystems/sysctl.py)


@dataclass
class Profile:
    path: str
    name: str = ""
    description: str = ""
    sections: dict[str, Any] = field(default_factory=dict)
    source: str = "--profile"   # why this profile was used: a key of SOURCES
    text: str = field(default="", repr=False)   # what was parsed (persist copies exactly this)

    @property
    def label(self) -> str:
        """The profile's name for reports: a shipped one by name, any other by its path."""
        p = Path(self.path)
        if self.source == "default" or (p.parent == PROFILE_DIR and p.suffix == ".yaml"):
            return p.stem
        return self.path

    def section(self, name: str):
        return self.sections.get(name)

    @property
    def network(self) -> Network:
        return self.sections.get("network") or Network()

    @property
    def sysctl(self) -> list[SysctlSetting]:
        return self.sections.get("sysctl") or []


def parse_profile_text(text: str, file: str = "<profile>") -> Profile:
    if len(text) > MAX_BYTES:
        raise ProfileError(f"{file}: larger than {MAX_BYTES} bytes: not a profile")
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 0
        raise ProfileError(f"{file}:{line}: not valid YAML: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise ProfileError(f"{file}: not valid YAML: {e}") from None
    if root is None:
        raise ProfileError(f"{file}:1: the profile is empty")
    check_tree(root, file)
    top = Node(root, file, "")
    table = sections.table()
    m = top.mapping(sorted(set(table) | {"name", "description"}))
    prof = Profile(path=file, text=text)
    if "name" in m:
        prof.name = m["name"].string(r"[A-Za-z0-9_.@+-]{1,64}", "a name (letters, digits, '_.@+-', at most 64)")
    if "description" in m:
        prof.description = m["description"].string()
    for key, node in m.items():
        if key in table and not node.is_null():
            prof.sections[key] = table[key](node)
    for need, check in sections.checks():
        if all(k in prof.sections for k in need):
            check(prof)
    return prof


def read_profile_file(path: str | os.PathLike, system: bool = False) -> str:
    """The text of a profile file: a regular file (never a FIFO or device: opened without
    blocking and checked before reading) of at most MAX_BYTES, in UTF-8. `system`: a profile
    found in /etc, read by root only when root owns it and no one else can write it."""
    p = os.fspath(path)
    check = (lambda st: _check_owner(p, st, "file", "chmod 644")) if system and os.geteuid() == 0 else None
    try:
        data = read_regular(p, MAX_BYTES, check=check)
    except FileRefused as e:
        raise ProfileError({"missing": f"{p}: no such profile file",
                            "not regular": f"{p}: not a regular file: a profile must be a plain file",
                            "unreadable": f"{p}: cannot read the profile: {e.strerror}"}.get(
                                e.kind, f"{p}: larger than {MAX_BYTES} bytes: not a profile")) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProfileError(f"{p}: not UTF-8 text (byte {e.start})") from None


def load_profile(path: str | os.PathLike | None = None) -> Profile:
    p = resolve_profile(path)
    text = read_profile_file(p)
    return parse_profile_text(text, str(p) if path else p.name)
