"""Snapshots for compare tests, built from recorded iperf3 and ping output (tests/baseline/data)."""
from __future__ import annotations

import json
import os

from hkgpu_tune.baseline import FORMAT, iperf
from hkgpu_tune.observe.collect import probe

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def recorded(name: str) -> str:
    with open(os.path.join(DATA, name)) as f:
        return f.read()


def iperf_runs(name: str, scale: float = 1.0, n: int = 3) -> list[dict]:
    r = iperf.parse(recorded(name)).to_dict()
    r["gbit"] *= scale
    r["intervals_gbit"] = [x * scale for x in r["intervals_gbit"]]
    return [dict(r) for _ in range(n)]


def ping_row(peer: str, kind: str, name: str, scale: float = 1.0, expected=None) -> dict:
    s = probe.parse("198.18.0.2", recorded(name), 60)
    rtts = [x * scale for x in s.rtts_ms]
    s = probe.stats("198.18.0.2", s.sent, rtts)
    row = {"peer": peer, "kind": kind, "address": "198.18.0.2", "expected_rtt_ms": expected, **s.to_dict()}
    row.pop("addr")
    return row


def snapshot(host="node1", tput_scale=1.0, rtt_scale=1.0, engine=None, fmt=FORMAT, throughput=True,
             latency=True, time="2026-12-03T00:00:00Z") -> dict:
    tput = []
    if throughput:
        for d, f in (("send", "iperf3-send.json"), ("receive", "iperf3-reverse.json")):
            tput.append({"peer": "198.18.0.2", "direction": d, "streams": 4, "seconds": 2, "port": 5201,
                         "runs": iperf_runs(f, tput_scale), "error": None})
    lat = [ping_row("198.18.0.2", "fabric", "ping-60.txt", rtt_scale),
           ping_row("sg", "wan", "ping-60-loaded.txt", rtt_scale, expected=40)] if latency else []
    return {"schema_version": 1, "command": "baseline capture", "host": host, "profile": "p.yaml",
            "time": time, "version": "0.1.0", "baseline_format": fmt, "quick": False,
            "throughput": tput, "latency": lat,
            "counters": {"nic": {"eth1": {"rx_dropped": 0, "tx_dropped": 0, "rx_errors": 0, "tx_errors": 0}},
                         "tcp": {"retrans_segs": 10, "out_segs": 100000}},
            "kernel": {"events": [], "error": None}, "gpu": {"gpus": []},
            "engine": engine or {"status": "unsupported", "reason": "no GPU"}, "problems": []}


def write(path, doc) -> str:
    with open(path, "w") as f:
        json.dump(doc, f)
    return str(path)
