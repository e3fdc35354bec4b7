"""What the network tuning buys, short form of bench/net_vm.py (docs/perf/network-vm-2026-12-07.json):
one path (HK-US west, 150 ms, shaped to RATE by tests/vm/netpath.py), the node stock and then after
`hkgpu-tune apply` of the shipped profile. Asserts the direction of each gain the record claims,
never a wall-clock figure:
- the node's own send buffer (Debian's tcp_wmem, 4 MiB) caps a single upload below the path's
  BDP; tuned (256 MiB) the same flow moves more;
- a download: the receive window (tcp_rmem, 6 MiB) caps stock; tuned moves more.
The record claims no latency or CPU-per-GB gain (see docs/tuning.md), so none is asserted here.
Stock here is Debian with a site's pfifo_fast (as test_node.py sets it; the same in any module
order). Runs last on the session's VM (file order); rolls back at the end.
"""
from __future__ import annotations

import json
import os

import pytest
import yaml

from hkgpu_tune.fleet.rack import run_playbook

from . import netpath
from .vm import DATA_MAC, PEER_ADDR, REPO

pytestmark = [pytest.mark.root, pytest.mark.slow]

CLI = "/opt/hkgpu-tune/bin/hkgpu-tune"
PROFILE = "/etc/hkgpu-tune/netproof.yaml"
RATE = 250              # Mbit/s: the record's; BDP at 150 ms is 4.7 MB, over what Debian's buffers allow
TESTS = (("up1", 1, False), ("down1", 1, True))


def profile() -> str:
    """The shipped profile for this node (virtio data NIC by MAC, the test's peer; no GPU here)."""
    with open(os.path.join(REPO, "hkgpu_tune", "profiles", "hk-inference.yaml")) as f:
        prof = yaml.safe_load(f)
    prof["network"]["interfaces"][0]["match"] = {"mac": DATA_MAC}
    prof["network"]["fabric_peers"] = [PEER_ADDR]
    prof["affinity"]["nics"][0]["match"] = {"mac": DATA_MAC}
    prof.pop("gpu")
    return yaml.safe_dump(prof, sort_keys=False)


def sysctl(vm, key: str) -> list[int]:
    return [int(x) for x in vm.ssh(f"sysctl -n {key}", check=True).stdout.split()]


def measured(vm, dev: str) -> dict:
    netpath.shape(vm, dev, netpath.PATHS["usw"], RATE)
    try:
        return netpath.measure(vm, runs=2, seconds=5, omit=3, tests=TESTS)
    finally:
        netpath.unshape(vm, dev)


def test_tuning_gains_on_the_150ms_path(vm, tmp_path_factory, wheel_dir, stage):
    inv = vm.inventory(str(tmp_path_factory.mktemp("ansible-netproof") / "hosts.yml"))
    extra = {"hkgpu_install_cache_dir": wheel_dir, "hkgpu_install_wheelhouse": os.path.join(vm.dir, "wheelhouse")}
    with stage("netproof: ansible-playbook site.yml --tags install (the toolkit, if not there yet)"):
        run = run_playbook("apply", inv, extravars=extra, tags="install")
    assert run.rc == 0 and not run.hosts["hkvm"].is_failed, json.dumps(run.to_dict(), indent=1, default=str)[-4000:]
    dev = netpath.nic(vm)
    vm.ssh(f"ip link set {dev} up && sysctl -qw net.core.default_qdisc=pfifo_fast && "
           f"tc qdisc replace dev {dev} root pfifo_fast && tc qdisc del dev {dev} root", check=True)
    # stock: Debian's buffers, below the path's BDP (the premise of the buffer claims)
    bdp = RATE * 1e6 / 8 * 0.150
    assert sysctl(vm, "net.ipv4.tcp_wmem")[2] < bdp and sysctl(vm, "net.ipv4.tcp_rmem")[2] / 2 < bdp
    netpath.peer_up(vm)
    try:
        with stage("netproof: stock node, 150 ms path"):
            stock = measured(vm, dev)
        assert netpath.queue_qdisc(vm, dev) == "pfifo_fast"
        vm.ssh(f"mkdir -p /etc/hkgpu-tune && cat > {PROFILE} <<'EOF'\n{profile()}EOF", check=True)
        with stage("netproof: hkgpu-tune apply"):
            a = vm.ssh(f"{CLI} apply -p {PROFILE} --json", timeout=900)
        assert a.returncode == 0, a.stdout[-3000:] + a.stderr[-2000:]
        # applied, as the kernel shows it (not the tool's verify)
        assert netpath.queue_qdisc(vm, dev) == "fq_codel"
        assert vm.ssh(f"cat /sys/class/net/{dev}/mtu", check=True).stdout.strip() == "9000"
        assert sysctl(vm, "net.ipv4.tcp_wmem")[2] > 2 * bdp
        with stage("netproof: tuned node, 150 ms path"):
            tuned = measured(vm, dev)
    finally:
        netpath.peer_down(vm)
        r = vm.ssh(f"{CLI} rollback -p {PROFILE}", timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.dumps({"stock": stock, "tuned": tuned})
    for test in ("up1", "down1"):
        assert not stock[test]["errors"] and not tuned[test]["errors"], report
        # a window caps a flow from above: the best run shows the cap (a slow run is the emulator
        # starved of CPU, not the window)
        assert max(tuned[test]["mbit_runs"]) > 1.2 * max(stock[test]["mbit_runs"]), (test, report)
