"""The shapes of what the tool itself renders for the Triton service, checked on what a state file
hands back to root: a container command (rollback respawns it) and a unit text (rollback writes it
into /etc/systemd/system). Anything the renderer (serve.running.forms) cannot produce is refused: no option,
directive or variable beyond the ones it writes, whatever programs they name.

>>> check_container_argv(["/usr/bin/podman", "run", "--privileged", "-v", "/:/host", "img"])
Traceback (most recent call last):
...
hkgpu_tune.core.errors.HkError: triton: the saved container command has '--privileged' where the tool writes '--rm': refused
"""
from __future__ import annotations

import os
import re
import shlex

from hkgpu_tune.core.errors import HkError

_UNIT = r"[A-Za-z0-9][A-Za-z0-9:_.@-]{0,200}"
_USER = r"[a-z_][a-z0-9_-]{0,31}"
_CPUS = r"[0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?)*"
_GPUS = r"(MIG-[0-9a-fA-F-]{1,64}|[0-9]{1,4})(,(MIG-[0-9a-fA-F-]{1,64}|[0-9]{1,4}))*"
_IMAGE = r"[A-Za-z0-9][A-Za-z0-9._/:@-]*"
_SIZE = r"[0-9]+[kKmMgG]?"
_PATH = r"/[^\x00-\x1f\x7f]*"
_OPTION = r"--[a-z][a-z0-9-]*(=[^\x00-\x1f\x7f]*)?"
MPS_VARS = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
CONTAINER_REPO = "/models"
# what a respawn record or a binary unit may set: the variables forms.server_env() sets, nothing else
RECORD_ENV = ("LD_LIBRARY_PATH", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY",
              "CUDA_MPS_LOG_DIRECTORY", "HKGPU_PYTHON_LIBRARY", "HKGPU_PYTHON_HOME", "HKGPU_PYTHON_EXECUTABLE")
HARDENING = [
    "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
    "ProtectKernelTunables=yes", "ProtectKernelModules=yes", "ProtectKernelLogs=yes", "ProtectControlGroups=yes",
    "ProtectClock=yes", "ProtectHostname=yes", "RestrictSUIDSGID=yes", "RestrictRealtime=yes",
    "LockPersonality=yes", "RestrictNamespaces=yes", "SystemCallArchitectures=native",
    "CapabilityBoundingSet=", "AmbientCapabilities=",
]
RUNTIMES = ("docker", "podman")


def _refuse(what: str) -> HkError:
    return HkError(f"triton: {what}: refused")


def _mps_dir(d: str, what: str) -> None:
    from hkgpu_tune.backends.mps import safe_root
    if not (re.fullmatch(r"/[A-Za-z0-9_./-]{1,255}", d) and os.path.normpath(d) == d and safe_root(d)):
        raise _refuse(f"the saved {what} names {d!r}, not an MPS directory a profile may name")


def check_container_argv(argv) -> None:
    """argv is exactly what forms.container_argv writes: `RUNTIME run --rm --name UNIT [--detach]
    [--gpus device=..] --network host --ulimit memlock=-1 --ulimit stack=67108864 --shm-size S
    [--cpuset-cpus L] [--cpuset-mems L] [--user U] [--ipc=host (-e MPS_VAR=DIR)* (-v DIR:DIR)*]
    --volume REPO:/models:ro IMAGE tritonserver --option...`. HkError otherwise."""
    if not (isinstance(argv, list) and len(argv) >= 2 and all(isinstance(a, str) for a in argv)):
        raise _refuse("the saved container command is not a list of words")
    if os.path.basename(argv[0]) not in RUNTIMES or not os.path.isabs(argv[0]):
        raise _refuse(f"the saved container command runs {argv[0]!r}, not docker or podman by absolute path")
    rest = argv[1:]
    pos = 0

    def take(want: str, value: str | None = None, optional: bool = False) -> str | None:
        nonlocal pos
        have = rest[pos] if pos < len(rest) else None
        if have != want:
            if optional:
                return None
            raise _refuse(f"the saved container command has {have!r} where the tool writes {want!r}")
        pos += 1
        if value is None:
            return want
        v = rest[pos] if pos < len(rest) else ""
        if not re.fullmatch(value, v):
            raise _refuse(f"the saved container command's {want} {v!r} is not one the tool writes")
        pos += 1
        return v

    take("run")
    take("--rm")
    take("--name", _UNIT)
    take("--detach", optional=True)
    if take("--gpus", rf'device={_GPUS}|"device={_GPUS}"', optional=True) is None and pos < len(rest) \
            and rest[pos] == "--gpus":
        raise _refuse("the saved container command's --gpus is not one the tool writes")
    for opt, val in (("--network", "host"), ("--ulimit", "memlock=-1"), ("--ulimit", "stack=67108864"),
                     ("--shm-size", _SIZE)):
        take(opt, val)
    take("--cpuset-cpus", _CPUS, optional=True)
    take("--cpuset-mems", _CPUS, optional=True)
    take("--user", _USER, optional=True)
    if take("--ipc=host", optional=True):
        dirs = []
        while pos < len(rest) and rest[pos] == "-e":
            v = take("-e", rf"({'|'.join(MPS_VARS)})={_PATH}")
            d = v.partition("=")[2]
            _mps_dir(d, "container command's MPS variable")
            dirs.append(d)
        while pos < len(rest) and rest[pos] == "-v":
            v = take("-v", rf"{_PATH}:{_PATH}")
            a, _, b = v.partition(":")
            if a != b or a not in dirs:
                raise _refuse(f"the saved container command mounts {v!r}, not one of its MPS directories")
    vol = take("--volume", rf"{_PATH}:{re.escape(CONTAINER_REPO)}:ro")
    if os.path.normpath(vol.rsplit(":", 2)[0]) in ("/", "/etc", "/root", "/proc", "/sys", "/dev", "/boot"):
        raise _refuse(f"the saved container command mounts {vol!r} as its model repository")
    image = rest[pos] if pos < len(rest) else ""
    if not re.fullmatch(_IMAGE, image) or image.startswith("-"):
        raise _refuse(f"the saved container command's image {image!r} is not an image reference")
    pos += 1
    take("tritonserver")
    for a in rest[pos:]:
        if not re.fullmatch(_OPTION, a):
            raise _refuse(f"the saved container command passes {a!r}, not a tritonserver option")


# ---------------------------------------------------------------- the unit
_DESCRIPTION = "Triton Inference Server (hkgpu-tune)"
_COMMON = {"Type": r"simple", "LimitMEMLOCK": r"infinity", "LimitNOFILE": r"1048576",
           "LimitSTACK": r"67108864", "CPUAffinity": _CPUS, "NUMAPolicy": r"bind", "NUMAMask": _CPUS,
           "Restart": r"on-failure", "RestartSec": r"5", "TimeoutStopSec": r"[0-9]{1,6}",
           "KillMode": r"control-group"}
_UNIT_LIST = rf"{_UNIT}( {_UNIT})*"


def _hardening() -> dict:
    return dict(h.split("=", 1) for h in HARDENING)


def _words(value: str) -> list[str]:
    """An Exec line's words as systemd reads the tool's quoting back (unitfile.word)."""
    try:
        words = shlex.split(value, posix=True)
    except ValueError:
        raise _refuse(f"the saved unit's command {value[:80]!r} is not quoted as the tool writes") from None
    return [w.replace("%%", "%").replace("$$", "$") for w in words]


def _env(value: str) -> tuple[str, str]:
    v = value[1:-1].replace('\\"', '"').replace("\\\\", "\\") if value.startswith('"') else value
    k, _, val = v.replace("%%", "%").partition("=")
    if k not in (*RECORD_ENV, "CUDA_DEVICE_ORDER"):
        raise _refuse(f"the saved unit sets {k!r}, a variable the tool never writes")
    return k, val


def check_unit_text(text) -> list[list[str]]:
    """A Triton unit text from the state file: only what forms.render_unit writes (its sections,
    directives, hardening, variables and command shapes); returns the Exec commands (argv lists)
    for the caller's trust check of their programs. HkError otherwise."""
    if not isinstance(text, str) or len(text) > 1 << 20 or f"\nDescription={_DESCRIPTION}\n" not in text:
        raise _refuse("the saved unit is not one hkgpu-tune rendered")
    section, seen, execs, env = None, {}, {}, {}
    allowed = {"Unit": {"Description": re.escape(_DESCRIPTION), "After": _UNIT_LIST, "Wants": _UNIT_LIST},
               "Install": {"WantedBy": r"multi-user\.target"}}
    for ln in text.split("\n"):
        if not ln or ln.startswith("# placement: "):
            continue
        if ln in ("[Unit]", "[Service]", "[Install]"):
            section = ln[1:-1]
            continue
        key, eq, val = ln.partition("=")
        if not eq or section is None:
            raise _refuse(f"the saved unit has {ln[:80]!r}, a line the tool never writes")
        if section == "Service" and key.startswith("Exec"):
            if key in execs or key not in ("ExecStart", "ExecStartPre", "ExecStop", "ExecStopPost"):
                raise _refuse(f"the saved unit has {key}=, which the tool writes once or never")
            prefix = "-" if key in ("ExecStartPre", "ExecStopPost") else ""
            if prefix and not val.startswith(prefix) or not prefix and val[:1] in "-@:+!":
                raise _refuse(f"the saved unit's {key}= has a prefix the tool never writes")
            execs[key] = _words(val[len(prefix):])
            continue
        if section == "Service" and key == "Environment":
            k, v = _env(val)
            env[k] = v
            continue
        rule = (allowed.get(section) or {}).get(key)
        if section == "Service":
            rule = _COMMON.get(key) or {"User": _USER, "Group": _USER}.get(key)
            if key in ("ReadOnlyPaths", "ReadWritePaths", "BindPaths"):
                rule = r'("?/[^\x00-\x1f\x7f"]*"?)'
            elif key in _hardening() or key in ("NoNewPrivileges", "PrivateTmp", "ProtectHome"):
                rule = re.escape(_hardening().get(key, "yes"))
        if rule is None or not re.fullmatch(rule, val):
            raise _refuse(f"the saved unit has {ln[:80]!r}, a line the tool never writes")
        if key in seen and key not in ("ReadOnlyPaths", "ReadWritePaths", "BindPaths"):
            raise _refuse(f"the saved unit sets {key}= twice")
        seen[key] = val
    start = execs.get("ExecStart")
    if not start:
        raise _refuse("the saved unit has no ExecStart=")
    if os.path.basename(start[0]) == "tritonserver":   # the binary form: as a user, hardened
        if set(execs) != {"ExecStart"} or "User" not in seen:
            raise _refuse("the saved unit of a tritonserver binary runs more than the server, or as root")
        missing = [k for k in _hardening() if k not in seen]
        if missing:
            raise _refuse(f"the saved unit lacks the hardening the tool writes ({', '.join(missing)})")
        for a in start[1:]:
            if not re.fullmatch(_OPTION, a):
                raise _refuse(f"the saved unit passes {a!r}, not a tritonserver option")
    else:                                             # the container form
        check_container_argv(start)
        rt, name = start[0], start[start.index("--name") + 1]
        want = {"ExecStartPre": [rt, "rm", "--force", name], "ExecStopPost": [rt, "rm", "--force", name]}
        stop = execs.get("ExecStop") or []
        if set(execs) != {"ExecStart", "ExecStartPre", "ExecStop", "ExecStopPost"} or any(
                execs[k] != v for k, v in want.items()) or not (
                len(stop) == 5 and stop[:3] == [rt, "stop", "--time"] and stop[3].isdigit() and stop[4] == name):
            raise _refuse("the saved container unit's commands are not the ones the tool writes")
        if env or "User" in seen:
            raise _refuse("the saved container unit sets what the tool never writes there")
    return list(execs.values())
