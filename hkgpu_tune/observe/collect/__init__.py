"""Collectors shared by `hkgpu-tune export` (the Prometheus textfile) and the baseline snapshots.

>>> res = collect(load_profile("hk-inference"), ["tcp"])      # doctest: +SKIP
>>> res[0].data["retrans_segs"]                                # doctest: +SKIP
12
>>> print(to_textfile(res))                                    # doctest: +SKIP

Each collector is a module of this package with `run(profile, src) -> (families, data)`; `collect`
runs them, timing each, and turns any failure into up=False with a one-line error: a broken
collector never hides the others. `src` (a `Sources`) is where the readings come from: the host
by default, recorded files for tests and the bench.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field

from hkgpu_tune.core.promtext import Family, fmt, label, render  # noqa: F401 - the collectors' one renderer

NAMES = ("nic", "tcp", "gpu", "kmsg", "probe")
DEFAULT = ("nic", "tcp", "gpu", "kmsg")     # probe only when asked (it sends packets and takes time)


@dataclass
class Result:
    collector: str
    up: bool
    families: list = field(default_factory=list)
    data: dict = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0


@dataclass
class Sources:
    """Where collectors read from. None = the live host.

    nvml: an Nvml or ReplayNvml; nic: an object with devices(), stats(dev), ethtool_stats(dev)
    (collect.nic.SysNic by default); proc: a dict {"snmp": text, "netstat": text} (else /proc/net/*);
    kmsg_lines: kernel log lines (else /dev/kmsg, then `journalctl -k -b`); proc_root: the /proc
    whose processes say whether node_exporter and dcgm-exporter run here."""

    nvml: object = None
    nic: object = None
    proc: dict | None = None
    kmsg_lines: list | None = None
    proc_root: str = "/proc"        # where the exporters' processes are looked for (collect.exporters)
    probe_count: int = 5
    probe_deadline_s: float = 5.0


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def collect(profile, names=None, *, probes: bool = False, nvml=None, sources: Sources | None = None) -> list[Result]:
    """Run the named collectors (default: all; "probe" only with probes=True)."""
    src = sources or Sources()
    if nvml is not None:
        src.nvml = nvml
    if names is None:
        names = list(DEFAULT) + (["probe"] if probes else [])
    elif not probes:
        names = [n for n in names if n != "probe"]
    out = []
    for name in names:
        t = time.perf_counter()
        try:
            if name not in NAMES:
                raise ValueError(f"unknown collector {name!r} (have: {', '.join(NAMES)})")
            mod = importlib.import_module(f"{__name__}.{name}")
            fams, data = mod.run(profile, src)
            out.append(Result(name, True, fams, data, None, time.perf_counter() - t))
        except Exception as e:  # noqa: BLE001 - a collector's failure is a metric, not a crash
            out.append(Result(name, False, [], {}, one_line(e), time.perf_counter() - t))
    return out


def run_families(results) -> list[Family]:
    up = Family("hkgpu_tune_collector_up", "gauge", "1 if the collector ran, 0 if it failed.")
    dur = Family("hkgpu_tune_collector_duration_seconds", "gauge", "Time one collector took.")
    for r in results:
        up.samples.append(({"collector": r.collector}, 1 if r.up else 0))
        dur.samples.append(({"collector": r.collector}, round(r.seconds, 6)))
    return [up, dur]


def to_textfile(results) -> str:
    """Prometheus text format: each collector's families (merged by name), then up and duration."""
    merged: dict[str, Family] = {}
    for r in results:
        for f in r.families:
            if f.name in merged:
                merged[f.name].samples.extend(f.samples)
            else:
                merged[f.name] = Family(f.name, f.kind, f.help, list(f.samples))
    lines = render(list(merged.values()) + run_families(results))
    return "\n".join(lines) + "\n" if lines else ""
