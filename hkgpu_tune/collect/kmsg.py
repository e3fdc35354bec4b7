"""GPU XID errors, link flaps and NIC resets from the kernel log since boot.

>>> events(["NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."])
[{'kind': 'xid', 'device': '0000:3b:00', 'xid': 79, 'line': 'NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.', 'time': None}]

Lines may be /dev/kmsg records ("6,812,5003412,-;msg"), dmesg lines ("[ 5.003412] msg") or
`journalctl -k` lines ("Dec 02 10:00:00 host kernel: msg"). `time` is seconds since boot where
the line carries it. A link flap is a "Link is Down"/"Link down" line (every NIC logs one
"Link is Up" at boot, so ups are not counted). The counts cover what the kernel's ring buffer
(or the journal) still holds.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

from . import Family

KMSG_RE = re.compile(r"(\d+),(\d+),(\d+),[^;]*;(.*)")
DMESG_RE = re.compile(r"\[\s*(\d+\.\d+)\]\s?(.*)")
JOURNAL_RE = re.compile(r"\w{3} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ kernel: (.*)")
XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)")
IF = r"([A-Za-z0-9_.@-]{1,15})"
LINK_DOWN = (re.compile(IF + r":? (?:NIC )?Link is Down", re.I), re.compile(IF + r": Link down\b"))
RESET = (re.compile(r"NETDEV WATCHDOG: " + IF + r" \("), re.compile(IF + r":? (?:Reset adapter|reset adapter)"),
         re.compile(IF + r":? .*\b(?:tx timeout|TX timeout|tx_timeout)"))
MAX_LINES = 200_000


def _message(line: str) -> tuple[str, float | None]:
    line = line.rstrip("\n")
    m = KMSG_RE.match(line)
    if m:
        return m.group(4), int(m.group(3)) / 1e6
    m = DMESG_RE.match(line)
    if m:
        return m.group(2), float(m.group(1))
    m = JOURNAL_RE.match(line)
    if m:
        return m.group(1), None
    return line, None


def parse_line(line: str) -> dict | None:
    msg, t = _message(line)
    m = XID_RE.search(msg)
    if m:
        return {"kind": "xid", "device": m.group(1).lower(), "xid": int(m.group(2)), "line": msg, "time": t}
    for kind, regs in (("link_flap", LINK_DOWN), ("nic_reset", RESET)):
        for r in regs:
            m = r.search(msg)
            if m:
                return {"kind": kind, "device": m.group(1), "xid": None, "line": msg, "time": t}
    return None


def read_kmsg(path: str = "/dev/kmsg") -> list[str]:
    """Every record the ring buffer holds, read without blocking (root or CAP_SYSLOG)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    out = []
    try:
        while len(out) < MAX_LINES:
            try:
                b = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:   # a record overwritten while reading: go on with the next
                continue
            if not b:
                break
            out.append(b.decode("utf-8", "replace").split("\n", 1)[0])
    finally:
        os.close(fd)
    return out


def read_journal() -> list[str]:
    exe = shutil.which("journalctl")
    if not exe:
        raise FileNotFoundError("neither /dev/kmsg nor journalctl can be read")
    p = subprocess.run([exe, "-k", "-b", "--no-pager", "-o", "short"], capture_output=True, text=True, timeout=10)
    if p.returncode != 0:
        raise OSError(" ".join(p.stderr.split())[:200] or f"journalctl exited {p.returncode}")
    return p.stdout.splitlines()


def events(lines=None) -> list[dict]:
    if lines is None:
        try:
            lines = read_kmsg()
        except OSError:
            lines = read_journal()
    return [e for e in map(parse_line, lines) if e is not None]


def _bus(pci: str) -> str:
    """'00000000:3B:00.0' or '0000:3b:00' -> '0000:3b:00' (NVRM's form: domain, bus, device)."""
    parts = pci.lower().split(":")
    if len(parts) < 3:
        return pci.lower()
    return f"{parts[-3][-4:]}:{parts[-2]}:{parts[-1].split('.')[0]}"


def families(evs: list[dict], gpus: list[dict] | None = None) -> list[Family]:
    """XIDs labelled gpu=<index> where NVML knows the PCI address, else gpu=<the address>."""
    index = {_bus(g["pci_bus_id"]): str(g["index"]) for g in gpus or [] if g.get("pci_bus_id")}
    xid: dict[tuple, int] = {}
    kern: dict[tuple, int] = {}
    for e in evs:
        if e["kind"] == "xid":
            k = (index.get(_bus(e["device"]), e["device"]), str(e["xid"]))
            xid[k] = xid.get(k, 0) + 1
        else:
            k = (e["kind"], e["device"])
            kern[k] = kern.get(k, 0) + 1
    return [Family("hkgpu_tune_xid_events", "gauge", "NVIDIA XID errors in the kernel log since boot.",
                   [({"gpu": g, "xid": x}, n) for (g, x), n in sorted(xid.items())]),
            Family("hkgpu_tune_kernel_events", "gauge", "Link flaps and NIC resets in the kernel log since boot.",
                   [({"kind": k, "device": d}, n) for (k, d), n in sorted(kern.items())])]


def run(profile, src):
    evs = events(src.kmsg_lines)
    gpus = []
    if src.nvml is not None and any(e["kind"] == "xid" for e in evs):
        try:
            gpus = [src.nvml.gpu(i, ("pci_bus_id",)) for i in range(src.nvml.count())]
        except Exception:  # noqa: BLE001 - without NVML the label is the PCI address
            gpus = []
    return families(evs, gpus), {"events": evs}
