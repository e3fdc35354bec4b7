"""`hkgpu-tune mig-env` runs as root in a service unit's ExecStartPre and writes the unit's
EnvironmentFile under /run/hkgpu-tune. Whoever can write that directory sets the service's
environment (LD_PRELOAD=...), so a directory another user owns, one open to all, or a link there is
refused before anything else is done: one line naming it, exit 1, nothing written. Each case runs
in a mount namespace of its own with a tmpfs on /run, so the host's /run is never touched."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOBODY = 65534

pytestmark = pytest.mark.root

CASES = {
    "owned by another user": "mkdir -m 0755 /run/hkgpu-tune && chown 65534:65534 /run/hkgpu-tune",
    "writable by all": "mkdir -m 0777 /run/hkgpu-tune && chmod 0777 /run/hkgpu-tune",
    "a link to another user's directory": "mkdir -m 0755 /run/theirs && chown 65534:65534 /run/theirs && "
                                          "ln -s /run/theirs /run/hkgpu-tune",
}


@pytest.mark.parametrize("case", list(CASES))
def test_mig_env_refuses_a_directory_another_user_could_write(case):
    script = (f"mount -t tmpfs -o mode=0755,size=64k hk-run /run\n{CASES[case]}\n"
              f"{sys.executable} -m hkgpu_tune mig-env mig:0/1 /run/hkgpu-tune/mig-triton.env && echo rc=0 || echo rc=$?\n"
              "echo files left: $(find /run/hkgpu-tune/ /run/theirs -mindepth 1 2>/dev/null | wc -l)\n")
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", script], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "rc=1" in out, out
    assert "Traceback" not in out and "refused" in out, out
    assert "MIG environment directory" in out and ("/run/hkgpu-tune" in out or "/run/theirs" in out), out
    assert "files left: 0" in p.stdout, out
