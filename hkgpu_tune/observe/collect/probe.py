"""RTT, jitter and loss to the profile's fabric and WAN peers, bounded in time.

>>> ping("198.18.0.2", count=5, interval_s=0.2).p99_ms     # doctest: +SKIP

iputils `ping` is used, one reply line at a time ("time=0.041 ms"): it is on every node already
(the MTU probe needs it), handles IPv4 and IPv6 and don't-fragment (-M do), and needs no raw
socket code in Python (an ICMP library would need CAP_NET_RAW handling of its own).
"""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from hkgpu_tune.core.fsutil import program_refusal
from hkgpu_tune.observe.collect import Family

TIME_RE = re.compile(r"\bicmp_seq=(\d+)\b.*\btime[=<]([0-9.]+) ms")
SENT_RE = re.compile(r"(\d+) packets transmitted")


@dataclass
class PingStats:
    addr: str
    sent: int = 0
    received: int = 0
    rtts_ms: list = field(default_factory=list)
    p50_ms: float | None = None
    p99_ms: float | None = None
    jitter_ms: float | None = None
    loss_ratio: float | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def quantile(sorted_vals: list[float], q: float) -> float:
    """Nearest rank (the project's gate uses the same)."""
    return sorted_vals[max(0, math.ceil(q * len(sorted_vals)) - 1)]


def stats(addr: str, sent: int, rtts: list[float], error: str | None = None) -> PingStats:
    s = PingStats(addr, sent, len(rtts), list(rtts), error=error)
    if sent:
        s.loss_ratio = max(0.0, (sent - len(rtts)) / sent)
    if rtts:
        srt = sorted(rtts)
        s.p50_ms, s.p99_ms = quantile(srt, 0.5), quantile(srt, 0.99)
        s.jitter_ms = sum(abs(b - a) for a, b in zip(rtts, rtts[1:])) / (len(rtts) - 1) if len(rtts) > 1 else 0.0
    return s


def parse(addr: str, text: str, count: int) -> PingStats:
    """iputils ping's output -> PingStats (replies in sequence order; duplicates counted once)."""
    seen, rtts = set(), []
    for line in text.splitlines():
        m = TIME_RE.search(line)
        if m and "DUP!" not in line and m.group(1) not in seen:
            seen.add(m.group(1))
            rtts.append(float(m.group(2)))
    m = SENT_RE.search(text)
    sent = int(m.group(1)) if m else count
    return stats(addr, sent, rtts)


def ping(addr: str, count: int = 5, interval_s: float = 0.2, timeout_s: float = 1.0,
         size: int | None = None, df: bool = False, deadline_s: float | None = None,
         netns: str | None = None) -> PingStats:
    """Send `count` echo requests; never raises (a failure is PingStats.error)."""
    exe = shutil.which("ping") or "/usr/bin/ping"
    if os.path.exists(exe) and program_refusal(exe):
        return PingStats(addr, error=program_refusal(exe))
    deadline = deadline_s or (count * interval_s + timeout_s)
    argv = [exe, "-n", "-c", str(count), "-i", f"{interval_s:g}", "-W", f"{timeout_s:g}",
            "-w", str(max(1, math.ceil(deadline)))]
    if size is not None:
        argv += ["-s", str(int(size))]
    if df:
        argv += ["-M", "do"]
    argv.append(addr)
    if netns:
        argv = ["ip", "netns", "exec", netns] + argv
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=deadline + 2)
    except FileNotFoundError:
        return PingStats(addr, error="ping not found (install iputils-ping)")
    except subprocess.TimeoutExpired:
        return PingStats(addr, error=f"ping did not finish within {deadline + 2:g} s")
    s = parse(addr, p.stdout, count)
    if p.returncode not in (0, 1):   # 1: some replies missing; 2: an error (unknown host, no route)
        s.error = " ".join((p.stderr or p.stdout).split())[:200] or f"ping exited {p.returncode}"
    elif s.received == 0 and s.sent == 0:
        s.error = "no packets sent"
    return s


def peers(profile) -> list[tuple[str, str, str, float | None]]:
    """(name, kind, address, expected rtt ms) of the profile's fabric and WAN peers."""
    net = profile.network
    out = [(a, "fabric", a, None) for a in net.fabric_peers]
    out += [(p.name or p.address, "wan", p.address, p.rtt_ms) for p in net.wan_peers]
    return out


def probe_peers(profile, count: int = 5, deadline_s: float = 5.0) -> list[tuple[str, str, PingStats]]:
    """Ping every peer at once; each run ends within deadline_s."""
    ps = peers(profile)
    if not ps:
        return []
    interval = max(0.01, min(0.2, (deadline_s - 1) / max(count, 1)))
    with ThreadPoolExecutor(max_workers=min(16, len(ps))) as ex:
        futs = [ex.submit(ping, addr, count, interval, 1.0, deadline_s=deadline_s) for _, _, addr, _ in ps]
        return [(name, kind, f.result()) for (name, kind, _, _), f in zip(ps, futs)]


def jitter_thresholds_ms(profile) -> dict[str, float]:
    """peer name -> the profile's jitter threshold (network.wan_peers[].jitter_ms), where set."""
    return {p.name or p.address: p.jitter_ms for p in profile.network.wan_peers if p.jitter_ms is not None}


def families(profile, results) -> list[Family]:
    # two gauges, not one with a quantile label: promtool allows "quantile" on summaries only
    F = [Family("hkgpu_tune_peer_rtt_p50_seconds", "gauge", "Median round-trip time to a peer over one probe."),
         Family("hkgpu_tune_peer_jitter_seconds", "gauge", "Mean absolute difference of consecutive RTTs."),
         Family("hkgpu_tune_peer_loss_ratio", "gauge", "Share of probes without a reply."),
         Family("hkgpu_tune_peer_rtt_expected_seconds", "gauge", "The profile's expected RTT (wan_peers[].rtt_ms)."),
         Family("hkgpu_tune_peer_jitter_threshold_seconds", "gauge", "The profile's jitter threshold (wan_peers[].jitter_ms)."),
         Family("hkgpu_tune_peer_rtt_p99_seconds", "gauge", "99th percentile round-trip time to a peer over one probe.")]
    expected = {name: rtt for name, _, _, rtt in peers(profile)}
    jitter_max = jitter_thresholds_ms(profile)
    for name, kind, s in results:
        lab = {"peer": name, "kind": kind}
        F[0].samples.append((lab, None if s.p50_ms is None else s.p50_ms / 1000))
        F[5].samples.append((lab, None if s.p99_ms is None else s.p99_ms / 1000))
        F[1].samples.append((lab, None if s.jitter_ms is None else s.jitter_ms / 1000))
        F[2].samples.append((lab, 1.0 if s.loss_ratio is None else s.loss_ratio))
        if expected.get(name) is not None:
            F[3].samples.append((lab, expected[name] / 1000))
        if kind == "wan" and name in jitter_max:
            F[4].samples.append((lab, jitter_max[name] / 1000))
    return F


def run(profile, src):
    res = probe_peers(profile, src.probe_count, src.probe_deadline_s)
    return families(profile, res), {"peers": [{"peer": n, "kind": k, **s.to_dict()} for n, k, s in res]}
