"""TCP counters from /proc/net/snmp (Tcp:) and /proc/net/netstat (TcpExt:), names in snake case:
RetransSegs -> retrans_segs, TCPLostRetransmit -> tcp_lost_retransmit.

>>> read()["retrans_segs"]          # doctest: +SKIP
"""
from __future__ import annotations

import re

from hkgpu_tune.observe.collect import Family

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake(name: str) -> str:
    return _CAMEL.sub("_", name).lower()


def parse(text: str, prefix: str) -> dict[str, int]:
    """The header/value line pair of one prefix ("Tcp:", "TcpExt:") -> {snake_name: int}."""
    rows = [ln.split() for ln in text.splitlines() if ln.startswith(prefix + ":")]
    out = {}
    for head, vals in zip(rows[0::2], rows[1::2]):
        for k, v in zip(head[1:], vals[1:]):
            try:
                out[snake(k)] = int(v)
            except ValueError:
                pass
    return out


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def read(proc: dict | None = None) -> dict[str, int]:
    snmp = proc["snmp"] if proc else _read("/proc/net/snmp")
    netstat = proc.get("netstat", "") if proc else _read("/proc/net/netstat")
    out = parse(netstat, "TcpExt")
    out.update(parse(snmp, "Tcp"))
    if "retrans_segs" not in out:
        raise ValueError("no Tcp: RetransSegs in /proc/net/snmp")
    return out


def families(t: dict) -> list[Family]:
    return [Family("hkgpu_tune_tcp_retransmitted_segments_total", "counter", "TCP segments retransmitted (RetransSegs).",
                   [({}, t.get("retrans_segs"))]),
            Family("hkgpu_tune_tcp_sent_segments_total", "counter", "TCP segments sent (OutSegs).",
                   [({}, t.get("out_segs"))])]


def run(profile, src):
    t = read(src.proc)
    return families(t), {"tcp": t}
