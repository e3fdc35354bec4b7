"""The last gate of a deployment: warm-up requests, then a short load whose p99 must stay under the SLO.

Every output is asked for in binary (Triton refuses FP16 and BF16 outputs in JSON). The load comes
from the multi-process load generator (loadgen), sized to the profile's load; when the client, not
the server, set the figures (a worker process on a full core, its event loops late), the verdict is
"client-bound": the measurement says nothing about the server, so the deployment is not failed.

On a busy node (Triton's count of the model's requests rising by gate.live.min_req_s or more while
the gate sends nothing) the gate does not add its full load on top of the live one: that load alone
could push the node over the SLO and fail a good reload (on an H100 under 96 live in flight, the
gate's 64 more gave p99 18.6 ms). It judges the new config by what the traffic gets: a canary of
gate.live.canary requests in flight whose p99 must stay under the SLO, and Triton's own per-model
figures over the same window (requests, failures, time per request and in the queue, and its own
p99 from the request summary). Where the canary is over the SLO while Triton's own p99 and time per
request are within it, the time is spent outside Triton (its front end, clients on the same host:
an H100 node whose live traffic alone had p99 31.7 ms measured the canary at 18-20 ms and Triton at
8.1-8.5 ms per request), which the live traffic already had before the reload: the config passes,
judged by Triton's figures. A node whose live traffic is over the SLO before the reload too (the
load itself is past what the node serves within it) would fail every reload, good ones included:
apply measures the same canary and Triton figures just before a hot reload, and a new config over
the SLO passes when the old one was over it too and the new one is no worse (the canary's p99 and
Triton's own time per request within gate.live.no_worse, 1.2x, of before's), saying the node is
over its SLO. The verdict says which it used (mode "load" or "live"; judged_by "canary", "triton"
or "before").

>>> rep = run_gate(t)          # doctest: +SKIP
>>> rep.verdict, rep.message   # doctest: +SKIP
('passed', 'doubler: p99 3.1 ms <= SLO 50 ms (p50 1.2 ms, ... 200 requests at concurrency 8, 910 req/s, ...)')
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from hkgpu_tune.core.errors import ApplyError, HkError
from hkgpu_tune.serve.running import client
from hkgpu_tune.serve.measuring import loadgen

# the load runs this long at its in-flight count before its requests count: on the H200 a gate of
# 2000 requests (a quarter of a second) that counted its first ones measured p99 30 ms where the
# same server held 10 to 14 ms once its connections and batches had settled (docs/perf, 2026-12-04)
LOAD_WARMUP_S = 1.0
# a node over its SLO before the reload: the new config may be this much slower than the old one and
# still pass (gate.live.no_worse; the canary's p99 over 5 s moved 13.1-15.4 ms between good reloads on an H100)
NO_WORSE = 1.2


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
    processes: int = 1
    client_cpu_cores: float = 0.0      # the load generator's own CPU use
    client_busiest_process: float = 0.0
    client_loop_lag_ms: float = 0.0
    client_bound: str = ""             # why the client, not the server, set the figures
    server_request_ms: float | None = None   # Triton's own time per request (queue + compute), /metrics
    mode: str = "load"                 # load: the gate's own load; live: a canary beside live traffic
    protocol: str = "http"
    live_req_s: float | None = None    # live: requests/s the gate did not send, before its canary
    server_req_s: float | None = None  # live: every request Triton served over the window, per second
    server_queue_ms: float | None = None
    server_failures: int | None = None
    server_p99_ms: float | None = None # live: Triton's own p99 per request (its summary, about the last minute)
    judged_by: str = ""                # live: which latency decided: "canary", "triton" (Triton's own p99/mean)
                                       # or "before" (over the SLO as the old config was, and no worse)

    def line(self) -> str:
        err = f", {self.errors} failed ({self.first_error})" if self.errors else ""
        if self.mode == "live":
            return (f"judged by live traffic: {self.live_req_s:.0f} req/s before the gate; over {self.seconds:.1f} s "
                    f"a canary of {self.concurrency} in flight ({self.protocol}): p50 {self.p50_ms:.2f} ms, "
                    f"p99 {self.p99_ms:.2f} ms, max {self.max_ms:.2f} ms, {self.requests} requests{err}; "
                    f"Triton: {self.server_req_s or 0:.0f} req/s, {self.server_failures or 0} failed, "
                    f"{self.server_request_ms if self.server_request_ms is not None else float('nan'):.2f} ms per "
                    f"request ({self.server_queue_ms if self.server_queue_ms is not None else float('nan'):.2f} ms "
                    f"queued), p99 "
                    + (f"{self.server_p99_ms:.2f} ms" if self.server_p99_ms is not None else "not exported"))
        return (f"judged by the gate's own load: " + f"p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms, max {self.max_ms:.2f} ms, "
                f"{self.requests} requests at concurrency {self.concurrency} ({self.protocol}), "
                f"{self.throughput:.0f} req/s{err}; "
                f"client {self.processes} processes, CPU {self.client_cpu_cores:.2f} cores, "
                f"loop lag {self.client_loop_lag_ms:.2f} ms"
                + (f"; Triton {self.server_request_ms:.2f} ms per request" if self.server_request_ms is not None else "")
                + (f"; client-bound: {self.client_bound}" if self.client_bound else ""))


@dataclass
class GateReport:
    passed: bool
    message: str
    warmup_s: float = 0.0
    loads: list[LoadResult] = field(default_factory=list)
    client_bound: bool = False      # the client could not offer the load: neither passed nor failed
    before: list[LoadResult] = field(default_factory=list)   # live figures just before a hot reload

    @property
    def verdict(self) -> str:
        return "passed" if self.passed else "client-bound" if self.client_bound else "failed"

    @property
    def mode(self) -> str:
        """How the gate judged: load (its own load), live (the node's traffic and a canary), or both."""
        modes = sorted({x.mode for x in self.loads})
        return "+".join(modes) if modes else "none"

    def to_dict(self) -> dict:
        return {"passed": self.passed, "verdict": self.verdict, "mode": self.mode, "message": self.message,
                "warmup_s": round(self.warmup_s, 3), "loads": [asdict(x) for x in self.loads],
                "before": [asdict(x) for x in self.before]}


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


def _spec(t, model, concurrency: int, processes: int | None, protocol: str, timeout: float, **kw):
    req = client.request_for(model)
    name, dt, shape, _ = req[0]
    return loadgen.LoadSpec(t.http.host, t.http.port, model.name, name, dt, shape, concurrency=concurrency,
                            processes=loadgen.processes_for(concurrency, processes), timeout_s=timeout,
                            request=req, metrics_port=t.metrics.port if t.metrics.port else None,
                            protocol=protocol, grpc_port=t.grpc.port, **kw)


def _result(model, r: dict, requests: int, concurrency: int, protocol: str, **kw) -> LoadResult:
    sv = r.get("server")
    return LoadResult(model.name, requests, concurrency, r["errors"], r["seconds"], r["p50_ms"],
                      r["p90_ms"], r["p99_ms"], r["max_ms"], r["req_s"], r["first_error"],
                      r["processes"], r["client_cpu_cores"], r["client_busiest_process"], r["client_loop_lag_ms"],
                      r["client_bound"], round(sv["request_us"] / 1000, 3) if sv else None, protocol=protocol,
                      server_req_s=sv["req_s"] if sv else None,
                      server_queue_ms=round(sv["queue_us"] / 1000, 3) if sv else None,
                      server_failures=int(sv["failures"]) if sv else None, **kw)


def load(t, model, requests: int, concurrency: int, timeout: float = 60.0, processes: int | None = None,
         protocol: str = "http") -> LoadResult:
    """`requests` inference requests, `concurrency` in flight, from the load generator's processes,
    after LOAD_WARMUP_S of the same load (not counted)."""
    spec = _spec(t, model, concurrency, processes, protocol, timeout, requests=requests, warmup_s=LOAD_WARMUP_S,
                 duration_s=0.0)
    return _result(model, loadgen.run(spec), requests, concurrency, protocol)


def live_rate(t, model, seconds: float) -> float | None:
    """Requests per second Triton served for the model while the gate sent nothing (None: no metrics)."""
    if not t.metrics.port:
        return None
    host = t.metrics.host
    try:
        a = client.model_counts(host, t.metrics.port, model.name)["nv_inference_request_success"]
        time.sleep(seconds)
        b = client.model_counts(host, t.metrics.port, model.name)["nv_inference_request_success"]
    except HkError:
        return None
    return max(0.0, b - a) / seconds   # a reload resets a version's counters: never negative


def canary(t, model, live_req_s: float, protocol: str = "http", timeout: float = 60.0) -> LoadResult:
    """A few requests in flight beside the live traffic for gate.live_window_s; Triton's figures over
    the same window cover every request of the model, the live ones too."""
    g = t.gate
    spec = _spec(t, model, g.canary, min(g.canary, 2), protocol, timeout, duration_s=g.live_window_s,
                 warmup_s=LOAD_WARMUP_S / 2)
    r = loadgen.run(spec)
    try:
        p99 = client.model_p99_ms(t.metrics.host, t.metrics.port, model.name)
    except HkError:
        p99 = None
    return _result(model, r, r["requests"], g.canary, protocol, mode="live", live_req_s=round(live_req_s, 1),
                   server_p99_ms=None if p99 is None else round(p99, 3))


LIVE_PROBE_S = 1.0   # how long the gate watches the model's request count before choosing its mode


def before_reload(t, names) -> dict[str, LoadResult]:
    """The live figures (canary and Triton's, as the gate takes them) of the models about to be
    reloaded, while the old config serves; only models with live traffic, and none it cannot read.
    A client-bound canary is kept only with Triton's own time per request, which no_worse then
    compares alone (a late client's p99 would excuse a worse config)."""
    out = {}
    proto = getattr(t.gate, "protocol", "http")
    for m in t.models:
        if m.name not in names:
            continue
        try:
            rate = live_rate(t, m, LIVE_PROBE_S)
            if rate is not None and rate >= t.gate.live_min_req_s:
                r = canary(t, m, rate, proto)
                if (r.requests and not r.client_bound) or r.server_request_ms is not None:
                    out[m.name] = r
        except HkError:
            continue
    return out


def live_excess(r: LoadResult, slo: float | None) -> str:
    """What puts a live result over the SLO: Triton's own mean or p99, or the canary's p99 where
    Triton's figures do not clear it; "" when nothing does."""
    if slo is None:
        return ""
    if r.server_request_ms is not None and r.server_request_ms > slo:
        return f"Triton's own time per request {r.server_request_ms:.2f} ms"
    if r.server_p99_ms is not None and r.server_p99_ms > slo:
        return f"Triton's own p99 per request {r.server_p99_ms:.2f} ms"
    if r.p99_ms > slo and (r.server_p99_ms is None or r.server_request_ms is None):
        return f"the canary's p99 {r.p99_ms:.2f} ms"
    return ""


def no_worse(before: LoadResult, after: LoadResult, ratio: float = NO_WORSE) -> bool:
    """The canary's p99 and Triton's own time per request (where read), each over its window, within ratio
    of before's. Both: a config that makes a few requests wait (a long queue delay under light load)
    moves the p99 and hardly the mean; a slower model moves the mean. The canary's p99 only where neither
    canary was client-bound (a late client's p99 is its own); nothing comparable is not "no worse"."""
    pairs = [(before.server_request_ms, after.server_request_ms)]
    if _canaries_comparable(before, after):
        pairs.append((before.p99_ms, after.p99_ms))
    pairs = [(b, a) for b, a in pairs if b is not None and a is not None]
    return bool(pairs) and all(a <= b * ratio for b, a in pairs)


def run_gate(t, p99_ms: float | None = None, requests: int | None = None,
             concurrency: int | None = None, processes: int | None = None, protocol: str | None = None,
             live: bool = True, before: dict[str, LoadResult] | None = None) -> GateReport:
    """Warm up every model, then load each one, or on a busy node (live traffic seen, `live`) judge it by
    a canary and Triton's figures; fails when any p99 exceeds the SLO or a request fails, unless the
    client set the figures (client-bound: neither passed nor failed). before: before_reload's figures;
    a live result over the SLO passes when the old config's were over it too and it is no worse."""
    g = t.gate
    slo = g.p99_ms if p99_ms is None else p99_ms
    n = g.requests if requests is None else requests
    conc = g.concurrency if concurrency is None else concurrency
    procs = getattr(g, "processes", None) if processes is None else processes
    proto = protocol or getattr(g, "protocol", "http")
    rep = GateReport(True, "", before=list((before or {}).values()))
    ratio = getattr(g, "live_no_worse", NO_WORSE)
    msgs, bound = [], []
    for m in t.models:
        try:
            rep.warmup_s += warm_up(t, m, g.warmup_requests)
        except HkError as e:
            rep.passed = False
            msgs.append(f"{m.name}: warm-up failed: {e}")
            continue
        rate = live_rate(t, m, LIVE_PROBE_S) if live else None
        if rate is not None and rate >= g.live_min_req_s:
            r = canary(t, m, rate, proto)
        else:
            r = load(t, m, n, conc, processes=procs, protocol=proto)
        rep.loads.append(r)
        if r.mode == "live" and not r.requests and r.client_bound and not r.errors and not r.server_failures:
            # the canary sent nothing (a starved client): nothing was measured, neither pass nor fail
            bound.append(m.name)
            msgs.append(f"{m.name}: client-bound, the canary measured nothing: {r.client_bound} ({r.line()})")
        elif r.mode == "live" and (r.errors or r.server_failures or not r.requests):
            rep.passed = False
            msgs.append(f"{m.name}: requests failed or none answered beside live traffic: {r.line()}")
        elif (r.mode == "live" and (b := (before or {}).get(m.name)) is not None and live_excess(r, slo)
              and live_excess(b, slo) and no_worse(b, r, ratio)):
            # the live traffic was over the SLO with the old config too: failing would put back a config
            # no better; the node is over its SLO under this traffic, and the verdict says so
            r.judged_by = "before"
            msgs.append(f"{m.name}: {live_excess(r, slo)} is over the SLO of {slo:g} ms, as before the reload "
                        f"({live_excess(b, slo)}): the node is over its SLO under this traffic; the new config "
                        f"is no worse ({_compared(b, r)}, within {ratio:g}x) ({r.line()})")
        elif r.mode == "live" and slo is not None and r.server_request_ms is not None and r.server_request_ms > slo:
            rep.passed, r.judged_by = False, "triton"
            msgs.append(f"{m.name}: Triton's own time per request {r.server_request_ms:.2f} ms is over the SLO of "
                        f"{slo:g} ms ({r.line()})")
        elif r.mode == "live" and slo is not None and r.server_p99_ms is not None and r.server_p99_ms > slo:
            rep.passed, r.judged_by = False, "triton"
            msgs.append(f"{m.name}: Triton's own p99 per request {r.server_p99_ms:.2f} ms is over the SLO of "
                        f"{slo:g} ms ({r.line()})")
        elif (r.mode == "live" and slo is not None and r.p99_ms > slo and r.server_p99_ms is not None
              and r.server_request_ms is not None):
            # a node already over its SLO outside Triton (its front end, clients on the same host): the
            # canary measures that, not the new config; Triton's own p99 and mean are within the SLO
            r.judged_by = "triton"
            msgs.append(f"{m.name}: judged by Triton's own figures: p99 {r.server_p99_ms:.2f} ms and "
                        f"{r.server_request_ms:.2f} ms per request <= SLO {slo:g} ms; the canary's p99 "
                        f"{r.p99_ms:.2f} ms is over it, time spent outside Triton (its front end and the "
                        f"clients), which the live traffic already had ({r.line()})")
        elif r.errors:
            rep.passed = False
            msgs.append(f"{m.name}: {r.errors} of {r.requests} requests failed: {r.line()}")
        elif slo is not None and r.p99_ms > slo and r.client_bound and r.server_request_ms is None:
            # a late client, and nothing read from the server clears it: failed, never kept unseen
            rep.passed = False
            msgs.append(f"{m.name}: p99 latency {r.p99_ms:.2f} ms is over the SLO of {slo:g} ms and the client was "
                        f"late ({r.client_bound}), but Triton's own time per request could not be read from its "
                        f"metrics (triton.metrics.port): the server is not cleared ({r.line()})")
        elif slo is not None and r.p99_ms > slo and r.client_bound and r.server_request_ms <= slo:
            # the client was late and Triton's own time per request is within the SLO
            bound.append(m.name)
            msgs.append(f"{m.name}: client-bound, p99 {r.p99_ms:.2f} ms over the SLO of {slo:g} ms says nothing "
                        f"about the server (Triton's own {r.server_request_ms:.2f} ms per request): "
                        f"{r.client_bound} (give the gate more processes: gate.load.processes, or fewer in "
                        f"flight) ({r.line()})")
        elif slo is not None and r.p99_ms > slo:
            rep.passed = False
            if r.mode == "live":
                r.judged_by = "canary"
            own = f", Triton's own {r.server_request_ms:.2f} ms per request" if r.server_request_ms is not None else ""
            msgs.append(f"{m.name}: p99 latency {r.p99_ms:.2f} ms is over the SLO of {slo:g} ms{own} ({r.line()})")
        else:
            if r.mode == "live":
                r.judged_by = "canary"
            within = f"p99 {r.p99_ms:.2f} ms <= SLO {slo:g} ms" if slo is not None else "no SLO set"
            msgs.append(f"{m.name}: {within} ({r.line()})")
    if bound and rep.passed:
        rep.passed, rep.client_bound = False, True
    rep.message = "; ".join(msgs)
    return rep


def _canaries_comparable(b: LoadResult, r: LoadResult) -> bool:
    """Both canaries measured and neither was client-bound."""
    return bool(b.requests and r.requests) and not (b.client_bound or r.client_bound)


def _compared(b: LoadResult, r: LoadResult) -> str:
    """What no_worse compared, for the verdict."""
    canary = (f"canary p99 {b.p99_ms:.2f} -> {r.p99_ms:.2f} ms" if _canaries_comparable(b, r)
              else "the canary's p99 not compared: a canary was client-bound")
    return f"{canary}, Triton's own {_ms(b.server_request_ms)} -> {_ms(r.server_request_ms)} per request"


def _ms(v: float | None) -> str:
    return "not exported" if v is None else f"{v:.2f} ms"


def require(t, **kw) -> GateReport:
    """run_gate, raising GateFailed with the measured figures when it fails (a client-bound gate does not)."""
    rep = run_gate(t, **kw)
    if not rep.passed and not rep.client_bound:
        raise GateFailed(f"triton gate failed: {rep.message}")
    return rep
