"""triton.connections: the server's gRPC keepalive and HTTP options, with defaults that keep client
connections long-lived (tritonserver's own defaults first ping an idle client after 2 hours and
close a client that pings more often than every 5 minutes).

    triton:
      connections:
        grpc_keepalive_time_ms: 60000          # ping an idle client every minute: inside NAT and
                                               # firewall idle timeouts (300-900 s), like TCP keepalive
        grpc_keepalive_timeout_ms: 20000       # no answer in 20 s: the connection is dead
        grpc_keepalive_permit_without_calls: true   # ping idle channels too (those are the ones cut)
        grpc_http2_max_pings_without_data: 0   # no limit on pings between requests
        grpc_http2_min_recv_ping_interval_without_data_ms: 10000   # a client may ping every 10 s
        grpc_http2_max_ping_strikes: 2
        http_thread_count: 16                  # optional: Triton's default is 8
"""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Connections:
    grpc_keepalive_time_ms: int = 60000
    grpc_keepalive_timeout_ms: int = 20000
    grpc_keepalive_permit_without_calls: bool = True
    grpc_http2_max_pings_without_data: int = 0
    grpc_http2_min_recv_ping_interval_without_data_ms: int = 10000
    grpc_http2_max_ping_strikes: int = 2
    http_thread_count: int | None = None


# profile key -> tritonserver option
OPTIONS = {"grpc_keepalive_time_ms": "--grpc-keepalive-time", "grpc_keepalive_timeout_ms": "--grpc-keepalive-timeout",
           "grpc_keepalive_permit_without_calls": "--grpc-keepalive-permit-without-calls",
           "grpc_http2_max_pings_without_data": "--grpc-http2-max-pings-without-data",
           "grpc_http2_min_recv_ping_interval_without_data_ms": "--grpc-http2-min-recv-ping-interval-without-data",
           "grpc_http2_max_ping_strikes": "--grpc-http2-max-ping-strikes", "http_thread_count": "--http-thread-count"}
LIMITS = {"http_thread_count": (1, 1024), "grpc_keepalive_time_ms": (1000, 86_400_000),
          "grpc_keepalive_timeout_ms": (1000, 600_000)}


def parse(n) -> Connections:
    m = n.mapping(tuple(OPTIONS))
    kw = {}
    for f in fields(Connections):
        if f.name in m:
            v = m[f.name]
            kw[f.name] = v.boolean() if f.type == "bool" else v.integer(*LIMITS.get(f.name, (0, 86_400_000)))
    return Connections(**kw)


def args(c: Connections) -> list[str]:
    out = []
    for key, opt in OPTIONS.items():
        v = getattr(c, key)
        if v is not None:
            out.append(f"{opt}={int(v) if isinstance(v, bool) else v}")
    return out
