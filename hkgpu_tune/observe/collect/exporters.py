"""Defer to the exporters a node already runs: node_exporter and dcgm-exporter measure NIC and TCP
counters and GPU readings live (at every scrape); the export writes its copy of those only where
they do not run. What they lack (settings, drift, probes, health verdicts, per-queue drops,
throttle reasons, ECC counts, PCIe link, a pending remap) is always exported.

The profile's switch (`export:` section):

    export:
      node_exporter: auto      # auto (look for its process) | true | false
      dcgm_exporter: auto
      collectors: [nic, tcp, gpu, kmsg]   # which collectors run at all (probe: --probes)

>>> deferred({"node_exporter": True, "dcgm_exporter": False})   # doctest: +ELLIPSIS
frozenset({...'hkgpu_tune_nic_dropped_total'...})
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from hkgpu_tune.observe.collect import DEFAULT, NAMES, Family

EXPORTERS = ("node_exporter", "dcgm_exporter")
# the process names (/proc/PID/comm: 15 characters at most) of each exporter
PROCESSES = {"node_exporter": {"node_exporter", "prometheus-node"}, "dcgm_exporter": {"dcgm-exporter"}}
# our families that the exporter has under its own names (docs/monitoring.md lists the pairs)
DUPLICATES = {
    # netdev: node_network_{receive,transmit}_{drop,errs}_total; netstat: node_netstat_Tcp_{RetransSegs,OutSegs}
    "node_exporter": frozenset({"hkgpu_tune_nic_dropped_total", "hkgpu_tune_nic_errors_total",
                                "hkgpu_tune_tcp_retransmitted_segments_total", "hkgpu_tune_tcp_sent_segments_total"}),
    # default counters: DCGM_FI_DEV_GPU_UTIL, _FB_USED/_FB_FREE, _GPU_TEMP, _POWER_USAGE, _XID_ERRORS,
    # _CORRECTABLE_REMAPPED_ROWS, _UNCORRECTABLE_REMAPPED_ROWS, _ROW_REMAP_FAILURE
    "dcgm_exporter": frozenset({"hkgpu_tune_gpu_utilization_ratio", "hkgpu_tune_gpu_memory_used_bytes",
                                "hkgpu_tune_gpu_memory_total_bytes", "hkgpu_tune_gpu_temperature_celsius",
                                "hkgpu_tune_gpu_power_watts", "hkgpu_tune_xid_events",
                                "hkgpu_tune_gpu_remapped_rows", "hkgpu_tune_gpu_remap_failed"}),
}
AUTO = "auto"


@dataclass(frozen=True)
class ExportConfig:
    node_exporter: bool | str = AUTO
    dcgm_exporter: bool | str = AUTO
    collectors: tuple = DEFAULT


def parse_profile(n) -> ExportConfig:
    """The `export:` section (a profile.Node); errors name file:line and key."""
    m = n.mapping(EXPORTERS + ("collectors",))
    kw: dict = {}
    for k in EXPORTERS:
        if k in m:
            v = m[k].value()
            if v != AUTO and not isinstance(v, bool):
                raise m[k].error(f"expected auto, true or false, got {m[k]._desc()}")
            kw[k] = v
    if "collectors" in m:
        names = [i.choice([x for x in NAMES if x != "probe"]) for i in m["collectors"].items()]
        kw["collectors"] = tuple(dict.fromkeys(names))
    return ExportConfig(**kw)


def config_of(profile) -> ExportConfig:
    return (profile.section("export") if profile is not None else None) or ExportConfig()


def running(proc: str = "/proc") -> set[str]:
    """The exporters with a process on this host (a container's process is one of the host's too)."""
    comms: set[str] = set()
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return set()
    for pid in pids:
        try:
            with open(os.path.join(proc, pid, "comm")) as f:
                comms.add(f.read().strip())
        except OSError:   # gone since the listing
            continue
    return {name for name, procs in PROCESSES.items() if comms & procs}


def present(cfg: ExportConfig, proc: str = "/proc") -> dict[str, bool]:
    """exporter -> whether it runs here: the profile's true/false, else what `running` sees."""
    seen = running(proc) if AUTO in (cfg.node_exporter, cfg.dcgm_exporter) else set()
    return {k: (k in seen) if getattr(cfg, k) == AUTO else bool(getattr(cfg, k)) for k in EXPORTERS}


def deferred(there: dict[str, bool]) -> frozenset:
    return frozenset().union(*(DUPLICATES[k] for k, v in there.items() if v))


def apply(results, there: dict[str, bool]) -> Family:
    """Drop from the collectors' results the families the running exporters already have; the
    collectors' data (health reads it) stays. Returns hkgpu_tune_exporter_present."""
    drop = deferred(there)
    for r in results:
        r.families = [f for f in r.families if f.name not in drop]
    return Family("hkgpu_tune_exporter_present", "gauge",
                  "1 if the exporter runs on this node (the export then leaves its metrics to it).",
                  [({"exporter": k}, 1 if v else 0) for k, v in sorted(there.items())])
