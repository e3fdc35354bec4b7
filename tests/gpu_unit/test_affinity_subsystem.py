"""affinity subsystem: NIC interrupts against recorded /sys + /proc trees, and service placement."""
import os

import pytest

from hkgpu_tune.backends.procfs import SysFs
from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.backends.topology import (format_cpulist, irq_names, nics, parse_cpulist, service_placement,
                                         set_irq_affinity)

from .conftest import FakeSystemd, backends, by_key, profile

DGX = """affinity:
  nics:
    - match: {driver: mlx5_core}
  irqbalance_ban: true
  services:
    - {name: tritonserver, gpu: 5}
"""


def engine(facts, root, text=DGX, tmp_path=None):
    return Engine(profile(text), only=["affinity"], state_dir=str(tmp_path) if tmp_path else None,
                  backends=backends(facts, root=root, systemd=FakeSystemd(available=False)))


def test_cpulists():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert parse_cpulist("") == []


def test_dgx_irqs_on_the_remote_node_drift_apply_rollback(dgx, dgx_root, tmp_path):
    os.makedirs(f"{dgx_root}/etc/default")
    with open(f"{dgx_root}/etc/default/irqbalance", "w") as f:
        f.write('#Configuration for the irqbalance daemon\nIRQBALANCE_ARGS="--policyscript=/x"\n')
    eng = engine(dgx["gpu"], dgx_root, tmp_path=tmp_path / "state")
    res = by_key(eng.verify())
    r = res[("ens9f0np0 irq200 (mlx5_comp0@pci:0000:9c:00.0)", "smp_affinity_list")]
    # spread over both sockets: CPUs of node 0 serve a NIC on node 1
    assert (r.status, r.current, r.desired) == ("drift", "0-103", "52-103")
    assert "node 0,1" in r.reason and "NIC local to node 1" in r.reason
    assert res[("ens1f0np0 irq100 (mlx5_comp0@pci:0000:1a:00.0)", "smp_affinity_list")].desired == "0-51"
    assert res[("irqbalance", "banned_irqs")].status == "drift"
    assert res[("tritonserver", "cpus")].status == "unsupported"     # not running: optional
    rep = eng.apply()
    assert not rep.error, rep.error
    assert open(f"{dgx_root}/proc/irq/201/smp_affinity_list").read() == "52-103"
    text = open(f"{dgx_root}/etc/default/irqbalance").read()
    assert 'IRQBALANCE_ARGS="--policyscript=/x --banirq=100' in text and "--banirq=203" in text
    assert {r.status for r in rep.results} <= {"ok", "unsupported"}
    # an interrupt that moved back (irqbalance, a driver reload) is reported
    with open(f"{dgx_root}/proc/irq/202/smp_affinity_list", "w") as f:
        f.write("0-51")
    moved = by_key(eng.verify())[("ens9f0np0 irq202 (mlx5_comp2@pci:0000:9c:00.0)", "smp_affinity_list")]
    assert moved.status == "drift" and "(node 0)" in moved.reason
    restored, errs = eng.rollback()
    assert not errs
    assert open(f"{dgx_root}/proc/irq/201/smp_affinity_list").read() == "0-103"
    assert "--banirq" not in open(f"{dgx_root}/etc/default/irqbalance").read()


def test_h200_recorded_tree_is_ok(h200_facts, h200_root):
    eng = engine(h200_facts, h200_root, "affinity:\n  nics:\n    - match: {default_route: true}\n")
    res = eng.verify()
    assert [r.target.split()[0] for r in res] == ["eth0"] * 3
    assert {r.status for r in res} == {"ok"} and {r.current for r in res} == {"0-15"}


def test_service_placement_dgx(dgx, dgx_root):
    pl = service_placement(backends(dgx["gpu"], root=dgx_root), 5)
    assert pl["cpus"] == list(range(52, 104)) and pl["mems"] == [1] and pl["numa_node"] == 1
    assert "nvml" in pl["source"]


def test_service_placement_h200_single_node(h200_facts, h200_root):
    pl = service_placement(backends(h200_facts, root=h200_root), 0)
    assert pl["cpus"] == list(range(16)) and pl["mems"] == [] and pl["numa_node"] is None
    assert "no NUMA node" in pl["source"]


def test_service_placement_without_gpu(h200_root):
    pl = service_placement(backends(None, root=h200_root), 0)
    assert pl == {"cpus": list(range(16)), "mems": [], "numa_node": None,
                  "source": "all CPUs: NVML library not found (libnvidia-ml.so.1)", "known": False}
    pl = service_placement(backends({"gpus": []}, root=h200_root), 3)
    assert pl["cpus"] == list(range(16)) and "GPU 3" in pl["source"]


def test_running_service_on_the_wrong_socket(dgx, dgx_root):
    os.makedirs(f"{dgx_root}/proc/4242")
    with open(f"{dgx_root}/proc/4242/comm", "w") as f:
        f.write("tritonserver\n")
    with open(f"{dgx_root}/proc/4242/status", "w") as f:
        f.write("Name:\ttritonserver\nCpus_allowed_list:\t0-51\nMems_allowed_list:\t0-1\n")
    res = by_key(engine(dgx["gpu"], dgx_root, "affinity:\n  services:\n    - {name: tritonserver, gpu: 5}\n").verify())
    r = res[("tritonserver pid 4242", "cpus")]
    assert r.status == "drift" and "CPUAffinity=52 53" in r.reason and "NUMAMask=1" in r.reason
    assert res[("tritonserver pid 4242", "mems")].status == "drift"


def test_no_matching_nic(h200_facts, h200_root):
    res = engine(h200_facts, h200_root, "affinity:\n  nics:\n    - match: {driver: mlx5_core}\n").verify()
    assert [(r.status, r.required) for r in res] == [("unsupported", True)]


def test_real_sysfs_reads():
    """This machine's own /sys: the reader finds PCI network interfaces and their interrupts (read only)."""
    import re
    found = nics(SysFs("/"))
    names = irq_names(SysFs("/"))
    pci = re.compile(r"/[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]/")
    expected = sorted(n for n in os.listdir("/sys/class/net")
                      if pci.search(os.path.realpath(f"/sys/class/net/{n}/device") + "/")
                      and os.path.exists(f"/sys/class/net/{n}/device"))
    assert sorted(n["name"] for n in found) == expected
    for n in found:
        assert n["pci"] and all(i in names for i in n["msi_irqs"])
        assert n["local_cpus"]            # sysfs always lists the CPUs local to a PCI device


def _spare_irq():
    """A virtio interrupt that belongs to no network interface (the balloon or console device)."""
    fs = SysFs("/")
    nic_irqs = {i for n in nics(fs) for i in n["msi_irqs"]}
    for irq, name in sorted(irq_names(fs).items()):
        if name.startswith("virtio") and irq not in nic_irqs and os.path.exists(f"/proc/irq/{irq}/smp_affinity_list"):
            return irq
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to write /proc/irq")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to move an interrupt")
def test_real_kernel_irq_affinity_write_and_restore():
    irq = _spare_irq()
    if irq is None:
        pytest.skip("no virtio interrupt outside the network interfaces on this machine")
    fs = SysFs("/")
    path = f"/proc/irq/{irq}/smp_affinity_list"
    orig = fs.read(path)
    try:
        try:
            got = set_irq_affinity(fs, irq, "1")
        except Exception as e:  # noqa: BLE001 - a managed interrupt: the kernel refuses, which we report
            from hkgpu_tune.core.errors import UnsupportedError
            assert isinstance(e, UnsupportedError)
            pytest.skip(f"IRQ {irq}: {e}")
        assert got == "1" and fs.read(path) == "1"
    finally:
        fs.write(path, orig)
    assert fs.read(path) == orig


@pytest.mark.parametrize("text,msg", [
    ("affinity:\n  nics:\n    - match: {drivr: mlx5_core}\n", "test.yaml:3: affinity.nics\\[0\\].match.drivr: unknown key; did you mean 'driver'"),
    ("affinity:\n  nics:\n    - match: {driver: mlx5_core}\n      irq_cpus: some\n", "irq_cpus: expected 'local' or a CPU list"),
    ("affinity:\n  services:\n    - {name: tritonserver}\n", "missing required key 'gpu'"),
])
def test_affinity_profile_errors(text, msg):
    from hkgpu_tune.core.errors import ProfileError
    with pytest.raises(ProfileError, match=msg):
        profile(text)
