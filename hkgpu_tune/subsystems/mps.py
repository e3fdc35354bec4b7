"""CUDA MPS as a host service: directories, the systemd unit (rendered here), the daemon, its settings.

Profile section:

    mps:
      enabled: true
      pipe_dir: /run/nvidia-mps          # CUDA_MPS_PIPE_DIRECTORY
      log_dir: /var/log/nvidia-mps       # CUDA_MPS_LOG_DIRECTORY
      gpus: all                          # or [0, 1], or one MIG device: [MIG-<uuid>]
      default_active_thread_percentage: 50
      default_pinned_mem_limit: "0=16G,1=16G"
      user: root
      unit: nvidia-mps.service

pipe_dir and log_dir must lie below /run, /var/run, /tmp, /var/lib/hkgpu-tune, /var/log or /srv
(normalised, no '..'). A directory apply makes is given to `user`; one that exists is never
chowned: it must already belong to `user` and not be writable by others, else it is an error.
The unit lets systemd make its directories under /run, /var/log and /var/lib (RuntimeDirectory=,
LogsDirectory=, StateDirectory=); under /tmp or /srv it only checks that apply made them.

Where systemd runs, apply installs the unit and enables it; elsewhere (containers, the GPU test
machine) it starts `nvidia-cuda-mps-control -d` directly. Either way the settings are sent through
the control pipe after start and read back by the health probe.
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass

from hkgpu_tune.core import unitfile
from hkgpu_tune.backends.mps import CONTROL, SAFE_DIR_ROOTS, dir_state, ensure_dir, mps_env, safe_root, set_dir_mode
from hkgpu_tune.core.errors import HkError, UnsupportedError
from hkgpu_tune.core.report import DRIFT, ERROR, OK, UNSUPPORTED
from hkgpu_tune.core import fields
from hkgpu_tune.core.fields import SettingType
from hkgpu_tune.subsystems.base import Spec, Subsystem
from hkgpu_tune.subsystems.gpu import parse_gpus, select

SIZE_RE = r"[0-9]{1,6}[KMGT]?"
DIR_MODES = {"pipe_dir": 0o755, "log_dir": 0o750}


@dataclass(frozen=True)
class MpsProfile:
    enabled: bool = True
    pipe_dir: str = "/run/nvidia-mps"
    log_dir: str = "/var/log/nvidia-mps"
    gpus: tuple[int | str, ...] | None = None   # GPU indices, or one MIG device UUID
    default_active_thread_percentage: int | None = None
    default_pinned_mem_limit: tuple[tuple[int, str], ...] = ()
    user: str = "root"
    unit: str = "nvidia-mps.service"


def _abs_dir(n):
    v = n.string(r"/[A-Za-z0-9_./-]{1,255}", "an absolute directory path (letters, digits, '_.-/')")
    if os.path.normpath(v) != v or "/../" in v + "/" or "/./" in v + "/":
        raise n.error(f"expected a normalised absolute path (no '..', '.', '//' or trailing '/'), got {v!r}")
    if safe_root(v) is None:
        raise n.error(f"{v!r} is not under one of {', '.join(SAFE_DIR_ROOTS)} (MPS directories stay in "
                      "places meant for a service's runtime, log or state files)")
    return v


def _parse_gpus(n) -> tuple[int | str, ...] | None:
    """`all`, a list of GPU indices, or one MIG device by position ([mig:GPU/SLOT]) or UUID ([MIG-...]):
    NVIDIA's MIG user guide runs one MPS control daemon per MIG device, with CUDA_VISIBLE_DEVICES set to it."""
    import yaml
    from hkgpu_tune.serve.schema.devices import MIG_RE, mig_ref
    items = n.items() if isinstance(n.node, yaml.SequenceNode) else [n]
    if any(isinstance(i.node, yaml.ScalarNode) and str(i.node.value).startswith(("MIG-", "mig:")) for i in items):
        if len(items) != 1:
            raise n.error("one MIG device per MPS daemon (gpus: [mig:GPU/SLOT] or [MIG-...]): NVIDIA's MIG user "
                          "guide runs a control daemon per MIG device")
        if str(items[0].node.value).startswith("mig:"):
            return (mig_ref(items[0]),)
        return (items[0].string(MIG_RE, "a MIG device UUID (MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"),)
    return parse_gpus(n)


def parse_profile(n) -> MpsProfile:
    m = n.mapping(("enabled", "pipe_dir", "log_dir", "gpus", "default_active_thread_percentage",
                   "default_pinned_mem_limit", "user", "unit"))
    kw = {}
    if "enabled" in m:
        kw["enabled"] = m["enabled"].boolean()
    for k in ("pipe_dir", "log_dir"):
        if k in m:
            kw[k] = _abs_dir(m[k])
    pipe, log = kw.get("pipe_dir", MpsProfile.pipe_dir), kw.get("log_dir", MpsProfile.log_dir)
    if pipe == log or pipe.startswith(log + "/") or log.startswith(pipe + "/"):
        where = m.get("log_dir") or m.get("pipe_dir") or n
        raise where.error(f"pipe_dir {pipe} and log_dir {log} must be separate directories, neither inside "
                          "the other (they get different modes)")
    if "gpus" in m:
        kw["gpus"] = _parse_gpus(m["gpus"])
    if "default_active_thread_percentage" in m:
        kw["default_active_thread_percentage"] = m["default_active_thread_percentage"].integer(1, 100)
    if "default_pinned_mem_limit" in m:
        node = m["default_pinned_mem_limit"]
        v = node.string(rf"[0-9]{{1,2}}={SIZE_RE}(,[0-9]{{1,2}}={SIZE_RE})*", "device=size pairs such as '0=16G,1=16G'")
        pairs = tuple((int(d), s) for d, s in (p.split("=") for p in v.split(",")))
        if len({d for d, _ in pairs}) != len(pairs):
            raise node.error("a device is listed twice")
        gpus = kw.get("gpus")
        if gpus is not None and max(d for d, _ in pairs) >= len(gpus):
            # devices are numbered as the MPS clients see them: 0..len(gpus)-1
            raise node.error(f"device {max(d for d, _ in pairs)} is not one of the {len(gpus)} GPU(s) MPS serves "
                             f"(gpus at line {m['gpus'].line}; devices count from 0 among them)")
        kw["default_pinned_mem_limit"] = pairs
    if "user" in m:
        kw["user"] = m["user"].string(r"[a-z_][a-z0-9_-]{0,31}", "a user name")
    if "unit" in m:
        kw["unit"] = m["unit"].string(r"[A-Za-z0-9_.@-]{1,240}\.service", "a unit name ending in .service")
    return MpsProfile(**kw)


def to_bytes(size: str | None) -> int | None:
    """'16G' -> bytes (MPS sizes are binary multiples)."""
    if size is None:
        return None
    mt = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)B?\s*", str(size), re.I)
    if not mt:
        return None
    return int(float(mt.group(1)) * 1024 ** " KMGT".index(mt.group(2).upper() or " "))


def render_unit(cfg: MpsProfile, exe: str = f"/usr/bin/{CONTROL}", gpus=None) -> str:
    """The systemd unit that runs the MPS control daemon with this profile's settings. A MIG device
    named by position is resolved to its UUID each time the unit starts (devices.start_lines)."""
    from hkgpu_tune.serve.schema.devices import is_mig_pos, start_lines
    pos = gpus[0] if gpus and is_mig_pos(gpus[0]) else None
    env = mps_env(cfg.pipe_dir, cfg.log_dir, gpus)
    if pos:
        env.pop("CUDA_VISIBLE_DEVICES")
    post = [f"set_default_active_thread_percentage {cfg.default_active_thread_percentage}"] \
        if cfg.default_active_thread_percentage else []
    post += [f"set_default_device_pinned_mem_limit {d} {s}" for d, s in cfg.default_pinned_mem_limit]
    q, x = shlex.quote, unitfile.exec_line
    lines = [
        "# Rendered by hkgpu-tune (mps subsystem); changes here are reported as drift.",
        "[Unit]",
        "Description=NVIDIA CUDA MPS control daemon",
        "After=nvidia-persistenced.service" + (" hkgpu-tune.service" if pos else ""),
        "Wants=nvidia-persistenced.service",
        "",
        "[Service]",
        "Type=forking",
        f"User={unitfile.value(cfg.user, 'mps.user')}",
        *[f"Environment={unitfile.environment(k, v)}" for k, v in env.items()],
        *(start_lines(pos, cfg.unit.removesuffix(".service")) if pos else []),
        *_unit_dir_lines(cfg),
        f"ExecStart={x([exe, '-d'])}",
        *[f"ExecStartPost={x(['/bin/sh', '-c', f'echo {c} | {q(exe)}'])}" for c in post],
        f"ExecStop={x(['/bin/sh', '-c', f'echo quit | {q(exe)}'])}",
        "Restart=on-failure",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def unit_is_rendered(text) -> bool:
    """Whether a unit text is byte for byte what render_unit writes for settings a profile could
    name: its fields are read back (user, directories, GPUs, program, the two defaults), checked
    by the profile's own rules and rendered again. The only unit text rollback writes back."""
    from hkgpu_tune.backends.mps import safe_root as root_of
    if not isinstance(text, str) or len(text) > 65536 or not text.startswith("# Rendered by hkgpu-tune (mps"):
        return False
    f = dict(ln.split("=", 1) for ln in text.split("\n")
             if "=" in ln and ln.split("=", 1)[0] in ("User", "ExecStart"))
    env = dict(ln[len("Environment="):].split("=", 1) for ln in text.split("\n") if ln.startswith("Environment="))
    pct = re.findall(r"echo set_default_active_thread_percentage ([0-9]{1,3}) ", text)
    pinned = re.findall(rf"echo set_default_device_pinned_mem_limit ([0-9]{{1,2}}) ({SIZE_RE}) ", text)
    exe = (f.get("ExecStart") or "").removesuffix(" -d")
    dirs = [env.get("CUDA_MPS_PIPE_DIRECTORY", ""), env.get("CUDA_MPS_LOG_DIRECTORY", "")]
    if not (re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", f.get("User", "")) and len(pct) <= 1
            and re.fullmatch(rf"/[A-Za-z0-9_./-]{{1,255}}/{CONTROL}", exe) and os.path.normpath(exe) == exe
            and all(re.fullmatch(r"/[A-Za-z0-9_./-]{1,255}", d) and os.path.normpath(d) == d and root_of(d)
                    for d in dirs)):
        return False
    gpus = env.get("CUDA_VISIBLE_DEVICES")
    if gpus is not None:
        from hkgpu_tune.serve.schema.devices import MIG_RE
        parts = gpus.split(",")
        if not (len(parts) == 1 and re.fullmatch(MIG_RE, parts[0])
                or all(re.fullmatch(r"[0-9]{1,4}", g) for g in parts)):
            return False
        gpus = tuple(g if g.startswith("MIG-") else int(g) for g in parts)
    cfg = MpsProfile(pipe_dir=dirs[0], log_dir=dirs[1], gpus=gpus, user=f["User"],
                     default_active_thread_percentage=int(pct[0]) if pct else None,
                     default_pinned_mem_limit=tuple((int(d), sz) for d, sz in pinned))
    try:
        return render_unit(cfg, exe, gpus) == text
    except HkError:
        return False


# systemd makes (and owns) a service's directories under these roots; nothing else is chowned
_UNIT_DIRS = {"/run": ("RuntimeDirectory", "/run"), "/var/run": ("RuntimeDirectory", "/var/run"),
              "/var/log": ("LogsDirectory", "/var/log"), "/var/lib/hkgpu-tune": ("StateDirectory", "/var/lib")}


def _unit_dir_lines(cfg: MpsProfile) -> list[str]:
    """Directory lines of the unit: systemd's own RuntimeDirectory= / LogsDirectory= /
    StateDirectory= where the directory lies under /run, /var/log or /var/lib/hkgpu-tune; elsewhere
    (/tmp, /srv) the unit only checks that apply made it, a real directory and not a link."""
    groups: dict[str, list[tuple[str, int]]] = {}
    out = []
    for key, mode in DIR_MODES.items():
        path = getattr(cfg, key)
        kind = _UNIT_DIRS.get(safe_root(path) or "")
        if kind is None:
            q = shlex.quote(path)
            out.append("ExecStartPre=" + unitfile.exec_line(["/bin/sh", "-c", f"test -d {q} && test ! -L {q}"]))
            continue
        groups.setdefault(kind[0], []).append((path[len(kind[1]) + 1:], mode))
    for directive, dirs in groups.items():
        out.append(f"{directive}={' '.join(unitfile.word(d, 'mps directory') for d, _ in dirs)}")
        out.append(f"{directive}Mode={dirs[0][1]:04o}")
        if directive == "RuntimeDirectory":
            out.append("RuntimeDirectoryPreserve=yes")   # clients keep the pipes across a restart
        base = {"RuntimeDirectory": "/run", "LogsDirectory": "/var/log", "StateDirectory": "/var/lib"}[directive]
        out += ["ExecStartPre=+" + unitfile.exec_line(["/bin/chmod", f"{m:04o}", f"{base}/{d}"])
                for d, m in dirs[1:] if m != dirs[0][1]]
    return out


class Plugin(Subsystem):
    name = "mps"

    @property
    def cfg(self) -> MpsProfile:
        return self.profile.section("mps") or MpsProfile()

    @property
    def mps(self):
        m = self.b.__dict__.get("mps")
        if m is None:
            from hkgpu_tune.backends.mps import MpsControl
            m = self.b.__dict__["mps"] = MpsControl(self.b.cmd)
        return m

    @property
    def mig(self) -> str | None:
        from hkgpu_tune.serve.schema.devices import is_mig
        g = self.cfg.gpus
        return g[0] if g and is_mig(g[0]) else None

    def _served(self, strict: bool = False):
        """The GPUs the daemon serves as CUDA_VISIBLE_DEVICES names them: a MIG position resolved to
        its UUID now (strict: HkError where there is none; else the position as written)."""
        from hkgpu_tune.serve.schema.devices import is_mig_pos, resolve
        g = self.cfg.gpus
        if g and is_mig_pos(g[0]):
            try:
                return (resolve(self.b.nvml, g[0]),)
            except HkError:
                if strict:
                    raise
        return g

    def _gpus(self):
        """Indices MPS serves (None = all) and the compute modes of those GPUs, or a reason."""
        try:
            if self.mig:   # the parent GPU's compute mode
                from hkgpu_tune.backends.mig import find as find_mig
                d = find_mig(self.b.nvml, self.mig)
                idx = [d["gpu"]] if d else []
            else:
                idx, _ = select(self.b.nvml, self.cfg.gpus)
            modes = {i: self.b.nvml.gpu(i, ("compute_mode",))["compute_mode"] for i in idx}
            return idx, modes, ""
        except UnsupportedError as e:
            return self.cfg.gpus, {}, str(e)

    def read(self) -> dict:
        c = self.cfg
        st = {"binary": self.mps.binary(), "dirs": {k: dir_state(getattr(c, k)) for k in DIR_MODES}}
        gpus, st["compute_modes"], st["nvml"] = self._gpus()
        st["gpus"] = list(gpus) if gpus is not None else None
        if self.mig and self.cfg.enabled:
            from hkgpu_tune.serve.schema.devices import mig_check
            st["mig"] = mig_check(self.b.nvml, self.mig)
        sd = self.b.systemd
        st["systemd"] = sd.available()
        if st["systemd"]:
            st["unit"] = {"text": sd.read_unit(c.unit), "active": sd.is_active(c.unit), "enabled": sd.is_enabled(c.unit)}
        st["health"] = {"alive": False}
        st["pinned_mem_limit"] = {}
        if st["binary"]:
            try:
                st["health"] = self.mps.health(c.pipe_dir)
                if st["health"]["alive"]:
                    st["running"] = self.mps.daemon(c.pipe_dir)
                    for d, _ in c.default_pinned_mem_limit:
                        st["pinned_mem_limit"][d] = self.mps.send(c.pipe_dir, f"get_default_device_pinned_mem_limit {d}")
            except HkError as e:
                st["health"] = {"alive": False, "error": str(e)}
        return st

    def _unit_text(self, st):
        return render_unit(self.cfg, st["binary"] or f"/usr/bin/{CONTROL}", self.cfg.gpus)

    def compare(self, st):
        c, res = self.cfg, []
        if not st["binary"]:
            why = f"{CONTROL} not found (NVIDIA driver utilities not installed)"
            return [self.result("mps", "daemon", None, "running" if c.enabled else "stopped",
                                UNSUPPORTED if c.enabled else OK, why, required=c.enabled)]
        want_daemon = "running" if c.enabled else "stopped"
        if c.enabled:
            for k, mode in DIR_MODES.items():
                res.append(self._cmp_dir(k, mode, st["dirs"].get(k)))
            if st["systemd"]:
                text = self._unit_text(st)
                cur = st["unit"]["text"]
                if cur == text:
                    res.append(self.result("mps", "unit", c.unit, c.unit, OK))
                elif cur is not None and not unit_is_rendered(cur):
                    # an admin's own unit: overwriting it would leave rollback a text it may not trust
                    res.append(self.result("mps", "unit", "not hkgpu-tune's", c.unit, ERROR,
                                           f"unit file {c.unit} exists and is not one "
                                           "hkgpu-tune rendered: left as it is (remove it, or name another "
                                           "unit in mps.unit)"))
                else:
                    res.append(self.result("mps", "unit", None if cur is None else "differs", c.unit, DRIFT,
                                           "unit file missing" if cur is None else "unit file differs from the profile",
                                           write=text, data={"unit": c.unit, "old": cur}))
            else:
                res.append(self.result("mps", "unit", None, c.unit, UNSUPPORTED,
                                       f"{self.b.systemd.why_not()}: the daemon is started directly",
                                       required=False))
        h = st["health"]
        cur_daemon = "running" if h.get("alive") else "stopped"
        if cur_daemon == want_daemon:
            res.append(self.result("mps", "daemon", cur_daemon, want_daemon, OK,
                                   f"servers {h.get('servers')}" if h.get("alive") else ""))
        else:
            res.append(self.result("mps", "daemon", cur_daemon, want_daemon, DRIFT,
                                   h.get("error") or ("not answering on " + c.pipe_dir if c.enabled
                                                      else "running but the profile disables it"),
                                   write=want_daemon, data={"systemd": st["systemd"]}))
        if not c.enabled:
            return res
        if h.get("alive") and st.get("running"):
            res.append(self._cmp_running(st["running"], st["systemd"]))
        down = "" if h.get("alive") else " (daemon not running: sent after start)"
        if c.default_active_thread_percentage is not None:
            cur, want = h.get("default_active_thread_percentage"), float(c.default_active_thread_percentage)
            res.append(self.result("mps", "default_active_thread_percentage", cur, want,
                                   OK if cur == want else DRIFT, "" if cur == want else "differs" + down,
                                   write=want if cur != want else None))
        for d, size in c.default_pinned_mem_limit:
            cur = st["pinned_mem_limit"].get(d)
            same = cur is not None and to_bytes(cur) == to_bytes(size)
            res.append(self.result(f"mps dev{d}", "default_pinned_mem_limit", cur, size,
                                   OK if same else DRIFT, "" if same else "differs" + down,
                                   write=None if same else size, data={"device": d}))
        if "mig" in st:
            status, current, why = st["mig"]
            res.append(self.result(self.mig, "mig_device", current or None, "present",
                                   {"ok": OK, "drift": DRIFT}.get(status, UNSUPPORTED), why))
        # MPS needs compute mode default or exclusive_process on the GPUs it serves
        if st["nvml"]:
            res.append(self.result("mps", "compute_mode", None, "default|exclusive_process", UNSUPPORTED, st["nvml"]))
        for i, mode in sorted(st["compute_modes"].items()):
            if mode in ("default", "exclusive_process"):
                res.append(self.result(f"gpu{i}", "compute_mode", mode, "default|exclusive_process", OK,
                                       "" if mode == "exclusive_process" else
                                       "works with MPS; exclusive_process keeps non-MPS clients off the GPU",
                                       required=False))
            else:
                res.append(self.result(f"gpu{i}", "compute_mode", mode, "default|exclusive_process", DRIFT,
                                       f"MPS cannot serve a GPU in {mode} mode: set gpu.compute_mode"))
        return res

    def _cmp_running(self, run: dict, systemd: bool):
        """The running daemon's user, GPUs and log directory against the profile: a daemon started
        before the unit changed keeps its old ones until it is restarted."""
        c = self.cfg
        want = {"user": c.user, "log_dir": c.log_dir}
        if c.gpus is not None:
            want["gpus"] = ",".join(str(g) for g in self._served())
        have = {k: run.get(k) for k in want}
        cur, des = _settings(have), _settings(want)
        if have == want:
            return self.result("mps", "running_daemon", cur, des, OK, f"pid {run['pid']}")
        diff = "; ".join(f"{k} {have[k]!r}, profile {want[k]!r}" for k in want if have[k] != want[k])
        return self.result("mps", "running_daemon", cur, des, DRIFT,
                           f"the running daemon (pid {run['pid']}) has {diff} (apply restarts it, and the "
                           f"Triton service that is its client)", write="restarted", data={"systemd": systemd})

    def _cmp_dir(self, key, mode, cur):
        """A missing directory is made (and given to the user); an existing one only has its mode
        set, and only when it already belongs to the user and no one else can write it."""
        c = self.cfg
        path, want = getattr(c, key), f"{mode:04o} {c.user}"
        if cur == want:
            return self.result("mps", key, cur, want, OK, path)
        if cur is None:
            return self.result("mps", key, cur, want, DRIFT, f"{path}: missing", write=want,
                               data={"path": path, "mode": mode})
        if cur in ("link", "not a directory"):
            return self.result("mps", key, cur, want, ERROR, f"{path}: {cur}: refused (not replaced, not followed)")
        cur_mode, owner = cur.split()
        if owner != c.user or int(cur_mode, 8) & 0o022:
            return self.result("mps", key, cur, want, ERROR,
                               f"{path}: exists, not made by hkgpu-tune and owned by {owner} or writable by others: "
                               "not taken over (remove it or fix it by hand)")
        return self.result("mps", key, cur, want, DRIFT, f"{path}: mode differs", write=want,
                           data={"path": path, "mode": mode})

    # ------------------------------------------------------------ write
    def write(self, target, key, value, data):
        c = self.cfg
        if key in DIR_MODES:
            if value is None:      # restore of a directory apply made: it stays (logs)
                return
            mode, owner = value.split()
            if value == f"{data['mode']:04o} {c.user}":
                ensure_dir(data["path"], data["mode"], c.user)
            else:                  # restore: the old mode only; the owner was never changed
                set_dir_mode(data["path"], int(mode, 8))
            return
        if key == "unit":
            self.b.systemd.write_unit(data["unit"], value if value not in (None, "differs") else data.get("old"))
            self.b.systemd.daemon_reload()
            return
        if key == "running_daemon":
            self.restart(data.get("systemd"))
            return
        if key == "daemon":
            if value == "running":
                self.start(data.get("systemd"))
            elif value == "stopped":
                self.stop(data.get("systemd"))
            return
        if value is None:
            return
        if key == "default_active_thread_percentage":
            self.mps.send(c.pipe_dir, f"set_default_active_thread_percentage {int(float(value))}")
        elif key == "default_pinned_mem_limit":
            self.mps.send(c.pipe_dir, f"set_default_device_pinned_mem_limit {data['device']} {value}")

    # ------------------------------------------------------------ library verbs (also `hkgpu-tune mps`)
    def start(self, use_systemd: bool | None = None) -> dict:
        """Start the daemon (systemd unit where systemd runs, else directly), send the settings, probe."""
        c = self.cfg
        if not self.mps.binary():
            raise UnsupportedError(f"{CONTROL} not found (NVIDIA driver utilities not installed)")
        for k, mode in DIR_MODES.items():
            ensure_dir(getattr(c, k), mode, c.user)
        if use_systemd is None:
            use_systemd = self.b.systemd.available()
        if use_systemd:
            self.b.systemd.enable(c.unit)
        elif not self.mps.alive(c.pipe_dir):
            self.mps.start(c.pipe_dir, c.log_dir, gpus=self._served(strict=True), user=c.user)
        self.configure()
        return self.mps.health(c.pipe_dir)

    def restart(self, use_systemd: bool | None = None) -> dict:
        """The daemon stopped and started again with the profile's settings. The Triton service
        that is its client is stopped first and started (and waited for) after: its CUDA context
        belongs to the old daemon."""
        from hkgpu_tune.subsystems import triton as triton_sub
        c = self.cfg
        if use_systemd is None:
            use_systemd = self.b.systemd.available()
        from hkgpu_tune.serve.running import launch
        clients = [t for t in triton_sub.services(self.profile)   # every service that is this daemon's client
                   if t.mps is not None and t.mps.pipe_dir == c.pipe_dir and launch.status(t, self.b)["active"]]
        for t in clients:
            launch.stop(t, self.b)
        if use_systemd:
            self.b.systemd.stop(c.unit)
        self.mps.stop(c.pipe_dir)
        health = self.start(use_systemd)
        for t in clients:
            launch.start(t, self.b)
        for t in clients:
            launch.wait_ready(t, self.b)
        return health

    def configure(self) -> None:
        c = self.cfg
        if c.default_active_thread_percentage is not None:
            self.mps.send(c.pipe_dir, f"set_default_active_thread_percentage {c.default_active_thread_percentage}")
        for d, size in c.default_pinned_mem_limit:
            self.mps.send(c.pipe_dir, f"set_default_device_pinned_mem_limit {d} {size}")

    def stop(self, use_systemd: bool | None = None) -> None:
        c = self.cfg
        if use_systemd is None:
            use_systemd = self.b.systemd.available()
        if use_systemd:
            self.b.systemd.disable(c.unit)
        self.mps.stop(c.pipe_dir)

    def health(self) -> dict:
        return self.mps.health(self.cfg.pipe_dir)


def _settings(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


# ---------------------------------------------------------------- the setting types (state.json)
def _check_param(c) -> None:
    fields.text(c.target, "target", maxlen=64)
    d = c.data
    if c.key in ("pipe_dir", "log_dir"):
        fields.abspath(d.get("path"), "data.path")
        if not safe_root(d["path"]):
            fields.fail(f"data.path: {d['path']!r} is not a directory the tool may manage")
        fields.integer(d.get("mode"), "data.mode", 0, 0o777)
        for k, v in (("original", c.current), ("desired", c.desired)):
            if v is not None and not (isinstance(v, str) and re.fullmatch(r"[0-7]{3,4} [A-Za-z0-9_.-]{1,32}|link|"
                                                                            r"not a directory", v)):
                fields.fail(f"{k}: {v!r} is not 'MODE OWNER'")
    elif c.key == "unit":
        fields.text(d.get("unit"), "data.unit", maxlen=128)
        if not re.fullmatch(r"[A-Za-z0-9:_.@-]+\.service", d["unit"]):
            fields.fail(f"data.unit: {d['unit']!r} is not a service unit name")
        fields.text(d.get("old"), "data.old", lines=True, maxlen=1 << 20, none=True)
        fields.one_of(c.current, "original", (None, "differs"))
        fields.text(c.desired, "desired", lines=True, maxlen=1 << 20, none=True)
        if d.get("old") is not None and not unit_is_rendered(d["old"]):   # the text rollback writes back
            fields.fail("data.old: not a unit hkgpu-tune renders for any mps section: refused")
    elif c.key == "daemon":
        fields.one_of(c.current, "original", ("running", "stopped"))
        fields.one_of(c.desired, "desired", ("running", "stopped"))
        fields.boolean(d.get("systemd"), "data.systemd", none=True)
    elif c.key == "running_daemon":   # a restart; its original is what the daemon ran with
        fields.text(c.current, "original", maxlen=1024, none=True)
        fields.one_of(c.desired, "desired", ("restarted",))
        fields.boolean(d.get("systemd"), "data.systemd", none=True)
    elif c.key == "default_active_thread_percentage":
        fields.number(c.current, "original", 0, 100, none=True)
        fields.number(c.desired, "desired", 0, 100, none=True)
    elif c.key == "default_pinned_mem_limit":
        fields.integer(d.get("device"), "data.device", 0, 1023)
        for k, v in (("original", c.current), ("desired", c.desired)):
            if v is not None and not (isinstance(v, str) and re.fullmatch(r"[0-9A-Za-z.]{1,32}", v)):
                fields.fail(f"{k}: {v!r} is not a memory size")
    else:
        fields.fail(f"key: {c.key!r} is not an MPS setting")


SPEC = Spec(name="mps", order=90, section="mps", plugin=Plugin, persist="unit", sections={"mps": parse_profile},
            types=(SettingType("mps.param", "mps", _check_param),))
