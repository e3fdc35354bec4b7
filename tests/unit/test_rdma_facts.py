"""SR-IOV and RDMA facts from a sysfs tree laid out as the kernel documents it
(Documentation/ABI/testing/sysfs-bus-pci, Documentation/ABI/stable/sysfs-class-infiniband, mlx5's
ecn/ directory); built here, not recorded: this machine has neither SR-IOV nor an RDMA device
(its kernel has no RDMA netlink). The real kernel's answer is tests/integration/test_serving_path_facts.py."""
import os

from hkgpu_tune.backends.procfs import SysFs
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.tune.engine import Engine

from .fakes import FakeCmd, FakeNet, backends, link

GID = "fe80:0000:0000:0000:0e42:a1ff:fe00:0001"
GID4 = "0000:0000:0000:0000:0000:ffff:c612:0001"


def put(root, path, text):
    p = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(text + "\n")


def tree(root):
    dev = "/sys/devices/pci0000:00/0000:3b:00.0"
    put(root, f"{dev}/sriov_totalvfs", "8")
    put(root, f"{dev}/sriov_numvfs", "2")
    for i, fn in enumerate(("0000:3b:00.2", "0000:3b:00.3")):
        os.makedirs(os.path.join(root, f"sys/devices/pci0000:00/{fn}"), exist_ok=True)
        os.symlink(f"../{fn}", os.path.join(root, dev.lstrip("/"), f"virtfn{i}"))
    os.makedirs(os.path.join(root, "sys/class/net/ens1f0"), exist_ok=True)
    os.symlink(os.path.join(root, dev.lstrip("/")), os.path.join(root, "sys/class/net/ens1f0/device"))
    os.makedirs(os.path.join(root, "sys/class/net/eno1/device"), exist_ok=True)   # a NIC without SR-IOV
    ib = "/sys/class/infiniband/mlx5_0"
    put(root, f"{ib}/device/net/ens1f0/ifindex", "2")
    port = f"{ib}/ports/1"
    put(root, f"{port}/state", "4: ACTIVE")
    put(root, f"{port}/phys_state", "5: LinkUp")
    put(root, f"{port}/link_layer", "Ethernet")
    put(root, f"{port}/rate", "100 Gb/sec (4X EDR)")
    for i, (gid, typ) in enumerate(((GID, "IB/RoCE v1"), (GID, "RoCE v2"), (GID4, "RoCE v2"))):
        put(root, f"{port}/gids/{i}", gid)
        put(root, f"{port}/gid_attrs/types/{i}", typ)
        put(root, f"{port}/gid_attrs/ndevs/{i}", "ens1f0")
    put(root, f"{port}/gids/3", "0000:0000:0000:0000:0000:0000:0000:0000")   # an empty slot
    for side in ("roce_np", "roce_rp"):
        for prio in range(8):
            put(root, f"/sys/class/net/ens1f0/ecn/{side}/enable/{prio}", "1" if prio == 3 else "0")


def test_sriov_rdma_and_ecn_from_the_documented_tree(tmp_path):
    tree(str(tmp_path))
    b = backends(net=FakeNet([link("ens1f0", 2), link("eno1", 3, driver="igb")]), sysfs=SysFs(str(tmp_path)),
                 cmd=FakeCmd())
    f = Engine(parse_profile_text("network:\n  interfaces: []\n", "t.yaml"), only=["rdma"], backends=b).facts()["rdma"]
    assert f["sriov"]["ens1f0"] == {"total_vfs": 8, "num_vfs": 2, "vfs": {"virtfn0": "0000:3b:00.2",
                                                                           "virtfn1": "0000:3b:00.3"}}
    assert "no SR-IOV" in f["sriov"]["eno1"]["unsupported"]
    dev = f["rdma"]["mlx5_0"]
    assert dev["netdevs"] == ["ens1f0"]
    p = dev["ports"]["1"]
    assert p["state"] == "4: ACTIVE" and p["link_layer"] == "Ethernet"
    assert [(g["index"], g["type"]) for g in p["gids"]] == [(0, "IB/RoCE v1"), (1, "RoCE v2"), (2, "RoCE v2")]
    ecn = f["dcb"]["ens1f0"]["ecn"]
    assert ecn["roce_np"]["3"] is True and ecn["roce_rp"]["0"] is False
    assert "dcb command is not installed" in f["dcb"]["ens1f0"]["pfc"]["unsupported"]


def test_serving_ports_come_from_the_triton_section():
    from types import SimpleNamespace as NS

    from hkgpu_tune.subsystems.firewall import serving_ports
    t = NS(http=NS(port=18000), grpc=NS(port=18001), metrics=NS(port=18002))
    assert serving_ports(NS(section=lambda name: t if name == "triton" else None)) == [18000, 18001, 18002]
    assert serving_ports(NS(section=lambda name: None)) == [8000, 8001, 8002]
