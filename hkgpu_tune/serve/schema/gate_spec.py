"""triton.gate: the deployment gate's settings, parsed with the project's input rules.

    gate:
      ready_timeout_s: 120
      warmup_requests: 5
      load: {requests: 200, concurrency: 8, processes: 4, protocol: grpc}   # protocol: http (default) | grpc
      p99_ms: 50
      live: {min_req_s: 5, window_s: 5, canary: 4}   # a busy node: judged by its live traffic (serve/measuring/gate.py)
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gate:
    ready_timeout_s: float = 120.0
    warmup_requests: int = 5
    requests: int = 200
    concurrency: int = 8
    p99_ms: float | None = None    # None: measure, do not gate
    stop_timeout_s: float = 30.0
    processes: int | None = None   # the load generator's processes (None: one per 4 in flight)
    protocol: str = "http"         # the load's protocol: http (binary tensors) or grpc
    live_min_req_s: float = 5.0    # live traffic: requests/s the gate did not send, seen before its load
    live_window_s: float = 5.0     # on a busy node: the window over which Triton's figures are read
    canary: int = 4                # on a busy node: the gate's own requests in flight (instead of the load)
    live_no_worse: float = 1.2     # a node over its SLO before a reload: how much slower the new config may be


def parse(n) -> Gate:
    m = n.mapping(("ready_timeout_s", "warmup_requests", "load", "p99_ms", "stop_timeout_s", "live"))
    kw = {}
    if "ready_timeout_s" in m:
        kw["ready_timeout_s"] = float(m["ready_timeout_s"].integer(1, 3600))
    if "stop_timeout_s" in m:
        kw["stop_timeout_s"] = float(m["stop_timeout_s"].integer(1, 600))
    if "warmup_requests" in m:
        kw["warmup_requests"] = m["warmup_requests"].integer(0, 100000)
    if "load" in m:
        lm = m["load"].mapping(("requests", "concurrency", "processes", "protocol"))
        if "requests" in lm:
            kw["requests"] = lm["requests"].integer(1, 10_000_000)
        if "concurrency" in lm:
            kw["concurrency"] = lm["concurrency"].integer(1, 1024)
        if "processes" in lm:
            kw["processes"] = lm["processes"].integer(1, 256)
        if "protocol" in lm:
            kw["protocol"] = lm["protocol"].choice(("http", "grpc"))
    if "live" in m:   # a node already serving: judge by what its traffic gets (serve/measuring/gate.py)
        lv = m["live"].mapping(("min_req_s", "window_s", "canary", "no_worse"))
        if "min_req_s" in lv:
            kw["live_min_req_s"] = float(lv["min_req_s"].integer(1, 10_000_000))
        if "window_s" in lv:
            kw["live_window_s"] = float(lv["window_s"].integer(1, 600))
        if "canary" in lv:
            kw["canary"] = lv["canary"].integer(1, 64)
        if "no_worse" in lv:
            v = lv["no_worse"].value()
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 1.0 <= v <= 10.0:
                raise lv["no_worse"].error(f"expected a ratio from 1 to 10 (the new config's p99 over the old "
                                           f"one's), got {lv['no_worse']._desc()}")
            kw["live_no_worse"] = float(v)
    if "p99_ms" in m:
        v = m["p99_ms"].value()
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise m["p99_ms"].error(f"expected a positive number of milliseconds, got {m['p99_ms']._desc()}")
        kw["p99_ms"] = float(v)
    return Gate(**kw)
