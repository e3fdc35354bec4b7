"""The run leaves the host as it found it: no file appears or changes in the places the tool writes on
a real node (its /etc and state directories, sysctl.d, systemd units), and the uplink keeps its MTU.
A simulated host whose private /etc did not take (a bind mount that `ip netns exec` skipped) writes
here; this makes that a failed run, not a silent leak."""
from __future__ import annotations

import os

PATHS = ("/etc/hkgpu-tune", "/etc/sysctl.d", "/etc/systemd/system", "/etc/NetworkManager/system-connections",
         "/var/lib/hkgpu-tune", "/etc/modprobe.d")


def snapshot() -> dict:
    out: dict = {}
    for top in PATHS:
        for d, _, files in os.walk(top):
            for f in files:
                p = os.path.join(d, f)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                out[p] = (st.st_size, st.st_mtime_ns)
    try:
        with open("/sys/class/net/eth0/mtu") as f:
            out["eth0 mtu"] = f.read().strip()
    except OSError:
        pass
    return out


def register(config) -> None:
    config._hkgpu_host_snapshot = snapshot()


def check(session) -> list[str]:
    before = getattr(session.config, "_hkgpu_host_snapshot", None)
    if before is None or os.environ.get("HKGPU_TESTS_SHARED_HOST") == "1":
        return []    # HKGPU_TESTS_SHARED_HOST=1: other work on this machine writes these paths too
    after = snapshot()
    return sorted(k for k, v in after.items() if before.get(k) != v)
