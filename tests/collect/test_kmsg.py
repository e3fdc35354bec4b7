"""kmsg: XIDs, link flaps and NIC resets from recorded kernel log lines (kmsg, dmesg, journal forms)."""
import os

import pytest

from hkgpu_tune.observe.collect import Sources, kmsg
from hkgpu_tune.backends.nvml import ReplayNvml

HERE = os.path.dirname(__file__)
FIX = os.path.join(HERE, "..", "fixtures")


def lines():
    with open(os.path.join(FIX, "monitor", "kmsg-events.txt")) as f:
        return f.read().splitlines()


def test_events_of_every_kind_and_line_form():
    ev = kmsg.events(lines())
    got = [(e["kind"], e["device"], e["xid"]) for e in ev]
    assert got == [
        ("xid", "0000:18:00", 79), ("xid", "0000:9a:00", 48), ("xid", "0000:9a:00", 94), ("xid", "0000:3b:00", 63),
        ("link_flap", "ens9f0np0", None), ("link_flap", "ens785f0", None), ("link_flap", "eno1", None),
        ("nic_reset", "ens9f0np0", None), ("nic_reset", "ens9f0np0", None), ("nic_reset", "enp59s0f0", None),
        ("nic_reset", "eno1", None), ("nic_reset", "ens1f0", None)]
    assert ev[0]["time"] == pytest.approx(912.003412)      # /dev/kmsg: microseconds since boot
    assert ev[1]["time"] == pytest.approx(913.120044)      # dmesg
    assert ev[2]["time"] is None                           # journal: wall clock, not kept
    assert ev[0]["line"].startswith("NVRM: Xid (PCI:0000:18:00): 79")


def test_link_up_and_ordinary_lines_are_not_events():
    assert kmsg.events(["6,1,1,-;mlx5_core 0000:1a:00.0 ens1f0np0: Link up",
                        "e1000e: eno1 NIC Link is Up 1000 Mbps Full Duplex",
                        "pci 0000:18:00.0: [10de:2330] type 00 class 0x030200"]) == []


def test_xid_counted_per_gpu_index_where_nvml_knows_the_bus():
    nv = ReplayNvml(os.path.join(FIX, "gpu", "dgx-h100-8gpu.json"))   # GPU 0 at 18:00.0, GPU 4 at 9a:00.0
    fams, data = kmsg.run(None, Sources(nvml=nv, kmsg_lines=lines()))
    xid = {(lab["gpu"], lab["xid"]): v for lab, v in fams[0].samples}
    assert xid == {("0", "79"): 1, ("4", "48"): 1, ("4", "94"): 1, ("0000:3b:00", "63"): 1}
    kern = {(lab["kind"], lab["device"]): v for lab, v in fams[1].samples}
    assert kern[("link_flap", "ens9f0np0")] == 1 and kern[("nic_reset", "ens9f0np0")] == 2
    assert len(data["events"]) == 12


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="needs /dev/kmsg readable (root)")
def test_live_kmsg_is_read_without_blocking():
    got = kmsg.read_kmsg()
    assert got and all(kmsg.KMSG_RE.match(ln) for ln in got[:50])
    assert isinstance(kmsg.events(), list)
