"""Facts: SR-IOV (virtual functions per NIC) and RDMA devices (RoCE or InfiniBand: link layer, port
state, GIDs), with the PFC and ECN settings the NIC exposes. Nothing is written here.

Read from sysfs as the kernel documents it (Documentation/ABI/testing/sysfs-bus-pci: sriov_totalvfs,
sriov_numvfs, virtfnN; Documentation/ABI/stable/sysfs-class-infiniband: ports/N/state, link_layer,
gids/I, gid_attrs/types/I, gid_attrs/ndevs/I; mlx5's ecn/roce_np|roce_rp/enable/PRIO), and PFC
through iproute2's `dcb -j pfc show`. Each part is `unsupported` with the reason where absent.
"""
from __future__ import annotations

import json

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.subsystems.base import Spec, Subsystem

IB = "/sys/class/infiniband"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
MAX_GIDS = 256


class Plugin(Subsystem):
    name = "rdma"
    facts_only = True

    # facts only: verify and plan have nothing to compare and read nothing
    def verify(self):
        return []

    def plan(self, state=None):
        return [], []

    def compare(self, state):
        return []

    def read(self) -> dict:
        links = [ln["name"] for ln in self.b.net.links()]
        return {"sriov": {n: self._sriov(n) for n in links}, "rdma": self._rdma(),
                "dcb": {n: self._dcb(n) for n in links}}

    def _sriov(self, name) -> dict:
        fs, dev = self.b.sysfs, f"/sys/class/net/{name}/device"
        if not fs.exists(dev):
            return {"unsupported": "a virtual interface: no PCI device behind it"}
        total = fs.read(f"{dev}/sriov_totalvfs")
        if total is None:
            return {"unsupported": "the device has no SR-IOV capability (no sriov_totalvfs)"}
        vfs = [v for v in fs.listdir(dev) if v.startswith("virtfn")]
        return {"total_vfs": int(total), "num_vfs": int(fs.read(f"{dev}/sriov_numvfs") or 0),
                "vfs": {v: (fs.readlink(f"{dev}/{v}") or "").rsplit("/", 1)[-1] for v in sorted(vfs)}}

    def _rdma(self) -> dict:
        fs = self.b.sysfs
        if not fs.exists(IB):
            return {"unsupported": f"no RDMA devices ({IB} absent: no RDMA driver loaded)"}
        out = {}
        for dev in fs.listdir(IB):
            base = f"{IB}/{dev}"
            ports = {}
            for p in fs.listdir(f"{base}/ports"):
                pb = f"{base}/ports/{p}"
                gids = []
                for i in sorted((g for g in fs.listdir(f"{pb}/gids") if g.isdigit()), key=int)[:MAX_GIDS]:
                    gid = fs.read(f"{pb}/gids/{i}")
                    if gid and gid != ZERO_GID:
                        gids.append({"index": int(i), "gid": gid, "type": fs.read(f"{pb}/gid_attrs/types/{i}"),
                                     "netdev": fs.read(f"{pb}/gid_attrs/ndevs/{i}")})
                ports[p] = {"state": fs.read(f"{pb}/state"), "phys_state": fs.read(f"{pb}/phys_state"),
                            "link_layer": fs.read(f"{pb}/link_layer"), "rate": fs.read(f"{pb}/rate"), "gids": gids}
            out[dev] = {"netdevs": fs.listdir(f"{base}/device/net"), "ports": ports}
        return out

    def _dcb(self, name) -> dict:
        """PFC per priority (dcb) and RoCE ECN per priority (mlx5 sysfs), where the NIC has them."""
        out = {}
        fs = self.b.sysfs
        ecn = {}
        for side in ("roce_np", "roce_rp"):
            prios = fs.listdir(f"/sys/class/net/{name}/ecn/{side}/enable")
            if prios:
                ecn[side] = {p: fs.read(f"/sys/class/net/{name}/ecn/{side}/enable/{p}") == "1" for p in prios}
        out["ecn"] = ecn or {"unsupported": "the driver exposes no RoCE ECN settings (ecn/roce_np, roce_rp)"}
        if self.b.cmd.which("dcb") is None:
            out["pfc"] = {"unsupported": "the dcb command is not installed (iproute2)"}
            return out
        try:
            r = self.b.cmd.run(["dcb", "-j", "pfc", "show", "dev", name], timeout=10)
        except HkError as e:
            out["pfc"] = {"error": str(e)}
            return out
        if r.rc != 0:
            msg = (r.err or r.out).strip().splitlines()
            out["pfc"] = {"unsupported": f"dcb: {msg[0] if msg else f'exit {r.rc}'}"}
        else:
            try:
                out["pfc"] = json.loads(r.out)
            except ValueError:
                out["pfc"] = {"error": "dcb -j printed no JSON"}
        return out


SPEC = Spec(name="rdma", order=60, section="network", plugin=Plugin, persist="none")
