"""apply --persist: sysctl.d file, the boot unit, and MTU in the network manager that owns the link.

Every file written is recorded in the state dir (with a backup of what it replaced) so that
`rollback` removes or restores it.
"""
from __future__ import annotations

import configparser
import fnmatch
import glob
import json
import os
import shutil
import sys

import yaml

from .errors import HkError

SYSCTL_FILE = "etc/sysctl.d/60-hkgpu-tune.conf"
PROFILE_FILE = "etc/hkgpu-tune/profile.yaml"
UNIT_NAME = "hkgpu-tune.service"
UNIT_FILE = f"etc/systemd/system/{UNIT_NAME}"
WANTS_LINK = f"etc/systemd/system/multi-user.target.wants/{UNIT_NAME}"
RECORD = "persist.json"


def _p(root: str, rel: str) -> str:
    return os.path.join(root, rel)


def mtu_owner(root: str, link: dict) -> tuple[str, str] | None:
    """Which manager owns this interface: ('netplan', file:id) | ('NetworkManager', file) |
    ('systemd-networkd', file) | None. Detected from their configuration, not guessed."""
    name, mac = link["name"], link.get("mac", "")
    for f in sorted(glob.glob(_p(root, "etc/netplan/*.yaml"))):
        if os.path.basename(f).startswith("60-hkgpu-tune"):
            continue
        try:
            doc = yaml.safe_load(open(f)) or {}
        except (OSError, yaml.YAMLError):
            continue
        for kind in ("ethernets", "bonds", "vlans"):
            for ident, conf in ((doc.get("network") or {}).get(kind) or {}).items():
                m = (conf or {}).get("match") or {}
                if ident == name or m.get("name") and fnmatch.fnmatch(name, m["name"]) \
                        or m.get("macaddress", "").lower() == mac and mac:
                    return "netplan", f"{f}:{kind}:{ident}"
    for f in sorted(glob.glob(_p(root, "etc/NetworkManager/system-connections/*.nmconnection"))):
        cp = configparser.ConfigParser(interpolation=None)
        try:
            cp.read(f)
        except configparser.Error:
            continue
        if cp.get("connection", "interface-name", fallback=None) == name or \
                (mac and cp.get("ethernet", "mac-address", fallback="").lower() == mac):
            return "NetworkManager", f
    for f in sorted(glob.glob(_p(root, "etc/systemd/network/*.network"))):
        cp = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            cp.read(f)
        except configparser.Error:
            continue
        names = cp.get("Match", "Name", fallback="").split()
        macs = cp.get("Match", "MACAddress", fallback="").lower().split()
        if any(fnmatch.fnmatch(name, n) for n in names) or (mac and mac in macs):
            return "systemd-networkd", f
    return None


class Writer:
    def __init__(self, root: str, state_dir: str):
        self.root, self.state_dir = root, state_dir
        self.record_path = os.path.join(state_dir, RECORD)
        try:
            self.record = json.load(open(self.record_path))
        except (OSError, ValueError):
            self.record = []
        self.known = {r["path"] for r in self.record}

    def _mkdirs(self, d: str) -> None:
        """Make d and record each directory made, so rollback removes it again."""
        missing = []
        while d and not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for m in reversed(missing):
            os.mkdir(m)
            if m not in self.known:
                self.record.append({"path": m, "backup": None, "dir": True})
                self.known.add(m)

    def write(self, rel_or_abs: str, text: str, mode=0o644) -> str:
        path = rel_or_abs if os.path.isabs(rel_or_abs) and rel_or_abs.startswith(self.root.rstrip("/") + "/") \
            else _p(self.root, rel_or_abs)
        self._mkdirs(os.path.dirname(path))   # recorded before the file: removed after it
        if path not in self.known:
            backup = None
            if os.path.lexists(path):
                os.makedirs(os.path.join(self.state_dir, "backup"), mode=0o700, exist_ok=True)
                backup = os.path.join(self.state_dir, "backup", path.strip("/").replace("/", "__"))
                shutil.copy2(path, backup)
            self.record.append({"path": path, "backup": backup})
            self.known.add(path)
        tmp = path + ".hkgpu-tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        return path

    def link(self, rel: str, target: str) -> str:
        path = _p(self.root, rel)
        self._mkdirs(os.path.dirname(path))
        if path not in self.known:
            self.record.append({"path": path, "backup": None})
            self.known.add(path)
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(target, path)
        return path

    def save(self):
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        with open(self.record_path + ".tmp", "w") as f:
            json.dump(self.record, f, indent=1)
        os.replace(self.record_path + ".tmp", self.record_path)


def sysctl_conf(profile, results) -> str:
    bad = {r.key for r in results if r.subsystem == "sysctl" and r.status in ("unsupported", "error")}
    lines = ["# Written by hkgpu-tune apply --persist; `hkgpu-tune rollback` removes it.",
             f"# Profile: {profile.name or profile.path}"]
    for s in profile.sysctl:
        if s.key in bad:
            lines.append(f"# {s.key} = {s.value}   (not supported on this host)")
        else:
            lines.append(f"{s.key} = {s.value}")
    return "\n".join(lines) + "\n"


def boot_unit(exe: str, only: list[str]) -> str:
    return f"""# Written by hkgpu-tune apply --persist; `hkgpu-tune rollback` removes it.
[Unit]
Description=hkgpu-tune: re-apply runtime NIC settings, then verify
DefaultDependencies=no
After=systemd-udev-settle.service systemd-sysctl.service network-pre.target nvidia-persistenced.service
Wants=network-pre.target
Before=network-online.target shutdown.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={exe} apply --profile /{PROFILE_FILE} --only {','.join(only)}
ExecStartPost=-{exe} verify --profile /{PROFILE_FILE} --prometheus /run/hkgpu-tune.prom

[Install]
WantedBy=multi-user.target
"""


def persist(engine, root: str = "/", profile_path: str | None = None) -> list[str]:
    """Write the persistent configuration; returns one line per thing done."""
    profile = engine.profile
    w = Writer(root, engine.state.dir)
    done = []
    try:
        results = engine.verify()
        if profile.sysctl:
            done.append("sysctl: " + w.write(SYSCTL_FILE, sysctl_conf(profile, results)))
        src = profile_path if profile_path and os.path.exists(profile_path) else None
        text = open(src).read() if src else yaml.safe_dump({"name": profile.name})
        done.append("profile: " + w.write(PROFILE_FILE, text))
        # MTU: into the owner's configuration where a manager owns the link
        # settings the kernel or driver forgets at reboot (MPS and Triton have units of their own)
        runtime = [n for n in ("ethtool", "qdisc", "gpu", "affinity") if n in engine.by_name]
        boot_link = False
        if "link" in engine.by_name:
            links = engine.b.net.links()
            from .subsystems.link import matches
            for rule in profile.network.interfaces:
                if not rule.mtu:
                    continue
                for ln in [x for x in links if matches(rule.match, x)]:
                    owner = mtu_owner(root, ln)
                    if owner is None:
                        boot_link = True
                        done.append(f"mtu {ln['name']}: no network manager owns it; the boot unit sets it")
                    else:
                        done.append(f"mtu {ln['name']}: {owner[0]}: " + _owner_write(w, owner, ln, rule.mtu))
            if profile.network.wan_routes:
                boot_link = True
        only = (["link"] if boot_link else []) + runtime
        if only:
            exe = shutil.which("hkgpu-tune") or os.path.join(os.path.dirname(sys.executable), "hkgpu-tune")
            done.append("unit: " + w.write(UNIT_FILE, boot_unit(exe, only)))
            done.append("enabled: " + w.link(WANTS_LINK, f"/{UNIT_FILE}"))
            if root == "/" and os.path.isdir("/run/systemd/system"):
                engine.b.cmd.run(["systemctl", "daemon-reload"])
    except OSError as e:
        raise HkError(f"persist: {e.filename or ''}: {e.strerror}", e.errno) from None
    finally:
        w.save()
    return done


def _owner_write(w: Writer, owner, link, mtu: int) -> str:
    kind, where = owner
    if kind == "netplan":
        f, sect, ident = where.rsplit(":", 2)
        doc = {"network": {"version": 2, sect: {ident: {"mtu": mtu}}}}
        path = w.write(os.path.join(os.path.dirname(f), "60-hkgpu-tune.yaml"),
                       "# Written by hkgpu-tune apply --persist\n" + yaml.safe_dump(doc, sort_keys=False), 0o600)
        return path + " (run `netplan apply`)"
    if kind == "NetworkManager":
        cp = configparser.ConfigParser(interpolation=None)
        cp.optionxform = str
        cp.read(where)
        if not cp.has_section("ethernet"):
            cp.add_section("ethernet")
        cp.set("ethernet", "mtu", str(mtu))
        import io
        buf = io.StringIO()
        cp.write(buf, space_around_delimiters=False)
        return w.write(where, buf.getvalue(), 0o600) + " (run `nmcli connection reload`)"
    drop = where + ".d/60-hkgpu-tune.conf"
    return w.write(drop, f"# Written by hkgpu-tune apply --persist\n[Link]\nMTUBytes={mtu}\n")


def unpersist(state_dir: str) -> list[str]:
    """Remove or restore every file persist wrote (newest first)."""
    path = os.path.join(state_dir, RECORD)
    try:
        record = json.load(open(path))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise HkError(f"{path}: cannot read: {e}") from None
    done = []
    for r in reversed(record):
        if r.get("dir"):
            continue
        if r["backup"]:
            shutil.copy2(r["backup"], r["path"])
            os.unlink(r["backup"])
            done.append(f"restored {r['path']}")
        elif os.path.lexists(r["path"]):
            os.unlink(r["path"])
            done.append(f"removed {r['path']}")
    # then the directories it made, deepest first, each only when empty (something else may have
    # put files there since)
    for d in sorted((r["path"] for r in record if r.get("dir")), key=lambda p: p.count("/"), reverse=True):
        try:
            os.rmdir(d)
            done.append(f"removed {d}/")
        except OSError:
            pass
    os.unlink(path)
    return done
