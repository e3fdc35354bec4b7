"""The profile's `baseline:` section: how much capture measures, and compare's thresholds.

    baseline:
      full:  {ping_count: 200, ping_interval_ms: 50, iperf3_runs: 3, iperf3_seconds: 5, iperf3_omit_s: 1}
      quick: {ping_count: 50, ping_interval_ms: 20, iperf3_runs: 2, iperf3_seconds: 1, iperf3_omit_s: 0}
      iperf3_streams: 4
      iperf3_port: 5201
      rtt_tolerance_pct: 25          # a WAN peer's p50 over wan_peers[].rtt_ms by more is flagged
      engine: {model: resnet50, batch: 32, seconds: 5}   # plan: /path/model.plan for trtexec
      thresholds:                    # per metric kind: pct and/or abs (see THRESHOLDS)
        throughput: {pct: 10}
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Counts:
    ping_count: int
    ping_interval_ms: int
    iperf3_runs: int
    iperf3_seconds: int
    iperf3_omit_s: int = 0


@dataclass(frozen=True)
class Threshold:
    """A 'worse' change regresses when it passes every limit given: pct (percent of the before
    value) and abs (in the metric's unit)."""
    pct: float | None = None
    abs: float | None = None

    def passed(self, before: float, after: float) -> bool:
        d = abs(after - before)
        if self.pct is not None:
            if before == 0:
                if d == 0:
                    return False
            elif d / abs(before) * 100 < self.pct:
                return False
        if self.abs is not None and d < self.abs:
            return False
        return self.pct is not None or self.abs is not None

    def describe(self) -> str:
        parts = ([f"{self.pct:g}%"] if self.pct is not None else []) + (
            [f"{self.abs:g}"] if self.abs is not None else [])
        return " and ".join(parts) or "-"


# metric kind -> threshold. RTT/jitter floors keep a 0.05 ms -> 0.08 ms wobble on a LAN from
# being a "regression"; loss, drops and events have no useful percentage (from 0), only counts.
THRESHOLDS: dict[str, Threshold] = {
    "throughput": Threshold(pct=10),          # Gbit/s per peer and direction
    "retransmits": Threshold(pct=50, abs=100),  # TCP retransmitted segments per iperf3 run
    "rtt_p50": Threshold(pct=20, abs=0.2),    # ms
    "rtt_p99": Threshold(pct=30, abs=0.5),    # ms
    "jitter": Threshold(pct=50, abs=0.5),     # ms
    "loss": Threshold(abs=0.01),              # ratio (1 point)
    "nic_drops": Threshold(abs=100),          # packets dropped or errored during the capture
    "tcp_retrans_ratio": Threshold(pct=100, abs=0.005),  # retransmitted/sent segments during the capture
    "kernel_events": Threshold(abs=1),        # XID, link flaps, NIC resets since boot
    "engine_rate": Threshold(pct=10),         # img/s
    "engine_latency": Threshold(pct=15, abs=0.1),  # ms
}


@dataclass(frozen=True)
class Engine:
    model: str = "resnet50"
    batch: int = 32
    seconds: int = 5
    plan: str | None = None     # a TensorRT plan for trtexec (else the torch engine)


@dataclass(frozen=True)
class Settings:
    full: Counts = Counts(200, 50, 3, 5, 1)
    quick: Counts = Counts(50, 20, 2, 1, 0)
    iperf3_streams: int = 4
    iperf3_port: int = 5201
    rtt_tolerance_pct: float = 25.0
    engine: Engine = Engine()
    thresholds: dict = field(default_factory=lambda: dict(THRESHOLDS))

    def counts(self, quick: bool) -> Counts:
        return self.quick if quick else self.full


def of(profile) -> Settings:
    s = profile.section("baseline") if profile is not None else None
    return s if isinstance(s, Settings) else Settings()


def _counts(n, base: Counts) -> Counts:
    m = n.mapping(("ping_count", "ping_interval_ms", "iperf3_runs", "iperf3_seconds", "iperf3_omit_s"))
    lim = {"ping_count": (1, 1000), "ping_interval_ms": (2, 10000), "iperf3_runs": (1, 20),
           "iperf3_seconds": (1, 60), "iperf3_omit_s": (0, 10)}
    return replace(base, **{k: v.integer(*lim[k]) for k, v in m.items()})


def parse_profile(n) -> Settings:
    """The typed section (profile.SECTIONS names this function)."""
    m = n.mapping(("full", "quick", "iperf3_streams", "iperf3_port", "rtt_tolerance_pct", "engine", "thresholds"))
    s = Settings()
    kw: dict = {}
    if "full" in m:
        kw["full"] = _counts(m["full"], s.full)
    if "quick" in m:
        kw["quick"] = _counts(m["quick"], s.quick)
    if "iperf3_streams" in m:
        kw["iperf3_streams"] = m["iperf3_streams"].integer(1, 128)
    if "iperf3_port" in m:
        kw["iperf3_port"] = m["iperf3_port"].integer(1, 65535)
    if "rtt_tolerance_pct" in m:
        kw["rtt_tolerance_pct"] = _number(m["rtt_tolerance_pct"], 0, 1000)
    if "engine" in m:
        e = m["engine"].mapping(("model", "batch", "seconds", "plan"))
        kw["engine"] = Engine(
            model=e["model"].string(r"[a-z][a-z0-9_]{0,63}", "a torchvision model name") if "model" in e else "resnet50",
            batch=e["batch"].integer(1, 4096) if "batch" in e else 32,
            seconds=e["seconds"].integer(1, 120) if "seconds" in e else 5,
            plan=e["plan"].string(r"/[^\x00]{1,4095}", "an absolute path to a TensorRT plan") if "plan" in e else None)
    if "thresholds" in m:
        th = dict(THRESHOLDS)
        for kind, v in m["thresholds"].mapping(tuple(THRESHOLDS)).items():
            t = v.mapping(("pct", "abs"))
            if not t:
                raise v.error("expected pct and/or abs")
            th[kind] = Threshold(pct=_number(t["pct"], 0, 10000) if "pct" in t else None,
                                 abs=_number(t["abs"], 0, 1e12) if "abs" in t else None)
        kw["thresholds"] = th
    return replace(s, **kw)


def _number(n, lo: float, hi: float) -> float:
    v = n.value()
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo <= v <= hi):
        raise n.error(f"expected a number {lo:g}-{hi:g}, got {n._desc()}")
    return float(v)
