"""The hkgpu_verify role's export service runs as root every few minutes on every node: it runs at low
priority, spread over the rack, and sandboxed (systemd-analyze security on the rendered unit)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.triton.test_systemd_analyze import verify_role_units

SERVICE, TIMER = "hkgpu-tune-verify.service", "hkgpu-tune-verify.timer"


def directives(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if re.match(r"^[A-Z][A-Za-z]+=", line))


def test_low_priority_and_spread_over_the_rack():
    units = verify_role_units()
    svc, timer = directives(units[SERVICE]), directives(units[TIMER])
    assert int(svc["Nice"]) >= 10 and svc["IOSchedulingClass"] == "idle"
    assert timer["RandomizedDelaySec"] and timer["RandomizedDelaySec"] != "0"


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed (Debian's systemd)")
def test_the_export_service_is_sandboxed(tmp_path):
    (tmp_path / SERVICE).write_text(verify_role_units()[SERVICE])
    r = subprocess.run(["systemd-analyze", "security", "--offline=true", str(tmp_path / SERVICE)],
                       capture_output=True, text=True, timeout=120)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d)", r.stdout + r.stderr)
    assert m, r.stdout[-2000:] + r.stderr[-2000:]
    # 9.6 without a sandbox; NVML needs /dev/nvidia*, the probes raw sockets and the health hooks
    # whatever they call, so devices, capabilities and system calls stay open
    assert float(m.group(1)) <= 6.5, r.stdout[-3000:]
