"""verify opens netlink (and imports pyroute2, about 70 ms) only where a profile rule can match a
device that /sys shows; a device /sys cannot settle counts as a possible match."""
import glob
import os
import subprocess
import sys

from hkgpu_tune.core.match import could_match
from hkgpu_tune.core.profile import Match

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Rule:
    def __init__(self, **kw):
        self.match = Match(**kw)


PCI_NIC = {"name": "ens1f0", "mac": "0c:42:a1:00:00:01", "driver": "mlx5_core", "pci": "0000:17:00.0"}
VETH = {"name": "hkdata0", "mac": "5e:00:00:00:00:01", "driver": None, "pci": None}


def test_could_match_excludes_only_what_sys_settles():
    assert could_match([Rule(driver="mlx5_core")])(PCI_NIC)
    assert not could_match([Rule(driver="ice")])(PCI_NIC)
    # a virtual device's kind is known only to netlink: a link kind may match it, a bus driver never
    assert could_match([Rule(driver="veth")])(VETH)
    assert not could_match([Rule(driver="mlx5_core")])(VETH)
    assert could_match([Rule(name="ens*")])(PCI_NIC) and not could_match([Rule(name="ens*")])(VETH)
    assert not could_match([Rule(pci="0000:18:00.0")])(PCI_NIC)
    # the permanent MAC and the default route are not in /sys: never a reason to skip netlink
    assert could_match([Rule(mac="aa:bb:cc:dd:ee:ff")])(PCI_NIC)
    assert could_match([Rule(default_route=True)])(VETH)
    assert not could_match([])(PCI_NIC)


def test_verify_of_rules_that_match_nothing_here_imports_no_pyroute2():
    drivers = {os.path.basename(os.path.realpath(p)) for p in glob.glob("/sys/class/net/*/device/driver")}
    if "mlx5_core" in drivers:
        import pytest
        pytest.skip("this host has an mlx5 NIC: the default profile's rules match it")
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "hkgpu_tune", "verify", "--json",
                        "--only", "link,ethtool,qdisc", "--profile", "hk-inference"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode in (0, 2), p.stderr[-2000:]
    assert "pyroute2" not in p.stderr
    assert '"no interface on this host matches"' in p.stdout
