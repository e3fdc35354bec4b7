"""One dated snapshot of a node: facts, ping statistics to every peer, iperf3 throughput to each
fabric peer (both directions, repeated), NIC and TCP counters over the run, kernel events since
boot, GPU facts and an engine benchmark. A measurement that fails is one line in `problems` and
an `error` in its place; the rest is still measured and written.

>>> snap, problems = capture(load_profile("node.yaml"), quick=True)    # doctest: +SKIP
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from hkgpu_tune.core import report
from hkgpu_tune.core.errors import HkError
from hkgpu_tune.baseline import COMMAND, FORMAT, engine_bench, iperf, settings

NIC_KEYS = ("rx_dropped", "tx_dropped", "rx_errors", "tx_errors", "rx_packets", "tx_packets", "rx_bytes", "tx_bytes")
TCP_KEYS = ("retrans_segs", "out_segs", "in_segs", "in_errs")


def _collect(profile, names):
    from hkgpu_tune.observe.collect import collect
    return {r.collector: r for r in collect(profile, names)}


def _delta(before: dict, after: dict, keys) -> dict:
    return {k: after[k] - before[k] for k in keys
            if isinstance(before.get(k), int) and isinstance(after.get(k), int)}


def _ping_missing() -> bool:
    import shutil
    return shutil.which("ping") is None and not os.path.exists("/usr/bin/ping")


def ping_all(profile, counts: settings.Counts, tolerance_pct: float) -> tuple[list[dict], list[str]]:
    """Every fabric and WAN peer at once: `ping_count` echoes each, bounded in time."""
    from hkgpu_tune.observe.collect import probe
    peers = probe.peers(profile)
    if not peers:
        return [], []
    if _ping_missing():
        why = "ping is not installed (Debian package iputils-ping): no RTT measured"
        return [{"peer": n, "kind": k, "address": a, "expected_rtt_ms": e, "error": why, "rtts_ms": []}
                for n, k, a, e in peers], [why]
    interval = counts.ping_interval_ms / 1000
    if os.geteuid() != 0 and interval < 0.2:
        interval = 0.2            # iputils refuses faster intervals to non-root users
    deadline = counts.ping_count * interval + 2
    with ThreadPoolExecutor(max_workers=min(16, len(peers))) as ex:
        futs = [ex.submit(probe.ping, addr, counts.ping_count, interval, 1.0, deadline_s=deadline)
                for _, _, addr, _ in peers]
        stats = [f.result() for f in futs]
    rows, problems = [], []
    for (name, kind, addr, expected), s in zip(peers, stats):
        row = {"peer": name, "kind": kind, "address": addr, "expected_rtt_ms": expected,
               "interval_ms": round(interval * 1000, 3), **s.to_dict()}
        row.pop("addr", None)
        if s.error or not s.received:
            why = s.error or f"no reply to {s.sent} echo requests"
            row["error"] = why
            problems.append(f"{kind} peer {name} ({addr}): unreachable: {why}")
        elif expected is not None and s.p50_ms > expected * (1 + tolerance_pct / 100):
            row["over_expected"] = True
            problems.append(f"{kind} peer {name} ({addr}): RTT p50 {s.p50_ms:.3g} ms is over the expected "
                            f"{expected:g} ms (wan_peers[].rtt_ms) by more than {tolerance_pct:g}%")
        else:
            row["over_expected"] = False if expected is not None else None
        rows.append(row)
    return rows, problems


def throughput(profile, cfg: settings.Settings, counts: settings.Counts) -> tuple[list[dict], list[str]]:
    """iperf3 to each fabric peer in turn (never two at once: they would share the NIC), send and
    receive interleaved run by run so a drift in time hits both directions alike."""
    peers = list(profile.network.fabric_peers)
    if not peers:
        return [], []
    if iperf.exe() is None:
        return [{"peer": p, "direction": d, "error": iperf.MISSING, "runs": []}
                for p in peers for d in ("send", "receive")], [iperf.MISSING]
    rows, problems = [], []
    for addr in peers:
        mine = {d: {"peer": addr, "direction": d, "streams": cfg.iperf3_streams, "seconds": counts.iperf3_seconds,
                    "port": cfg.iperf3_port, "runs": [], "error": None} for d in ("send", "receive")}
        for i in range(counts.iperf3_runs):
            for d in ("send", "receive"):
                r = iperf.client(addr, cfg.iperf3_port, counts.iperf3_seconds, cfg.iperf3_streams,
                                 reverse=(d == "receive"), omit_s=counts.iperf3_omit_s)
                if r.error:
                    mine[d]["error"] = r.error
                else:
                    mine[d]["runs"].append(r.to_dict())
            if i == 0 and all(m["error"] and not m["runs"] for m in mine.values()):
                break            # unreachable or no server: one line, not a line per run
        errs = {d: m["error"] for d, m in mine.items() if m["error"]}
        hint = " (is `hkgpu-tune baseline serve` running there?)" if any("connect" in e for e in errs.values()) else ""
        if len(errs) == 2 and len(set(errs.values())) == 1:
            problems.append(f"fabric peer {addr}: {errs['send']}{hint}")   # the same failure both ways: one line
        else:
            problems += [f"fabric peer {addr} {d}: {e}{hint}" for d, e in errs.items()]
        rows += list(mine.values())
    return rows, problems


def capture(profile, quick: bool = False, engine: bool = True) -> tuple[dict, list[str]]:
    """The snapshot (report.envelope shape) and the problems found, one line each."""
    cfg = settings.of(profile)
    counts = cfg.counts(quick)
    problems: list[str] = []
    timings: dict[str, float] = {}
    t_all = time.monotonic()

    def timed(name, fn, *a):
        t = time.monotonic()
        try:
            return fn(*a)
        finally:
            timings[name] = round(time.monotonic() - t, 3)

    facts = timed("facts", _facts, profile)
    before = timed("counters_before", _collect, profile, ["nic", "tcp"])
    latency, p = timed("ping", ping_all, profile, counts, cfg.rtt_tolerance_pct)
    problems += p
    tput, p = timed("iperf3", throughput, profile, cfg, counts)
    problems += p
    after = timed("counters_after", _collect, profile, ["nic", "tcp", "gpu", "kmsg"])
    counters = {}
    for name in ("nic", "tcp"):
        b, a = before.get(name), after.get(name)
        if not (b and a and b.up and a.up):
            err = (a and a.error) or (b and b.error) or "not collected"
            counters[name] = {"error": err}
            problems.append(f"{name} counters: {err}")
            continue
        if name == "nic":
            bn, an = b.data.get("nics", {}), a.data.get("nics", {})
            counters["nic"] = {dev: _delta(bn[dev], an[dev], NIC_KEYS) for dev in an if dev in bn}
        else:
            counters["tcp"] = _delta(b.data.get("tcp", {}), a.data.get("tcp", {}), TCP_KEYS)
    k = after.get("kmsg")
    kernel = {"events": (k.data.get("events") or [])[-200:], "error": None} if k and k.up else \
        {"events": [], "error": (k.error if k else "not collected")}
    if kernel["error"]:
        problems.append(f"kernel log: {kernel['error']}")
    g = after.get("gpu")
    gpu = {"gpus": g.data.get("gpus", []), "unsupported": g.data.get("unsupported"), "error": None} if g and g.up \
        else {"gpus": [], "error": g.error if g else "not collected"}
    bench = timed("engine", engine_bench.run, cfg.engine, quick, engine)
    if bench.get("status") == "error":
        problems.append(f"engine benchmark: {bench.get('reason')}")
    timings["total"] = round(time.monotonic() - t_all, 3)
    data = {"baseline_format": FORMAT, "quick": quick, "boot_id": _boot_id(), "counts": counts.__dict__,
            "iperf3_streams": cfg.iperf3_streams, "facts": facts, "latency": latency,
            "throughput": tput, "counters": counters, "kernel": kernel, "gpu": gpu, "engine": bench,
            "problems": problems, "timings_s": timings,
            # compare without a profile (rack baseline on the controller) judges by these
            "thresholds": {k: asdict(t) for k, t in cfg.thresholds.items()}}
    return report.envelope(COMMAND, data, profile), problems


def _boot_id() -> str | None:
    """Kernel event counts are since boot: compare needs to know whether a reboot came between."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read(64).strip() or None
    except OSError:
        return None


def _facts(profile) -> dict:
    from hkgpu_tune.tune.engine import Engine
    try:
        eng = Engine(profile)
        try:
            return eng.facts()
        finally:
            eng.b.close()
    except HkError as e:
        return {"error": str(e)}
