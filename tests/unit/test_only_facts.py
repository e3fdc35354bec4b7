"""`verify/plan/apply --only` naming only subsystems that verify nothing (facts-only: firewall,
rdma) is an error naming them, never a green run of nothing (issue 33, item 6); `facts --only`
still reads them, and with another subsystem beside them the run goes on."""
import os
import subprocess
import sys

import pytest

from hkgpu_tune import subsystems
from tests.helpers import REPO

PROFILE = "name: t\nnetwork:\n  interfaces:\n    - {match: {name: lo}, optional: true}\nsysctl:\n  net.ipv4.tcp_mtu_probing: 1\n"


def hk(tmp_path, *args):
    p = tmp_path / "p.yaml"
    p.write_text(PROFILE)
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args, "--profile", str(p)], capture_output=True,
                          text=True, timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})


FACTS_ONLY = [n for n in subsystems.ORDER if subsystems.get(n).facts_only]


def test_the_facts_only_subsystems_are_the_ones_that_verify_nothing():
    assert FACTS_ONLY == ["firewall", "rdma"]


@pytest.mark.parametrize("cmd", ["verify", "plan"])
def test_only_facts_only_subsystems_is_an_error(tmp_path, cmd):
    r = hk(tmp_path, cmd, "--only", ",".join(FACTS_ONLY), "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 1 and "only report facts" in r.stderr and "firewall" in r.stderr, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_facts_still_reads_them(tmp_path):
    r = hk(tmp_path, "facts", "--only", "firewall", "--json")
    assert r.returncode == 0 and '"firewall"' in r.stdout, r.stderr
