"""A real test node (tests/vm/vm.py): Debian's kernel and systemd under QEMU, a multi-queue data NIC
on NUMA node 1, a fabric peer in a namespace of the test's own.

Order matters (one VM for the module): converge with ansible-playbook, verify, reboot, verify
again with zero drift (the boot unit puts back what the kernel forgot), testinfra before and
after; roll back across a reboot; then the don't-fragment probe towards a peer that passes only
1500 bytes fails, the old MTU stays and the VM stays reachable.
"""
from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from hkgpu_tune.fleet.rack import run_playbook

from ..helpers import run_testinfra
from .vm import DATA_MAC, PEER_ADDR, QUEUES, REPO

pytestmark = [pytest.mark.root, pytest.mark.slow]

CLI = "/opt/hkgpu-tune/bin/hkgpu-tune"
NODE_PROFILE = "/etc/hkgpu-tune/node.yaml"


def node_vars(vm, wheels: str) -> dict:
    """The default profile (hk-inference) for this node: its data NIC is virtio, not mlx5, and its
    fabric peer is the test's namespace; NIC interrupts go to the NIC's own NUMA node."""
    with open(os.path.join(REPO, "hkgpu_tune", "profiles", "hk-inference.yaml")) as f:
        prof = yaml.safe_load(f)
    iface = dict(prof["network"]["interfaces"][0], match={"mac": DATA_MAC})
    return {"hkgpu_network_interfaces": [iface],
            "hkgpu_network_fabric_peers": [PEER_ADDR],
            "hkgpu_network_sysctl": prof["sysctl"],
            "hkgpu_affinity_settings": {"nics": [{"match": {"mac": DATA_MAC}, "irq_cpus": "local"}]},
            "hkgpu_install_cache_dir": wheels,
            "hkgpu_install_wheelhouse": os.path.join(vm.dir, "wheelhouse")}


@pytest.fixture(scope="module")
def node(vm, tmp_path_factory, wheel_dir):
    inv = vm.inventory(str(tmp_path_factory.mktemp("ansible") / "hosts.yml"))
    return {"inventory": inv, "extra": node_vars(vm, wheel_dir)}


def playbook(node, action: str):
    """site.yml (apply) or rollback.yml through ansible-playbook; the run and this host's result."""
    run = run_playbook(action, node["inventory"], extravars=node["extra"])
    return run, run.hosts["hkvm"]


def why(run) -> str:
    """A failed run in a few lines: each host's last task, message and failed settings."""
    return "\n".join(f"rc {run.rc}: {h}: {r.state} at {r.last_task!r}: {r.msg[-1500:]} {r.failures}"
                     for h, r in run.hosts.items())


def verify(vm) -> tuple[int, dict]:
    p = vm.ssh(f"{CLI} verify --json --profile {NODE_PROFILE}", timeout=300)
    assert p.stdout, p.stderr
    return p.returncode, json.loads(p.stdout)


def not_ok(doc: dict) -> list[str]:
    """Results that are not ok. An optional setting this kernel lacks (nf_conntrack_max where
    nf_conntrack is not loaded) is unsupported and not required: reported, not a failure."""
    return [f"{r['subsystem']} {r['target']} {r['key']}: {r['status']} {r['current']!r} -> {r['desired']!r} "
            f"{r.get('reason', '')}" for r in doc["results"]
            if r["status"] != "ok" and not (r["status"] == "unsupported" and r.get("required") is False)]


def assert_testinfra(t, doc: dict) -> None:
    """tests/infra passed one test per result verify gave, less the optional settings this kernel
    lacks, which it skips saying so (each one by its key)."""
    optional = [r["key"] for r in doc["results"] if r["status"] == "unsupported" and r.get("required") is False]
    assert t.returncode == 0, t.stdout[-3000:]
    assert f"{len(doc['results']) - len(optional)} passed" in t.stdout, t.stdout[-3000:]
    for key in optional:
        assert f"{key}: not in this kernel or namespace (optional)" in t.stdout, (key, t.stdout[-3000:])


NIC = f"$(grep -il {DATA_MAC} /sys/class/net/*/address | cut -d/ -f5)"   # the data NIC's name, in shell


def data_nic(vm) -> dict:
    """What the guest kernel says about the data NIC: name, MTU, channels, IRQ CPUs, root qdisc."""
    script = f"""
set -e
n={NIC}
echo "name=$n"
echo "mtu=$(cat /sys/class/net/$n/mtu)"
echo "numa=$(cat /sys/class/net/$n/device/../numa_node)"  # device is virtioN, its parent the PCI function
echo "combined=$(ethtool -l $n | awk '/^Current/{{c=1}} c && /^Combined/{{print $2; exit}}')"
echo "qdisc=$(tc qdisc show dev $n | head -1 | cut -d' ' -f2)"
echo "children=$(tc qdisc show dev $n | awk '$0 ~ /parent/ {{print $2}}' | tr '\\n' ' ')"
dev=$(basename $(readlink -f /sys/class/net/$n/device))
irqs=$(grep -E "$dev-(input|output)" /proc/interrupts | cut -d: -f1 | tr -d ' ')
echo "irq_cpus=$(for i in $irqs; do cat /proc/irq/$i/smp_affinity_list; done | sort -u | tr '\\n' ' ')"
"""
    out = vm.ssh(script, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def assert_tuned(nic: dict) -> None:
    """MTU 9000, all channels, mq with fq_codel on every queue, interrupts on the NIC's node (CPU 1)."""
    assert (nic["mtu"], nic["combined"], nic["qdisc"], nic["irq_cpus"].split()) == \
        ("9000", str(QUEUES), "mq", ["1"]), nic
    assert nic["children"].split() == ["fq_codel"] * QUEUES, nic


def test_converge_reboot_verify(vm, node, stage):
    # the node as it boots: 2 of 4 channels (one per vCPU), MTU 1500, NIC interrupts spread by
    # the driver, and a site that sets pfifo_fast (Debian's own default is fq_codel): the kernel's
    # own mq (handle 0:) with pfifo_fast on each queue
    vm.ssh("echo net.core.default_qdisc=pfifo_fast > /etc/sysctl.d/55-site-qdisc.conf && "
           "sysctl -qw net.core.default_qdisc=pfifo_fast && "
           f"n={NIC} && "
           # the kernel's own root cannot be deleted (handle 0): replace it, delete that, get it back
           "tc qdisc replace dev $n root pfifo_fast && tc qdisc del dev $n root", check=True)
    before = data_nic(vm)
    assert before["numa"] == "1" and before["mtu"] == "1500", before
    assert before["combined"] == "2", before        # the kernel's default; max is QUEUES
    assert before["qdisc"] == "mq" and before["children"].split() == ["pfifo_fast"] * 2, before
    assert before["irq_cpus"].split() != ["1"], before

    with stage("ansible-playbook site.yml (first converge, toolkit installed)"):
        run, h = playbook(node, "apply")
    assert run.rc == 0 and not h.is_failed and h.changed > 0, why(run)

    # the man page of the version installed, section 8, where an operator's man looks
    page = vm.ssh("head -c 200 /usr/local/share/man/man8/hkgpu-tune.8", check=True).stdout
    assert page.startswith(".TH HKGPU\\-TUNE 8 "), page

    with stage("hkgpu-tune verify over SSH"):
        rc, doc = verify(vm)
    assert rc == 0 and not not_ok(doc), not_ok(doc)
    keys = {(r["subsystem"], r["key"]) for r in doc["results"]}
    assert ("qdisc", "root") in keys and ("link", "mtu") in keys and ("affinity", "smp_affinity_list") in keys
    assert ("sysctl", "net.core.default_qdisc") in keys   # fq_codel: ok here, not unsupported
    assert_tuned(data_nic(vm))

    with stage("ansible-playbook site.yml (re-run)"):
        run, h = playbook(node, "apply")
    assert run.rc == 0 and not h.is_failed and h.changed == 0, why(run)

    with stage("testinfra before the reboot"):
        t = run_testinfra(node["inventory"])
    assert_testinfra(t, doc)

    with stage("reboot to SSH"):
        vm.reboot()
    # the kernel forgot the runtime-only settings; the boot unit put them back
    journal = vm.ssh("journalctl -b -o cat -u hkgpu-tune.service", check=True).stdout
    # (tables: column rules or, at 80 columns and in the journal, plain spaces)
    assert re.search(r"channels combined\s*│?\s*2\s*│?\s*4\s", journal), journal[-3000:]
    assert re.search(r"smp_affinity_list\s*│?\s*[0-9,-]+\s*│?\s*1\s", journal), journal[-3000:]
    unit = vm.ssh("systemctl show -p ActiveState,Result hkgpu-tune.service hkgpu-tune-verify.service",
                  check=True).stdout
    assert unit.count("Result=success") == 2 and "ActiveState=failed" not in unit, unit
    # what Prometheus scrapes after boot: the boot verify (after network-online) found no drift
    prom = vm.ssh("cat /var/lib/prometheus/node-exporter/hkgpu-tune.prom", check=True).stdout
    assert "\nhkgpu_tune_failures 0\n" in prom and 'key="smp_affinity_list",status="ok"} 1' in prom, prom[-2000:]
    assert_tuned(data_nic(vm))
    with stage("hkgpu-tune verify over SSH after the reboot"):
        rc, doc = verify(vm)
    assert rc == 0 and not not_ok(doc), not_ok(doc)
    with stage("testinfra after the reboot"):
        t = run_testinfra(node["inventory"])
    assert_testinfra(t, doc)


def test_rollback_survives_reboot(vm, node, stage):
    with stage("ansible-playbook rollback.yml"):
        run, h = playbook(node, "rollback")
    assert run.rc == 0 and not h.is_failed, why(run)
    # at once, before any reboot: the originals are back in the running kernel (each queue's
    # qdisc under an mq of the tool's, 1:, which still lists the queues no longer in use)
    now = data_nic(vm)
    assert (now["mtu"], now["combined"], now["qdisc"], set(now["children"].split())) == \
        ("1500", "2", "mq", {"pfifo_fast"}), now
    assert vm.ssh("sysctl -n net.core.default_qdisc", check=True).stdout.strip() == "pfifo_fast"
    with stage("reboot to SSH"):
        vm.reboot()
    now = data_nic(vm)
    assert (now["mtu"], now["combined"]) == ("1500", "2"), now
    assert vm.ssh("sysctl -n net.core.default_qdisc", check=True).stdout.strip() == "pfifo_fast"
    left = vm.ssh("ls /etc/sysctl.d/60-hkgpu-tune.conf /etc/systemd/system/hkgpu-tune.service "
                  "/etc/systemd/system/hkgpu-tune-verify.service /etc/systemd/network/*.d 2>/dev/null; true").stdout
    assert not left.strip(), left


def test_probe_failure_keeps_the_old_mtu(vm, node, stage):
    vm.peer_mtu(1500)   # the fabric now passes only 1500-byte frames to the peer
    try:
        with stage("ansible-playbook site.yml (probe fails)"):
            run, h = playbook(node, "apply")
        assert run.rc != 0 and h.failed == 1, why(run)
        assert PEER_ADDR in h.msg, why(run)      # the failure names the peer
        assert vm.reachable()
        now = data_nic(vm)
        assert now["mtu"] == "1500", now
        # nothing of the failed run stays: no persisted files, nothing left to roll back, the
        # sysctls it had set are back
        left = vm.ssh("ls /etc/sysctl.d/60-hkgpu-tune.conf /etc/systemd/network/*.d "
                      "/var/lib/hkgpu-tune/state.json 2>/dev/null; true").stdout
        assert not left.strip(), left
        assert vm.ssh("sysctl -n net.core.default_qdisc", check=True).stdout.strip() == "pfifo_fast"
    finally:
        vm.peer_mtu(9000)
