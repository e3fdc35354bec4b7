"""tests.cpu_limit: a process in the group gets its share of a CPU and no more, whatever the machine,
and the group is gone afterwards."""
import os
import subprocess
import sys

import pytest

from tests.cpu_limit import NoCpuController, cpu_share
from tests.helpers import RUN_TAG

SPIN = "import time\nt = time.time() + 1.0\nwhile time.time() < t: pass\nprint(time.process_time())"


def test_a_process_in_the_group_gets_its_share_of_a_cpu():
    try:
        with cpu_share(0.1) as enter:
            p = subprocess.run([sys.executable, "-c", SPIN], capture_output=True, text=True, timeout=30,
                               preexec_fn=enter)
            group = open(f"/proc/{os.getpid()}/cgroup").read()
    except NoCpuController as e:
        pytest.skip(str(e))
    assert p.returncode == 0, p.stderr
    # a second of wall time spinning: a tenth of it on the CPU, give or take a period's quota
    # (the interpreter's start-up counts too)
    assert float(p.stdout) < 0.35, p.stdout
    assert "hkgpu-test-cpu" not in group   # the test process itself stays outside
    for part in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup"):
        if os.path.isdir(part):
            assert not [e for e in os.listdir(part) if e.startswith("hkgpu-test-cpu") and e.endswith(f"-{RUN_TAG}")]
