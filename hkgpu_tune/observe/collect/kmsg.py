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

from hkgpu_tune.core.fsutil import program_refusal
from hkgpu_tune.observe.collect import Family

KMSG_RE = re.compile(r"(\d+),(\d+),(\d+),[^;]*;(.*)")
DMESG_RE = re.compile(r"\[\s*(\d+\.\d+)\]\s?(.*)")
JOURNAL_RE = re.compile(r"\w{3} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ kernel: (.*)")
XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)")
IF = r"([A-Za-z0-9_.@-]{1,15})"
LINK_DOWN_RE = re.compile(r"Link is [Dd]own|: Link down\b")
RESET_RE = re.compile(r"NETDEV WATCHDOG|[Rr]eset adapter|[Tt][Xx][ _]timeout")
# which interface: netdev_*() lines are "<driver> <pci address> <ifname>: ...", the watchdog names it,
# older drivers write "<ifname>: NIC Link is ..." or "<driver>: <ifname> NIC Link is ..."
DEVICE_RE = (re.compile(r"NETDEV WATCHDOG: " + IF + r" \("),
             re.compile(r"^\S+ [0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7] " + IF + r": "),
             re.compile(IF + r":? (?:NIC )?Link is"))
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


# a cheap first look: only lines with one of these go through the patterns above
ANY_RE = re.compile(r"NVRM: Xid|Link is [Dd]own|Link down|NETDEV WATCHDOG|[Rr]eset adapter|[Tt][Xx][ _]timeout")


def parse_line(line: str) -> dict | None:
    if not ANY_RE.search(line):
        return None
    msg, t = _message(line)
    m = XID_RE.search(msg)
    if m:
        return {"kind": "xid", "device": m.group(1).lower(), "xid": int(m.group(2)), "line": msg, "time": t}
    for kind, r in (("link_flap", LINK_DOWN_RE), ("nic_reset", RESET_RE)):
        if r.search(msg):
            dev = next((m.group(1) for m in (d.search(msg) for d in DEVICE_RE) if m), "unknown")
            return {"kind": kind, "device": dev, "xid": None, "line": msg, "time": t}
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
    if program_refusal(exe):
        raise PermissionError(program_refusal(exe))
    p = subprocess.run([exe, "-k", "-b", "--no-pager", "-o", "short"], capture_output=True, text=True, timeout=10)
    if p.returncode != 0:
        raise OSError(" ".join(p.stderr.split())[:200] or f"journalctl exited {p.returncode}")
    return p.stdout.splitlines()


ENV_REPLAY = "HKGPU_TUNE_KMSG_REPLAY"
REPLAY_MAX = 16 << 20


def read_replay(path: str) -> list[str]:
    """A recorded kernel log (one line a record) in place of the host's."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(REPLAY_MAX).splitlines()[:MAX_LINES]


def events(lines=None) -> list[dict]:
    """Kernel events from `lines`, else from the file $HKGPU_TUNE_KMSG_REPLAY names (tests, the
    replayed host of `health` and `export`), else the live log: /dev/kmsg, then journalctl."""
    if lines is None:
        replay = os.environ.get(ENV_REPLAY)
        if replay:
            try:
                lines = read_replay(replay)
            except OSError as e:
                raise OSError(f"{replay}: cannot read the kernel log replay ({ENV_REPLAY}): {e.strerror}") from None
        else:
            try:
                lines = read_kmsg()
            except OSError:
                lines = read_journal()
    # one search over the whole log, then only the lines it hit (a ring buffer holds thousands)
    text, out, last = "\n".join(lines), [], -1
    for m in ANY_RE.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        if start == last:
            continue
        last = start
        end = text.find("\n", m.end())
        e = parse_line(text[start:None if end < 0 else end])
        if e is not None:
            out.append(e)
    return out


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
