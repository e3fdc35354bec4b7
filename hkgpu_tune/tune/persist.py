"""apply --persist: sysctl.d file, the boot unit, and MTU in the network manager that owns the link.

Every file written is recorded in the state dir (with a backup of what it replaced) so that
`rollback` removes or restores it.
"""
from __future__ import annotations

import configparser
import fnmatch
import glob
import hashlib
import os
import re
import stat

import yaml

from hkgpu_tune.core.errors import HkError, ProfileError, StateError
from hkgpu_tune.core import unitfile
from hkgpu_tune.core.fsutil import FileRefused, atomic_write, check_trusted, fsync_dir, read_regular
from hkgpu_tune.core.paths import entry_point  # noqa: F401 (persist.entry_point: the boot unit's command)
from hkgpu_tune.tune.journal import Journal
from hkgpu_tune.core.yamlnode import load_yaml_doc
from hkgpu_tune.core.report import Change
from hkgpu_tune.tune.state import State

SYSCTL_FILE = "etc/sysctl.d/60-hkgpu-tune.conf"
PROFILE_FILE = "etc/hkgpu-tune/profile.yaml"
EXPORT_ENV = "etc/hkgpu-tune/export.env"   # written by the hkgpu_verify role: HKGPU_TUNE_TEXTFILE_DIR=...
UNIT_NAME = "hkgpu-tune.service"
UNIT_FILE = f"etc/systemd/system/{UNIT_NAME}"
WANTS_LINK = f"etc/systemd/system/multi-user.target.wants/{UNIT_NAME}"
LEGACY_RECORD = "persist.json"   # format of older versions: refused


# line breaks and control characters never reach a file this tool writes (tab is whitespace)
_CTRL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def _p(root: str, rel: str) -> str:
    return os.path.join(root, rel)


MAX_CONFIG = 1 << 20    # a network manager's file larger than this is refused, not read


def _read_config(path: str) -> str:
    """The text of a network manager's file: a regular file (a link is followed, a FIFO or
    device refused without blocking) of at most MAX_CONFIG bytes of UTF-8; HkError otherwise."""
    try:
        data = read_regular(path, MAX_CONFIG)
    except FileRefused as e:
        if e.kind == "not regular":
            raise HkError(f"{path}: not a regular file: refused") from None
        if e.kind in ("too large", "grew"):
            raise HkError(f"{path}: larger than {MAX_CONFIG} bytes: refused") from None
        raise HkError(f"{path}: cannot read: {e.strerror}", e.errno) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HkError(f"{path}: not UTF-8 text (byte {e.start}): refused") from None


def _read_ini(path: str, strict: bool) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=strict)
    try:
        cp.read_string(_read_config(path), source=path)
    except configparser.Error as e:
        line = getattr(e, "lineno", None) or (e.errors[0][0] if getattr(e, "errors", None) else None)
        what = " ".join(str(getattr(e, "message", e)).split("\n")[0].split())
        raise HkError(f"{path}:{line or 0}: not a valid {os.path.basename(os.path.dirname(path))} file: {what}") from None
    return cp


def _mapping(v, path: str, where: str) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise HkError(f"{path}: {where}: a mapping expected, found {type(v).__name__}: refused")
    return v


def _netplan_owner(f: str, name: str, mac: str) -> str | None:
    try:
        doc = load_yaml_doc(_read_config(f), f)
    except ProfileError as e:
        raise HkError(str(e).replace("not a profile", "refused")) from None
    net = _mapping(_mapping(doc, f, "top level").get("network"), f, "network")
    for kind in ("ethernets", "bonds", "vlans"):
        for ident, conf in _mapping(net.get(kind), f, f"network.{kind}").items():
            where = f"network.{kind}.{ident}"
            m = _mapping(_mapping(conf, f, where).get("match"), f, where + ".match")
            for key in ("name", "macaddress"):
                if m.get(key) is not None and not isinstance(m[key], str):
                    raise HkError(f"{f}: {where}.match.{key}: a string expected, "
                                  f"found {type(m[key]).__name__}: refused")
            if str(ident) == name or m.get("name") and fnmatch.fnmatchcase(name, m["name"]) \
                    or mac and (m.get("macaddress") or "").lower() == mac:
                return f"{f}:{kind}:{ident}"
    return None


def mtu_owner(root: str, link: dict) -> tuple[str, str] | None:
    """Which manager owns this interface: ('netplan', file:id) | ('NetworkManager', file) |
    ('systemd-networkd', file) | None. Detected from their configuration, not guessed. A file
    that cannot be read whole and understood (a FIFO, binary, too large, invalid, of another
    shape) is an HkError naming it: the owner is never guessed past it."""
    name, mac = link["name"], (link.get("mac") or "").lower()
    for f in sorted(glob.glob(_p(glob.escape(root), "etc/netplan/*.yaml"))):
        if os.path.basename(f).startswith("60-hkgpu-tune"):
            continue
        found = _netplan_owner(f, name, mac)
        if found:
            return "netplan", found
    for f in sorted(glob.glob(_p(glob.escape(root), "etc/NetworkManager/system-connections/*.nmconnection"))):
        cp = _read_ini(f, strict=True)
        if cp.get("connection", "interface-name", fallback=None) == name or \
                (mac and cp.get("ethernet", "mac-address", fallback="").lower() == mac):
            return "NetworkManager", f
    for f in sorted(glob.glob(_p(glob.escape(root), "etc/systemd/network/*.network"))):
        cp = _read_ini(f, strict=False)
        names = cp.get("Match", "Name", fallback="").split()
        macs = cp.get("Match", "MACAddress", fallback="").lower().split()
        if any(fnmatch.fnmatchcase(name, n) for n in names) or (mac and mac in macs):
            return "systemd-networkd", f
    return None


class Writer:
    """Every file `--persist` writes goes through the journal first: its entry (the sha256 of what
    will be written, and a hashed backup of what it replaces) is on disk before the file changes."""

    def __init__(self, root: str, journal: Journal):
        self.root, self.j = root, journal
        self.state_dir = journal.state.dir

    def _entry(self, path: str, kind: str) -> Change | None:
        return next((e for e in self.j.entries if e.ident == ("persist", path, kind)), None)

    def _mkdirs(self, d: str) -> None:
        """Make d and record each directory made (before making it), so rollback removes it again."""
        missing = []
        while d and not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for m in reversed(missing):
            if self._entry(m, "dir") is None:
                self.j.update(Change("persist", m, "dir", None, None, {}))
            os.mkdir(m, 0o755)

    def _backup(self, path: str) -> dict | None:
        """A copy of the file `path` replaces (None: there is none), in the state dir, hashed."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise HkError(f"persist: {path}: not a regular file (a link?): refused")
        data = _read_regular(path)
        bdir = os.path.join(self.state_dir, "backup")
        try:
            os.mkdir(bdir, 0o700)
        except FileExistsError:
            if not os.path.isdir(bdir) or os.path.islink(bdir):
                raise HkError(f"{bdir}: not a directory: refused") from None
        backup = _new_file(os.path.join(bdir, path.strip("/").replace("/", "__")), data)
        return {"backup": backup, "sha256": _sha(data), "mode": stat.S_IMODE(st.st_mode)}

    def write(self, rel_or_abs: str, text: str, mode=0o644) -> str:
        path = rel_or_abs if os.path.isabs(rel_or_abs) and rel_or_abs.startswith(self.root.rstrip("/") + "/") \
            else _p(self.root, rel_or_abs)
        path = os.path.normpath(path)
        self._mkdirs(os.path.dirname(path))   # recorded before the file: removed after it
        data = text.encode()
        h = _sha(data)
        e = self._entry(path, "file")
        if e is None:
            c = Change("persist", path, "file", self._backup(path), {"sha256": [h]}, {})
        else:
            hashes = [x for x in e.desired["sha256"] if x != h][-15:] + [h]
            c = Change("persist", path, "file", e.current, {"sha256": hashes}, {})
        self.j.update(c)    # on disk before the file changes
        _drop_temps(path)   # a run killed while writing it left one (under the lock: no one else writes it)
        atomic_write(path, data, mode)
        self.j.wrote(c)
        return path

    def link(self, rel: str, target: str) -> str:
        path = os.path.normpath(_p(self.root, rel))
        self._mkdirs(os.path.dirname(path))
        ours = self._entry(path, "link")
        if os.path.lexists(path):
            if os.path.islink(path) and os.readlink(path) == target:
                return path
            if not ours:
                raise HkError(f"persist: {path}: exists and is not hkgpu-tune's link: left alone")
            os.unlink(path)
        c = Change("persist", path, "link", None, {"target": target}, {})
        self.j.update(c)
        os.symlink(target, path)
        fsync_dir(os.path.dirname(path))
        self.j.wrote(c)
        return path


def _new_file(base: str, data: bytes) -> str:
    """Write data to a file that did not exist (base, else base.1, base.2, ...): a backup is never
    overwritten, so the original a rollback kept (a file changed since the tool wrote it) survives
    the next apply --persist. Returns the path written."""
    for i in range(1000):
        path = base if i == 0 else f"{base}.{i}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        except OSError as e:
            raise HkError(f"{path}: cannot write the backup: {e.strerror}", e.errno) from None
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as e:
            raise HkError(f"{path}: cannot write the backup: {e.strerror}", e.errno) from None
        finally:
            os.close(fd)
        fsync_dir(os.path.dirname(path))
        return path
    raise HkError(f"{base}: a thousand backups of this file already: refused (clean {os.path.dirname(base)} by hand)")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_regular(path: str, limit: int = 16 << 20) -> bytes:
    """The bytes of a regular file, not following a link (HkError otherwise)."""
    try:
        return read_regular(path, limit, follow=False)
    except FileRefused as e:
        if e.kind in ("link", "unreadable", "missing"):
            raise HkError(f"{path}: cannot read: {e.strerror}", e.errno) from None
        raise HkError(f"{path}: not a regular file of at most {limit} bytes") from None


def _current_hash(path: str) -> str | None:
    """sha256 of the file at path; None when absent; 'other' when it is not a regular file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return "other"
    return _sha(_read_regular(path))


def undo_file(c: Change, state_dir: str) -> str:
    """Put back what one persist entry changed; safe to run again (a file already back counts as
    restored). Only a file whose content is one the tool wrote is removed or replaced: a file
    changed since is kept and reported. Returns one line; HkError keeps the entry."""
    path = c.target
    if c.key == "dir":
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return f"{path}/: already gone"
        except OSError:
            return f"kept {path}/: not empty or not a directory"
        return f"removed {path}/"
    if c.key == "link":
        if not os.path.lexists(path):
            return f"{path}: already gone"
        if os.path.islink(path) and os.readlink(path) == c.desired["target"]:
            os.unlink(path)
            fsync_dir(os.path.dirname(path))
            return f"removed {path}"
        return f"kept {path}: no longer the link hkgpu-tune made"
    _drop_temps(path)
    orig, now = c.current, _current_hash(path)
    if orig is None and now is None:
        return f"{path}: already gone"
    if orig is not None and now == orig["sha256"]:
        _drop_backup(orig["backup"], state_dir)
        return f"{path}: already restored"
    if now is not None and now not in c.desired["sha256"]:
        # the backup stays (never overwritten, see _new_file): the operator decides
        return f"kept {path}: changed since hkgpu-tune wrote it (not removed, not restored)" + (
            f"; its original from before hkgpu-tune stays at {orig['backup']}" if orig else "")
    if orig is None:
        os.unlink(path)
        fsync_dir(os.path.dirname(path))
        return f"removed {path}"
    data = _read_backup(orig, state_dir)
    atomic_write(path, data, mode=orig.get("mode", 0o644))
    _drop_backup(orig["backup"], state_dir)
    return f"restored {path}"


def _drop_temps(path: str) -> None:
    """Temporary files atomic_write left for `path` when a kill came between making and renaming
    them (named .NAME.PID.N.tmp beside it; regular files only, never a link)."""
    d, name = os.path.split(path)
    for t in glob.glob(os.path.join(glob.escape(d), f".{glob.escape(name)}.*.tmp")):
        if re.fullmatch(rf"\.{re.escape(name)}\.[0-9]+\.[0-9]+\.tmp", os.path.basename(t)) \
                and stat.S_ISREG(os.lstat(t).st_mode):
            os.unlink(t)


def _backup_path(backup: str, state_dir: str) -> str:
    if os.path.dirname(backup) != os.path.join(os.path.abspath(state_dir), "backup"):
        raise HkError(f"{backup}: a backup outside {state_dir}/backup: refused")
    return backup


def _read_backup(orig: dict, state_dir: str) -> bytes:
    data = _read_regular(_backup_path(orig["backup"], state_dir))
    if _sha(data) != orig["sha256"]:
        raise HkError(f"{orig['backup']}: the backup changed since it was made: refused (the entry is kept)")
    return data


def _drop_backup(backup: str, state_dir: str) -> None:
    try:
        os.unlink(_backup_path(backup, state_dir))
    except OSError:
        pass   # gone already, or a read-only directory: a backup left over is harmless (never reused)


def _refuse_legacy(state_dir: str) -> None:
    old = os.path.join(state_dir, LEGACY_RECORD)
    if os.path.lexists(old):
        raise StateError(f"{old}: a record of an older hkgpu-tune, without the hashes of the files it wrote: "
                         "refused (check the files it lists by hand, remove or restore them, then delete it)")


def sysctl_conf(profile, results) -> str:
    """The sysctl section's settings and the buffer sizes tcp_buffers derives (what apply set),
    so that a reboot keeps them."""
    from hkgpu_tune.subsystems.sysctl import buffer_settings
    bad = {r.key for r in results if r.subsystem == "sysctl" and r.status in ("unsupported", "error")}
    name = str(profile.name or profile.path)
    lines = ["# Written by hkgpu-tune apply --persist; `hkgpu-tune rollback` removes it.",
             f"# Profile: {name if not _CTRL.search(name) else '(name with control characters)'}"]
    settings, why = buffer_settings(profile)
    arithmetic = " ".join(next(iter(why.values()), "").split())
    if arithmetic and not _CTRL.search(arithmetic):
        lines.append("# " + arithmetic)
    for s in settings:
        for what, v in (("key", s.key), ("value", s.value)):
            if _CTRL.search(str(v)):
                raise HkError(f"persist: sysctl {s.key!r}: the {what} holds a line break or control character: "
                              f"refused (nothing written to {SYSCTL_FILE})")
        if s.key in bad:
            lines.append(f"# {s.key} = {s.value}   (not supported on this host)")
        else:
            lines.append(f"{s.key} = {s.value}")
    return "\n".join(lines) + "\n"


def device_unit(ifname: str) -> str:
    """The systemd device unit of a network interface (systemd-escape --path)."""
    esc = "".join(c if c.isalnum() or c in ":_" or (c == "." and i) else f"\\x{ord(c):02x}"
                  for i, c in enumerate(ifname))
    return f"sys-subsystem-net-devices-{esc}.device"


BOOT_TIMEOUT = "5min"


def boot_unit(exe: list[str] | str, only: list[str], devices=()) -> str:
    """The boot unit. It waits for the interfaces it tunes (their device units: each at most
    systemd's device timeout), not for systemd-udev-settle, which is deprecated and waits for all."""
    exe = [exe] if isinstance(exe, str) else exe
    devs = " ".join(device_unit(d) for d in dict.fromkeys(devices))
    wait = f"\nWants={devs}\nAfter={devs}" if devs else ""

    def ex(*args):
        return unitfile.exec_line([*exe, *args], "boot unit command")
    return f"""# Written by hkgpu-tune apply --persist; `hkgpu-tune rollback` removes it.
[Unit]
Description=hkgpu-tune: re-apply runtime NIC settings, then verify and export the metrics
DefaultDependencies=no
After=systemd-udev-trigger.service systemd-sysctl.service network-pre.target nvidia-persistenced.service
Wants=network-pre.target{wait}
Before=network-online.target shutdown.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
# a oneshot has no start timeout by default: whatever stalls (a NIC, NVML, a hook) must not hold
# the boot before network-online.target; systemd then kills it and the unit is failed, in the journal
TimeoutStartSec={BOOT_TIMEOUT}
# the export writes the one textfile the verify timer also writes (HKGPU_TUNE_TEXTFILE_DIR, else
# node_exporter's default directory): the same series, never a second file; health before it runs
# the profile's on_unhealthy/on_healthy hooks on a transition, as the verify timer does
EnvironmentFile=-/{EXPORT_ENV}
ExecStart={ex("apply", "--profile", "/" + PROFILE_FILE, "--only", ",".join(only))}
ExecStartPost=-{ex("health", "--profile", "/" + PROFILE_FILE)}
ExecStartPost=-{ex("export", "--profile", "/" + PROFILE_FILE)}

[Install]
WantedBy=multi-user.target
"""


def profile_text(profile) -> str:
    """What goes to /etc/hkgpu-tune/profile.yaml: the very text the run parsed (the whole shipped
    profile for the default, never only its name; never a file looked up again by a relative
    name). A profile from a file is copied into /etc only when that file, and every directory above
    it, passes the trust rule: its hooks and settings run as root at every boot."""
    if not getattr(profile, "text", ""):
        raise HkError(f"persist: the text of profile {profile.label} is not known: nothing persisted")
    if profile.source != "default":
        check_trusted(os.path.abspath(str(profile.path)), "profile to persist")
    return profile.text


def precheck(engine) -> None:
    """The refusals of persist that need no write: the profile's trust and the entry point."""
    profile_text(engine.profile)
    entry_point()


def persist(engine, root: str = "/", profile_path: str | None = None) -> list[str]:
    """Write the persistent configuration; returns one line per thing done."""
    profile = engine.profile
    _refuse_legacy(engine.state.dir)
    with engine.state.lock():
        return _persist(engine, profile, root, profile_path)


def _persist(engine, profile, root, profile_path) -> list[str]:
    w = Writer(root, Journal(engine.state))
    done = []
    try:
        owners = _mtu_owners(engine, profile, root)   # every manager's file read before any write
        results = engine.verify()
        text = profile_text(profile)   # checked before anything is written
        if "sysctl" in engine.by_name and (profile.sysctl or profile.section("tcp_buffers")):
            done.append("sysctl: " + w.write(SYSCTL_FILE, sysctl_conf(profile, results)))
        # MTU: into the owner's configuration where a manager owns the link
        # settings the kernel or driver forgets at reboot (MPS and Triton have units of their own)
        from hkgpu_tune import subsystems
        runtime = [s.name for s in subsystems.specs() if s.persist == "boot" and s.name in engine.by_name]
        boot_link = False
        if "link" in engine.by_name:
            for ln, mtu, owner in owners:
                if owner is None:
                    boot_link = True
                    done.append(f"mtu {ln['name']}: no network manager owns it; the boot unit sets it")
                else:
                    done.append(f"mtu {ln['name']}: {owner[0]}: " + _owner_write(w, owner, ln, mtu))
            if profile.network.wan_routes:
                boot_link = True
        only = (["link"] if boot_link else []) + runtime
        if only:
            exe = entry_point()
            devices = [ln["name"] for ln, _, _ in owners] if "link" in engine.by_name else []
            done.append("unit: " + w.write(UNIT_FILE, boot_unit(exe, only, devices)))
            done.append("enabled: " + w.link(WANTS_LINK, f"/{UNIT_FILE}"))
        # the profile copy last: converge persists again where it differs from the node profile, so
        # a run killed before this point is finished by the next one (tests/hostile/test_kills_converge.py)
        done.append("profile: " + w.write(PROFILE_FILE, text))
        if only and root == "/" and os.path.isdir("/run/systemd/system"):
            engine.b.cmd.run(["systemctl", "daemon-reload"])
    except OSError as e:
        raise HkError(f"persist: {e.filename or ''}: {e.strerror}", e.errno) from None
    return done


def _mtu_owners(engine, profile, root) -> list[tuple[dict, int, tuple[str, str] | None]]:
    """(link, mtu, owner) for each link a rule with an MTU matches."""
    if "link" not in engine.by_name:
        return []
    from hkgpu_tune.subsystems.link import matches
    links, out = engine.b.net.links(), []
    for rule in profile.network.interfaces:
        if rule.mtu:
            out += [(ln, rule.mtu, mtu_owner(root, ln)) for ln in links if matches(rule.match, ln)]
    return out


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
        cp.read_string(_read_config(where), source=where)
        if not cp.has_section("ethernet"):
            cp.add_section("ethernet")
        cp.set("ethernet", "mtu", str(mtu))
        import io
        buf = io.StringIO()
        cp.write(buf, space_around_delimiters=False)
        return w.write(where, buf.getvalue(), 0o600) + " (run `nmcli connection reload`)"
    drop = where + ".d/60-hkgpu-tune.conf"
    return w.write(drop, f"# Written by hkgpu-tune apply --persist\n[Link]\nMTUBytes={mtu}\n")


def _forget_textfile(root: str) -> list[str]:
    """The boot unit is gone: its export's textfile goes too, or node_exporter serves the rolled-back
    node's last figures for ever. Only where no export.env names a directory: then the hkgpu_verify
    role's timer writes the file, and its rollback playbook removes it."""
    from hkgpu_tune.core.paths import TEXTFILE_DIR as DEFAULT_DIR, TEXTFILE_NAME as FILE_NAME
    if os.path.lexists(os.path.join(root, EXPORT_ENV)):
        return []
    path = os.path.join(root, DEFAULT_DIR.lstrip("/"), FILE_NAME)
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return []
        os.unlink(path)
    except FileNotFoundError:
        return []
    return [f"removed {path} (the boot unit's export)"]


def unpersist(state_dir: str, host_dir: str | None = None) -> list[str]:
    """Remove or restore every file persist wrote (newest first); each entry leaves the state file
    as soon as its file is back. One line per file."""
    st = State(state_dir, host_dir)
    if not st.check_dir():
        return []
    _refuse_legacy(st.dir)
    done, errs = [], []
    with st.lock():
        entries = st.load()
        for c in reversed(list(entries)):
            if c.subsystem != "persist":
                continue
            try:
                done.append(undo_file(c, st.dir))
            except HkError as e:
                errs.append(str(e))
                continue
            except OSError as e:
                errs.append(f"{e.filename or c.target}: {e.strerror}")
                continue
            entries.remove(c)
            try:
                st.save(entries, register=False)
            except (HkError, OSError) as e:   # the file is back; its entry is restored again later
                errs.append(f"{st.path}: could not be rewritten ({e}): {c.target} is restored but still listed")
            if c.target.endswith("/" + UNIT_FILE):
                try:
                    done += _forget_textfile(c.target[:-len(UNIT_FILE)])
                except OSError as e:
                    errs.append(f"{e.filename}: {e.strerror}")
    if errs:
        raise HkError("rollback of persisted files: " + "; ".join(errs) + (f" (done: {'; '.join(done)})" if done else ""))
    return done
