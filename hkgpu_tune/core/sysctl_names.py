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


# Settings root must never write from a profile or a state file: a value the kernel runs as a program
# or reads as a path (core_pattern '|prog', modprobe, hotplug, poweroff_cmd, binfmt_misc), and the
# switches that turn the kernel's own protections off. The tool tunes the network, memory and the
# scheduler; none of these is a tuning.
_NEVER = re.compile(r"""(
    kernel\.(core_pattern|core_pipe_limit|modprobe|hotplug|poweroff_cmd|usermodehelper\..*|
             kptr_restrict|dmesg_restrict|perf_event_paranoid|unprivileged_bpf_disabled|
             unprivileged_userns_clone|randomize_va_space|kexec_load_disabled|modules_disabled|
             sysrq|yama\..*|seccomp\..*|keys\..*|cad_pid|ctrl-alt-del|io_uring_disabled|
             ftrace_enabled|stack_tracer_enabled|tainted|bpf_stats_enabled|apparmor.*|
             print-fatal-signals|panic_on_.*)|
    fs\.(binfmt_misc(\..*)?|protected_.*|suid_dumpable|mount-max)|
    vm\.(mmap_min_addr|unprivileged_userfaultfd|mmap_rnd.*)|
    net\.core\.(bpf_jit_.*)|
    dev\..*|user\..*|debug\..*|abi\..*|crypto\..*|sunrpc\..*
)""", re.X)
TREES = ("net", "vm", "kernel", "fs")


def forbidden(key: str) -> str | None:
    """Why root may not write this sysctl (from a profile or a state file), or None.

    >>> forbidden("kernel.core_pattern")
    'kernel.core_pattern runs a program or guards the kernel: hkgpu-tune never writes it'
    >>> forbidden("net.core.rmem_max") is None
    True
    """
    if key.split(".", 1)[0] not in TREES:
        return f"{key} is outside the trees hkgpu-tune tunes ({', '.join(TREES)})"
    if _NEVER.fullmatch(key):
        return f"{key} runs a program or guards the kernel: hkgpu-tune never writes it"
    return None
