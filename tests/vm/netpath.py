"""Emulated Hong Kong paths around the VM test node (tests/vm/vm.py), and the measurements of
bench/net_vm.py and tests/vm/test_netproof_vm.py.

Where each piece sits (this machine's kernel has no netem or tbf: delay lives in the node's kernel):
- node -> peer (upload): the node's data NIC is the bottleneck: an htb root at RATE whose one leaf
  is the qdisc the node's own configuration puts on that NIC's queues (read from the kernel: stock
  Debian or the site's choice, or the tuned node's fq_codel). The node's qdisc holds the queue.
- peer -> node (download): the switch port in front of the node is the bottleneck: htb at RATE with
  a byte FIFO of BUFFER_MS at RATE on the tap (the host's kernel), a queue the node does not own.
- delay, jitter and loss: netem on an ifb that takes the node's data NIC ingress (Debian's kernel),
  so the whole RTT is added once, on the way in.
The peer (a namespace on this machine) is a well-tuned far end: 64 MiB TCP buffers, so the node's
own settings decide the window.
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass

from ..helpers import sh
from .vm import DATA_MAC, PEER_ADDR

PORT = 5201
BUFFER_MS = 100          # the switch port's FIFO, in milliseconds at the shaped rate
PEER_BUF = 64 << 20
NETEM_RATE_MBIT = 10000  # netem's own rate: no bottleneck, only keeps order (see shape)


@dataclass(frozen=True)
class Path:
    name: str
    label: str
    rtt_ms: float
    jitter_ms: float = 0.0
    loss_pct: float = 0.0


PATHS = {p.name: p for p in (
    Path("rack", "rack fabric (no added delay)", 0.0),
    Path("sg", "HK-Singapore (35 ms, 1 ms jitter, 0.1 % loss)", 35.0, 1.0, 0.1),
    Path("usw", "HK-US west (150 ms)", 150.0),
)}


def nic(vm) -> str:
    return vm.ssh(f"grep -il {DATA_MAC} /sys/class/net/*/address | cut -d/ -f5", check=True).stdout.strip()


def queue_qdisc(vm, dev: str) -> str:
    """The qdisc the node's configuration gives the NIC's transmit queues (the kernel's view)."""
    qs = json.loads(vm.ssh(f"tc -j qdisc show dev {dev}", check=True).stdout)
    root = next(q for q in qs if q.get("root"))
    if root["kind"] != "mq":
        return root["kind"]
    kinds = {q["kind"] for q in qs if not q.get("root") and q["kind"] not in ("ingress", "clsact")}
    if len(kinds) != 1:
        raise AssertionError(f"{dev}: transmit queues with several qdiscs: {qs}")
    return kinds.pop()


def peer_up(vm) -> None:
    """The far end: large buffers, an iperf3 server (one at a time) on the peer address."""
    sh("sysctl", "-qw", f"net.ipv4.tcp_rmem=4096 131072 {PEER_BUF}", f"net.ipv4.tcp_wmem=4096 65536 {PEER_BUF}",
       ns=vm.peer)
    sh("iperf3", "-s", "-D", "-B", PEER_ADDR, "-p", str(PORT), "--pidfile", f"{vm.work}/iperf3.pid", ns=vm.peer)


def peer_down(vm) -> None:
    try:
        with open(f"{vm.work}/iperf3.pid") as f:
            sh("kill", f.read().strip(), check=False)
    except OSError:
        pass


def shape(vm, dev: str, path: Path, rate_mbit: int) -> str:
    """Put the path in place; returns the leaf qdisc (the node's own) that holds the upload queue."""
    leaf = queue_qdisc(vm, dev)
    burst = "burst 64k cburst 64k"
    # netem's rate (far over the path's) keeps packets in order under jitter, as a WAN path does: without
    # it every jittered packet is reordered, and the emulated guest soft-locked on the SACK storm
    netem = f"delay {path.rtt_ms:g}ms" + (f" {path.jitter_ms:g}ms" if path.jitter_ms else "") + \
        (f" loss {path.loss_pct:g}%" if path.loss_pct else "") + f" rate {NETEM_RATE_MBIT}mbit"
    vm.ssh(f"set -e; modprobe ifb numifbs=1; modprobe sch_netem; ip link set ifb0 mtu 9000 up\n"
           f"tc qdisc del dev {dev} root 2>/dev/null || true\n"
           f"tc qdisc add dev {dev} root handle 1: htb default 1\n"
           f"tc class add dev {dev} parent 1: classid 1:1 htb rate {rate_mbit}mbit ceil {rate_mbit}mbit {burst}\n"
           f"tc qdisc add dev {dev} parent 1:1 handle 10: {leaf}\n"
           f"tc qdisc add dev {dev} handle ffff: ingress\n"
           f"tc filter add dev {dev} parent ffff: protocol all u32 match u32 0 0 action mirred egress redirect dev ifb0\n"
           f"tc qdisc replace dev ifb0 root netem {netem if path.rtt_ms else 'delay 0ms'} limit 100000",
           check=True)
    fifo = int(rate_mbit * 1e6 / 8 * BUFFER_MS / 1000)
    sh("tc", "qdisc", "replace", "dev", "tap0", "root", "handle", "1:", "htb", "default", "1", ns=vm.sw)
    sh("tc", "class", "add", "dev", "tap0", "parent", "1:", "classid", "1:1", "htb", "rate", f"{rate_mbit}mbit",
       "ceil", f"{rate_mbit}mbit", "burst", "64k", "cburst", "64k", ns=vm.sw)
    sh("tc", "qdisc", "add", "dev", "tap0", "parent", "1:1", "handle", "10:", "bfifo", "limit", str(fifo), ns=vm.sw)
    return leaf


def unshape(vm, dev: str) -> None:
    """The node's root qdisc back to the kernel's default (mq with default_qdisc per queue)."""
    vm.ssh(f"tc qdisc del dev {dev} root 2>/dev/null; tc qdisc del dev {dev} ingress 2>/dev/null; "
           "tc qdisc del dev ifb0 root 2>/dev/null; true", check=True)
    sh("tc", "qdisc", "del", "dev", "tap0", "root", ns=vm.sw, check=False)


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def cpu_seconds(line: str) -> float:
    """Busy CPU seconds from /proc/stat's first line (all but idle and iowait; USER_HZ 100)."""
    v = [int(x) for x in line.split()[1:9]]
    return (sum(v) - v[3] - v[4]) / 100


def one_run(vm, streams: int, reverse: bool, seconds: int, omit: int) -> dict:
    """One iperf3 test from the node (reverse: the peer sends), ping every 50 ms during it, and the
    node's busy CPU time over the measured part."""
    script = (f"rm -f /tmp/np-*; (sleep {omit}; head -1 /proc/stat > /tmp/np-c0; "
              f"exec ping -n -i 0.05 -w {seconds} {PEER_ADDR}) > /tmp/np-ping 2>&1 &\n"
              f"iperf3 -c {PEER_ADDR} -p {PORT} -t {seconds} -O {omit} -P {streams} {'-R' if reverse else ''} "
              f"--json > /tmp/np-iperf 2>&1; wait; head -1 /proc/stat > /tmp/np-c1\n"
              "echo @@C0; cat /tmp/np-c0; echo @@C1; cat /tmp/np-c1; echo @@PING; cat /tmp/np-ping; "
              "echo @@IPERF; cat /tmp/np-iperf")
    out = vm.ssh(script, timeout=seconds + omit + 120).stdout
    parts = dict(re.findall(r"@@(\w+)\n(.*?)(?=\n@@|\Z)", out, re.S))
    try:
        doc = json.loads(parts.get("IPERF", ""))
    except ValueError:
        return {"error": f"iperf3 gave no JSON: {parts.get('IPERF', out)[-300:]}"}
    if doc.get("error"):
        return {"error": f"iperf3: {doc['error']}"}
    recv, sent = doc["end"]["sum_received"], doc["end"]["sum_sent"]
    rtts = [float(x) for x in re.findall(r"time=([\d.]+) ms", parts.get("PING", ""))]
    cpu = cpu_seconds(parts["C1"]) - cpu_seconds(parts["C0"])
    return {"mbit": recv["bits_per_second"] / 1e6, "bytes": recv["bytes"], "retransmits": sent.get("retransmits"),
            "rtt_ms": rtts, "cpu_s": cpu, "cpu_s_per_gb": cpu / (recv["bytes"] / 1e9) if recv["bytes"] else None}


TESTS = (("up1", 1, False), ("up4", 4, False), ("down1", 1, True), ("down4", 4, True))


def measure(vm, runs: int, seconds: int, omit: int, tests=TESTS, log=print) -> dict:
    """Every test `runs` times, interleaved run by run; per test: throughput (Mbit/s) per run and its
    median, retransmits, RTT p50/p99 under that load (all pings of all runs), CPU s per GB."""
    raw = {name: [] for name, _, _ in tests}
    for i in range(runs):
        for name, streams, reverse in tests:
            r = one_run(vm, streams, reverse, seconds, omit)
            if "error" in r:   # one retry: the peer's server between two tests, or a guest that fell behind
                vm.wait_ssh(300)
                r = one_run(vm, streams, reverse, seconds, omit)
            raw[name].append(r)
            log(f"    run {i + 1} {name}: " + (r["error"] if "error" in r else
                f"{r['mbit']:.1f} Mbit/s, retr {r['retransmits']}, rtt p50 {pct(r['rtt_ms'], 50)} "
                f"p99 {pct(r['rtt_ms'], 99)} ms, cpu {r['cpu_s_per_gb']:.1f} s/GB"))
    out = {}
    for name, rs in raw.items():
        ok = [r for r in rs if "error" not in r]
        rtts = [x for r in ok for x in r["rtt_ms"]]
        out[name] = {"mbit_runs": [round(r["mbit"], 2) for r in ok],
                     "mbit": round(statistics.median(r["mbit"] for r in ok), 2) if ok else None,
                     "retransmits": [r["retransmits"] for r in ok],
                     "rtt_p50_ms": pct(rtts, 50), "rtt_p99_ms": pct(rtts, 99), "pings": len(rtts),
                     "cpu_s_per_gb": round(sum(r["cpu_s"] for r in ok) / (sum(r["bytes"] for r in ok) / 1e9), 2)
                     if ok else None,
                     "errors": [r["error"] for r in rs if "error" in r]}
    return out


def idle_rtt(vm, count: int = 40) -> dict:
    """RTT to the peer with no load (the path's base RTT as the node sees it)."""
    out = vm.ssh(f"ping -n -i 0.05 -c {count} {PEER_ADDR}", timeout=120).stdout
    rtts = [float(x) for x in re.findall(r"time=([\d.]+) ms", out)]
    return {"rtt_p50_ms": pct(rtts, 50), "rtt_p99_ms": pct(rtts, 99), "pings": len(rtts)}
