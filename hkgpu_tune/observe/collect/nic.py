"""NIC counters: /sys/class/net/DEV/statistics, and per queue from `ethtool -S` where the driver has them.

>>> read(["eth0"])["eth0"]["rx_dropped"]        # doctest: +SKIP
0

Per-queue names seen in drivers' `ethtool -S` (ethtool's own tool prints them; no library reads
ETHTOOL_GSTATS for us): rx_queue_N_x / tx_queue_N_x (virtio_net, veth, ixgbe, ice), rxN_x / txN_x
(mlx5, mlx4), rx-N.x / tx-N.x (i40e), "[N]: rx_x" (bnxt_en). A queue's drops are the sum of its
counters named "drop" (see queue_drops).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

from hkgpu_tune.core.fsutil import program_refusal
from hkgpu_tune.observe.collect import Family

STATS = ("rx_dropped", "tx_dropped", "rx_errors", "tx_errors", "rx_packets", "tx_packets", "rx_bytes", "tx_bytes")
# one pattern for the per-queue forms: rx_queue_N_x | rxN_x | rx-N.x | [N]: rx_x
QUEUE_RE = re.compile(r"(?:(rx|tx)(?:_queue_(\d+)_|(\d+)_|-(\d+)\.)|\[(\d+)\]: (rx|tx)_)(.+)")
LINE_RE = re.compile(r"^[ \t]*(\S.*?):[ \t]+(-?\d+)[ \t]*$", re.M)


def parse_ethtool_s(text: str) -> dict[str, int]:
    """`ethtool -S DEV` -> {name: value} (the header line and anything that is not name: integer is skipped)."""
    return {m[0]: int(m[1]) for m in LINE_RE.findall(text)}


def queues(stats: dict[str, int]) -> dict[str, dict[str, int]]:
    """Per-queue counters out of a driver's flat statistics: {"rx-0": {"packets": .., "dropped": ..}}."""
    out: dict[str, dict[str, int]] = {}
    by_prefix: dict[str, dict] = {}    # "rx12_" -> that queue's dict (a driver repeats each prefix ~30 times)
    match = QUEUE_RE.fullmatch
    for name, v in stats.items():
        if not name or name[0] not in "rt[":
            continue
        m = match(name)
        if m is None:
            continue
        pos = m.start(7)
        q = by_prefix.get(name[:pos])
        if q is None:
            d, a, b, c, e, d2, _ = m.groups()
            q = by_prefix[name[:pos]] = out.setdefault(f"{d or d2}-{int(a or b or c or e)}", {})
        q[name[pos:]] = v
    return out


def queue_drops(q: dict[str, int]) -> int | None:
    """The queue's own total where the driver has one ("drops", "dropped": virtio_net counts its
    XDP drops inside "drops"), else the sum of its counters named *drop* (mlx5 rxN_xdp_drop and
    rxN_oversize_pkts_sw_drop); None where it has none."""
    for k in ("dropped", "drops"):
        if k in q:
            return q[k]
    drops = [v for k, v in q.items() if "drop" in k]
    return sum(drops) if drops else None


class SysNic:
    """The live host: /sys/class/net and the ethtool program."""

    def __init__(self, root: str = "/sys/class/net"):
        self.root = root
        self.ethtool = shutil.which("ethtool") or next(
            (p for p in ("/usr/sbin/ethtool", "/sbin/ethtool") if os.path.exists(p)), None)

    def devices(self) -> list[str]:
        """Interfaces backed by a device (a PCI function, virtio): not lo, veth, bridges or tunnels."""
        return sorted(d for d in os.listdir(self.root) if os.path.exists(os.path.join(self.root, d, "device")))

    def exists(self, dev: str) -> bool:
        return os.path.isdir(os.path.join(self.root, dev, "statistics"))

    def stats(self, dev: str) -> dict[str, int]:
        d = os.path.join(self.root, dev, "statistics")
        out = {}
        for k in STATS:
            try:
                with open(os.path.join(d, k)) as f:
                    out[k] = int(f.read().strip())
            except FileNotFoundError:
                if not os.path.isdir(os.path.join(self.root, dev)):
                    raise
            except ValueError:
                pass
        return out

    def ethtool_stats(self, dev: str) -> dict[str, int]:
        if self.ethtool and program_refusal(self.ethtool):
            raise PermissionError(program_refusal(self.ethtool))
        if not self.ethtool:
            return {}
        p = subprocess.run([self.ethtool, "-S", dev], capture_output=True, text=True, timeout=5)
        return parse_ethtool_s(p.stdout) if p.returncode == 0 else {}


def read(devices=None, source=None) -> dict:
    src = source or SysNic()
    out = {}
    for dev in devices if devices is not None else src.devices():
        st = src.stats(dev)
        st["queues"] = queues(src.ethtool_stats(dev))
        out[dev] = st
    return out


def families(nics: dict) -> list[Family]:
    dropped = Family("hkgpu_tune_nic_dropped_total", "counter", "Packets the interface dropped (/sys statistics).")
    errors = Family("hkgpu_tune_nic_errors_total", "counter", "Receive and transmit errors (/sys statistics).")
    qdrop = Family("hkgpu_tune_nic_queue_dropped_total", "counter", "Drops per queue, as the driver counts them (ethtool -S).")
    for dev, st in nics.items():
        for d in ("rx", "tx"):
            dropped.samples.append(({"device": dev, "direction": d}, st.get(f"{d}_dropped")))
            errors.samples.append(({"device": dev, "direction": d}, st.get(f"{d}_errors")))
        for q, c in sorted(st.get("queues", {}).items(), key=lambda x: (x[0][:2], int(x[0][3:]))):
            qdrop.samples.append(({"device": dev, "queue": q}, queue_drops(c)))
    return [dropped, errors, qdrop]


def devices(profile, source) -> list[str]:
    """The device-backed interfaces, and those the profile names (network.interfaces[].match.name:
    a bond, VLAN or veth the profile tunes is watched too) where they exist."""
    devs = source.devices()
    named = [i.match.name for i in profile.network.interfaces if i.match.name] if profile is not None else []
    exists = getattr(source, "exists", None)
    return sorted(set(devs) | {n for n in named if exists is not None and exists(n)})


def run(profile, src):
    source = src.nic or SysNic()
    nics = read(devices(profile, source), source)
    return families(nics), {"nics": nics}
