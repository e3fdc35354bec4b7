"""A real reboot: apply --persist in a Debian VM (systemd, a kernel with fq_codel, a virtio NIC),
reboot, and verify that everything came back; then rollback, reboot, and see the originals.
Software-emulated (TCG), reached over SSH on loopback only."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from .vm import HERE, VM

pytestmark = [pytest.mark.root, pytest.mark.slow]

IMG = os.environ.get("HKGPU_VM_DIR", "/var/cache/hkgpu-tune/vm")

PROFILE = """\
name: vm-test
network:
  interfaces:
    - match: {name: eth1}
      mtu: 9000
      channels: {combined: max}
      rings: {rx: max, tx: max}
      offloads: {gro: false, lro: false}   # the driver turns gro on at boot: the boot unit must turn it off
      qdisc: fq_codel
  probe: {gateway: false}
sysctl:
  net.core.rmem_max: 268435456
  net.core.wmem_max: 268435456
  net.core.netdev_max_backlog: 250000
  net.core.default_qdisc: fq_codel
  net.ipv4.tcp_rmem: 4096 87380 268435456
  net.ipv4.tcp_wmem: 4096 65536 268435456
  net.ipv4.tcp_mtu_probing: 1
"""


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    missing = [p for p in ("qemu-system-x86_64", "debootstrap", "mkfs.ext4", "ssh") if not shutil.which(p)]
    if missing:
        pytest.skip(f"VM test needs {', '.join(missing)} (scripts/apt-packages.txt installs them)")
    b = subprocess.run([os.path.join(HERE, "build.sh"), IMG], capture_output=True, text=True, timeout=900)
    assert b.returncode == 0, f"image build failed:\n{b.stdout}\n{b.stderr}"
    log = str(tmp_path_factory.mktemp("vm") / "console.log")
    m = VM(IMG, log)
    m.start()
    try:
        m.boot_s = m.wait_ssh()
        # the image may be cached: install the code under test
        wheels = tmp_path_factory.mktemp("wheel")
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels),
                        os.path.dirname(os.path.dirname(HERE))], check=True, capture_output=True)
        whl = next(wheels.glob("*.whl"))
        m.put(str(whl), f"/tmp/{whl.name}")
        m.ssh(f"/opt/hkgpu-tune/bin/pip install -q --no-index --no-deps --force-reinstall /tmp/{whl.name}", check=True)
        yield m
    finally:
        m.stop()


def verify(vm):
    p = vm.ssh("hkgpu-tune verify --json --profile /root/vm.yaml", timeout=300)
    assert p.stdout, p.stderr
    return p.returncode, json.loads(p.stdout)


def status(doc):
    return {(r["subsystem"], r["target"], r["key"]): r["status"] for r in doc["results"]}


def test_persist_survives_reboot_then_rollback(vm):
    vm.ssh(f"cat > /root/vm.yaml <<'EOF'\n{PROFILE}EOF", check=True)
    # a site whose default qdisc is pfifo_fast (Debian's own default is fq_codel)
    vm.ssh("echo net.core.default_qdisc=pfifo_fast > /etc/sysctl.d/55-site-qdisc.conf && "
           "sysctl -qw net.core.default_qdisc=pfifo_fast && tc qdisc replace dev eth1 root pfifo_fast", check=True)
    rc, before = verify(vm)
    assert rc == 2
    s = status(before)
    # this kernel has fq_codel: drift (fixable), not unsupported
    assert s[("sysctl", "host", "net.core.default_qdisc")] == "drift"
    assert s[("qdisc", "eth1", "root")] == "drift"
    assert s[("link", "eth1", "mtu")] == "drift"
    assert s[("ethtool", "eth1", "rings rx")] == "ok"  # virtio has ring parameters
    assert s[("ethtool", "eth1", "gro")] == "drift"

    p = vm.ssh("hkgpu-tune apply --persist --json --profile /root/vm.yaml", timeout=300)
    doc = json.loads(p.stdout)
    assert doc["error"] == "" and p.returncode == 0, doc.get("failures") or p.stderr
    assert any("systemd-networkd" in x for x in doc["persisted"])  # networkd owns eth1's MTU
    assert vm.ssh("tc qdisc show dev eth1", check=True).stdout.startswith("qdisc fq_codel")

    vm.reboot()
    rc, after = verify(vm)
    assert rc == 0, [f for f in after["failures"]]
    assert "mtu 9000" in vm.ssh("ip link show eth1", check=True).stdout
    assert "generic-receive-offload: off" in vm.ssh("ethtool -k eth1", check=True).stdout
    assert vm.ssh("tc qdisc show dev eth1", check=True).stdout.startswith("qdisc fq_codel")
    assert vm.ssh("sysctl -n net.core.default_qdisc", check=True).stdout.strip() == "fq_codel"
    unit = vm.ssh("systemctl show -p ActiveState,Result hkgpu-tune.service", check=True).stdout
    assert "ActiveState=active" in unit and "Result=success" in unit

    p = vm.ssh("hkgpu-tune rollback --profile /root/vm.yaml", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    rc, rolled = verify(vm)
    s = status(rolled)
    assert s[("link", "eth1", "mtu")] == "drift" and s[("qdisc", "eth1", "root")] == "drift"
    vm.reboot()
    rc, again = verify(vm)
    s = status(again)
    for key in (("link", "eth1", "mtu"), ("sysctl", "host", "net.core.default_qdisc"),
                ("sysctl", "host", "net.ipv4.tcp_mtu_probing"), ("sysctl", "host", "net.core.rmem_max")):
        assert s[key] == "drift", key
    assert vm.ssh("ls /etc/sysctl.d/60-hkgpu-tune.conf /etc/systemd/system/hkgpu-tune.service 2>&1; true").stdout.count(
        "No such file") == 2
