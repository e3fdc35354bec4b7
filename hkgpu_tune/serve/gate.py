"""The last gate of a deployment: warm-up requests, then a short load whose p99 must stay under the SLO.

>>> rep = run_gate(t)          # doctest: +SKIP
>>> rep.passed, rep.message    # doctest: +SKIP
(True, 'doubler: p99 3.1 ms <= SLO 50 ms (p50 1.2 ms, 200 requests, concurrency 8, 910 req/s)')
"""
from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field

from hkgpu_tune.core.errors import ApplyError, HkError
from hkgpu_tune.serve import client


class GateFailed(ApplyError):
    """The service is up but misses its latency SLO (or fails requests): the deployment fails."""


@dataclass
class LoadResult:
    model: str
    requests: int
    concurrency: int
    errors: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    throughput: float           # requests per second
    first_error: str = ""

    def line(self) -> str:
        err = f", {self.errors} failed ({self.first_error})" if self.errors else ""
        return (f"p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms, max {self.max_ms:.2f} ms, "
                f"{self.requests} requests at concurrency {self.concurrency}, {self.throughput:.0f} req/s{err}")


@dataclass
class GateReport:
    passed: bool
    message: str
    warmup_s: float = 0.0
    loads: list[LoadResult] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "message": self.message, "warmup_s": round(self.warmup_s, 3),
                "loads": [asdict(x) for x in self.loads]}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): the value at least q% of samples do not exceed."""
    if not values:
        return 0.0
    s = sorted(values)
    k = max(1, -(-len(s) * q // 100))  # ceil(n*q/100)
    return s[int(k) - 1]


def warm_up(t, model, n: int) -> float:
    """n sequential requests (after the server's own model_warmup); returns the seconds taken."""
    c = client.Client(t.http.host, t.http.port, timeout=t.gate.ready_timeout_s)
    req = client.request_for(model)
    t0 = time.monotonic()
    try:
        for _ in range(n):
            c.infer(model.name, req)
    finally:
        c.close()
    return time.monotonic() - t0


def load(t, model, requests: int, concurrency: int, timeout: float = 60.0) -> LoadResult:
    """`requests` inference requests from `concurrency` threads (one keep-alive connection each)."""
    req = client.request_for(model)
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    left = [requests]

    def worker():
        c = client.Client(t.http.host, t.http.port, timeout=timeout)
        try:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                t0 = time.perf_counter()
                try:
                    c.infer(model.name, req)
                except HkError as e:
                    with lock:
                        errors.append(str(e))
                    continue
                dt = (time.perf_counter() - t0) * 1000
                with lock:
                    lat.append(dt)
        finally:
            c.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, requests))]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    secs = time.perf_counter() - t0
    return LoadResult(model.name, requests, concurrency, len(errors), round(secs, 3),
                      round(percentile(lat, 50), 3), round(percentile(lat, 90), 3), round(percentile(lat, 99), 3),
                      round(max(lat) if lat else 0.0, 3), round(len(lat) / secs if secs else 0.0, 1),
                      errors[0] if errors else "")


def run_gate(t, p99_ms: float | None = None, requests: int | None = None,
             concurrency: int | None = None) -> GateReport:
    """Warm up every model, then load each one; fails when any p99 exceeds the SLO or a request fails."""
    g = t.gate
    slo = g.p99_ms if p99_ms is None else p99_ms
    n = g.requests if requests is None else requests
    conc = g.concurrency if concurrency is None else concurrency
    rep = GateReport(True, "")
    msgs = []
    for m in t.models:
        try:
            rep.warmup_s += warm_up(t, m, g.warmup_requests)
        except HkError as e:
            rep.passed = False
            msgs.append(f"{m.name}: warm-up failed: {e}")
            continue
        r = load(t, m, n, conc)
        rep.loads.append(r)
        if r.errors:
            rep.passed = False
            msgs.append(f"{m.name}: {r.errors} of {r.requests} requests failed: {r.line()}")
        elif slo is not None and r.p99_ms > slo:
            rep.passed = False
            msgs.append(f"{m.name}: p99 latency {r.p99_ms:.2f} ms is over the SLO of {slo:g} ms ({r.line()})")
        else:
            within = f"p99 {r.p99_ms:.2f} ms <= SLO {slo:g} ms" if slo is not None else "no SLO set"
            msgs.append(f"{m.name}: {within} ({r.line()})")
    rep.message = "; ".join(msgs)
    return rep


def require(t, **kw) -> GateReport:
    """run_gate, raising GateFailed with the measured figures when it does not pass."""
    rep = run_gate(t, **kw)
    if not rep.passed:
        raise GateFailed(f"triton gate failed: {rep.message}")
    return rep
