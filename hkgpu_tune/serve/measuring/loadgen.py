"""A load generator that is not the bottleneck: requests of one image each, as an inference front
end sends them, from several processes with many requests in flight, binary tensors over HTTP
(KServe v2 binary extension), with the input in system shared memory, or over gRPC (protocol
"grpc": one channel per thread, a ModelInferRequest built once with raw input contents). The closed loop runs one
thread per request in flight, each with its own keep-alive connection (http.client): the scheduler
gives CPU by thread, and on a host whose cores the server's threads share, a process of threads
was measured to get its requests out where one asyncio loop per process fell behind (on the H200,
8 aiohttp processes: 8.4k img/s against 12.1k for threads at the same load). The open loop is
asyncio + aiohttp (a request per scheduled time, however many are outstanding).

Closed loop (`concurrency` requests always in flight) or open loop (`rate` requests per second,
latency counted from the scheduled send time, so a server that falls behind shows it).
Reports client-side p50/p95/p99, the client's own CPU use and event-loop lag (from which
`client_bound` says whether the client, not the server, set the figures), and Triton's queue and
compute time per request from /metrics over the same window. Every output is asked for in binary.

>>> r = run(LoadSpec("127.0.0.1", 8000, "resnet50", "INPUT", "FP16", [1, 3, 224, 224],
...                  concurrency=64, processes=4, duration_s=10))          # doctest: +SKIP
>>> r["img_s"], r["p99_ms"]                                                  # doctest: +SKIP
"""
from __future__ import annotations

import array
import asyncio
import json
import math
import multiprocessing
import os
import time
import uuid
from dataclasses import asdict, dataclass, field

from hkgpu_tune.core.errors import HkError

LAG_TICK_S = 0.005        # the event-loop lag probe's sleep
# the client, not the server, set the figures when one of its processes was this busy ...
BUSY_PROCESS = 0.9
# ... or it got the CPU this late on average (ms) while its mean latency was 1.5 x Triton's own
# mean time per request or more (without Triton's figures: the lag a quarter of the p50 or more)
LATE_LOOP_MS = 2.0
# a backend reports a request to Triton's statistics after sending its answer: the client may see the
# last answers before Triton counts them. The figures are read once Triton's count covers every request
# the client counted, waiting at most this long (then read as they are, marked not settled)
SETTLE_S = 5.0
SIZES = {"FP16": 2, "FP32": 4, "FP64": 8, "INT8": 1, "UINT8": 1, "INT16": 2, "INT32": 4, "INT64": 8,
         "BF16": 2, "BOOL": 1}


@dataclass
class LoadSpec:
    host: str
    port: int
    model: str
    input_name: str
    datatype: str
    shape: list[int]                  # one request's shape, batch dim included (1, ...)
    output_name: str | None = None
    concurrency: int = 16             # closed loop: requests in flight, over all processes
    processes: int = 2
    duration_s: float = 10.0          # the measured window
    warmup_s: float = 1.0             # load before the window, not counted
    rate: float | None = None         # open loop: requests per second over all processes
    shm: bool = False                 # the input in a system shared-memory region (Triton only)
    raw_path: str | None = None       # a plain HTTP server: POST the raw tensor bytes to this path
    timeout_s: float = 30.0
    metrics_port: int | None = None   # Triton's /metrics, for queue and compute times
    labels: dict = field(default_factory=dict)
    requests: int | None = None       # closed loop: this many requests counted, after warmup_s of the same load
    request: list | None = None       # the inputs as client.request_for gives them (instead of the one input)
    protocol: str = "http"            # http (binary tensors) | grpc (tritonclient's protobufs, raw contents)
    grpc_port: int | None = None      # Triton's gRPC port (protocol grpc)

    @property
    def nbytes(self) -> int:
        if self.request:
            return sum(len(raw) for *_, raw in self.request)
        return math.prod(self.shape) * SIZES[self.datatype]


def percentile(values, q: float) -> float:
    """Nearest-rank percentile (q in 0..100): the value at least q% of samples do not exceed."""
    if not values:
        return 0.0
    s = sorted(values)
    k = max(1, -(-len(s) * q // 100))  # ceil(n*q/100)
    return s[int(k) - 1]


def _infer_header(spec: LoadSpec, region: str | None) -> bytes:
    if spec.request:
        from hkgpu_tune.serve.running import client
        return client.infer_header(spec.request, [spec.output_name] if spec.output_name else ())
    params = ({"shared_memory_region": region, "shared_memory_byte_size": spec.nbytes} if region
              else {"binary_data_size": spec.nbytes})
    doc = {"inputs": [{"name": spec.input_name, "shape": spec.shape, "datatype": spec.datatype,
                       "parameters": params}]}
    if spec.output_name:
        doc["outputs"] = [{"name": spec.output_name, "parameters": {"binary_data": True}}]
    else:   # every output in binary: Triton refuses FP16 and BF16 outputs in JSON
        doc["parameters"] = {"binary_data_output": True}
    return json.dumps(doc, separators=(",", ":")).encode()


async def _session(spec: LoadSpec, idx: int, start_at: float, region: str | None) -> dict:
    """The open loop in one process: a request at each scheduled time, however many are outstanding."""
    import aiohttp
    path, body, headers = _request(spec, region)
    url = f"http://{spec.host}:{spec.port}{path}"
    conc = max(1, spec.concurrency)
    win0 = start_at + spec.warmup_s
    win1 = win0 + spec.duration_s
    lags = array.array("d")
    span = [math.inf, 0.0]
    lat = array.array("d")
    errors = [0]
    first_error = [""]
    sent = [0]
    conn = aiohttp.TCPConnector(limit=conc, force_close=False)
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
    loop = asyncio.get_running_loop()
    clock = time.time   # the processes share one start time: wall clock, not monotonic

    async def one(session, t_sched: float):
        if win0 <= clock() <= win1:
            sent[0] += 1   # sent inside the window: the rate offered
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                ok = resp.status == 200
                if not ok and not first_error[0]:
                    first_error[0] = f"HTTP {resp.status}: {(await resp.text())[:200]}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            ok = False
            if not first_error[0]:
                first_error[0] = f"{type(e).__name__}: {e}"[:200]
        done = clock()
        span[0], span[1] = min(span[0], t_sched), max(span[1], done)
        if win0 <= done <= win1:
            if ok:
                lat.append((done - t_sched) * 1000)
            else:
                errors[0] += 1

    async def ticker():
        """How late this process's event loop wakes up: a client that cannot keep up shows it here."""
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(LAG_TICK_S)
            if win0 <= clock() <= win1:
                lags.append(max(0.0, time.perf_counter() - t0 - LAG_TICK_S) * 1000)

    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        await asyncio.sleep(max(0.0, start_at - clock()))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        tick = loop.create_task(ticker())
        interval = spec.processes / spec.rate
        t_next = start_at + idx * interval / spec.processes
        pending = set()
        sem = asyncio.Semaphore(conc)

        async def bounded(t_s):
            async with sem:
                await one(session, t_s)
        while t_next < win1:
            delay = t_next - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            task = loop.create_task(bounded(t_next))
            pending.add(task)
            task.add_done_callback(pending.discard)
            t_next += interval
        if pending:
            await asyncio.wait(pending, timeout=spec.timeout_s)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        tick.cancel()
    return {"lat": lat.tobytes(), "errors": errors[0], "first_error": first_error[0], "sent": sent[0],
            "cpu_s": cpu, "wall_s": wall, "lag": lags.tobytes(), "span": span}


def _request(spec: LoadSpec, region: str | None) -> tuple[str, bytes, dict]:
    """The path, body and headers of every request of this load."""
    if spec.raw_path:
        return spec.raw_path, bytes(spec.nbytes), {"Content-Type": "application/octet-stream"}
    head = _infer_header(spec, region)
    raw = b"".join(r for *_, r in spec.request) if spec.request else bytes(spec.nbytes)
    return (f"/v2/models/{spec.model}/infer", head + (b"" if region else raw),
            {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))})


PROTOCOLS = ("http", "grpc")


def _grpc_caller(spec: LoadSpec):
    """A function that opens one gRPC channel and returns (call, close): call() sends the model's
    prebuilt ModelInferRequest (inputs as raw contents, every output returned raw) and returns
    (ok, error text). Needs tritonclient[grpc] (its service protobufs) and grpcio."""
    try:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc
    except (ImportError, RuntimeError):
        raise HkError("loadgen: gRPC needs tritonclient[grpc] (pip install 'hkgpu-tune[triton]')") from None
    req = service_pb2.ModelInferRequest(model_name=spec.model)
    for name, dt, shape, raw in spec.request or [(spec.input_name, spec.datatype, spec.shape, bytes(spec.nbytes))]:
        t = req.inputs.add()
        t.name, t.datatype = name, dt
        t.shape.extend(shape)
        req.raw_input_contents.append(raw)
    if spec.output_name:
        req.outputs.add().name = spec.output_name
    target = f"[{spec.host}]:{spec.grpc_port}" if ":" in spec.host else f"{spec.host}:{spec.grpc_port}"
    opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
            ("grpc.use_local_subchannel_pool", 1)]   # a connection per thread, as the HTTP loop has

    def connect():
        ch = grpc.insecure_channel(target, options=opts)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer

        def call():
            try:
                stub(req, timeout=spec.timeout_s)
                return True, ""
            except grpc.RpcError as e:
                return False, f"gRPC {e.code().name}: {(e.details() or '')[:180]}"
        return call, ch.close
    return connect


def _threads(spec: LoadSpec, idx: int, start_at: float, region: str | None, counting=None) -> dict:
    """The closed loop in one process: a thread per request in flight, each with a keep-alive
    connection; a ticker thread measures how late this process gets the CPU (its lag). With
    spec.requests, the counted requests start once `counting` (an Event) is set: the caller has read
    Triton's figures before any of them; until then the warm-up's load goes on."""
    import http.client
    import threading
    path, body, headers = _request(spec, region)
    grpc_connect = _grpc_caller(spec) if spec.protocol == "grpc" else None
    conc = max(1, round(spec.concurrency / spec.processes))
    win0, win1 = start_at + spec.warmup_s, start_at + spec.warmup_s + spec.duration_s
    left = [0]
    if spec.requests:   # this process's share of the requests, each one sent after the warm-up counted
        left[0] = spec.requests // spec.processes + (idx < spec.requests % spec.processes)
        conc = max(1, min(conc, left[0]))
        win1 = math.inf
    lock = threading.Lock()
    lat, lags = array.array("d"), array.array("d")
    errors, first_error, sent, span = [0], [""], [0], [math.inf, 0.0]
    done_all = threading.Event()
    clock = time.time   # the processes share one start time: wall clock, not monotonic
    started = [counting is None]

    def take() -> tuple[bool, bool]:
        """(send one more, count it): the warm-up's requests at the same load are not counted."""
        with lock:
            if spec.requests:
                if clock() < win0:
                    return True, False
                if not started[0]:
                    started[0] = counting.is_set()
                    if not started[0]:
                        return True, False
                if left[0] <= 0:
                    return False, False
                left[0] -= 1
                return True, True
            return clock() < win1, True

    def worker():
        if grpc_connect:
            call, close = grpc_connect()
        else:
            conn = http.client.HTTPConnection(spec.host, spec.port, timeout=spec.timeout_s)
        mine, errs, first, n_sent, lo, hi = [], 0, "", 0, math.inf, 0.0
        while True:
            go, counted = take()
            if not go:
                break
            t0 = clock()
            n_sent += win0 <= t0 <= win1
            if grpc_connect:
                ok, why = call()
                first = first or why
            else:
                try:
                    conn.request("POST", path, body, headers)
                    r = conn.getresponse()
                    data = r.read()
                    ok = r.status == 200
                    if not ok and not first:
                        first = f"HTTP {r.status}: {data[:200].decode(errors='replace')}"
                except (OSError, http.client.HTTPException) as e:
                    ok = False
                    first = first or f"{type(e).__name__}: {e}"[:200]
                    conn.close()
                    conn = http.client.HTTPConnection(spec.host, spec.port, timeout=spec.timeout_s)
            t1 = clock()
            if counted and spec.requests:
                lo, hi = min(lo, t0), max(hi, t1)
            if counted and (spec.requests or win0 <= t1 <= win1):
                if ok:
                    mine.append((t1 - t0) * 1000)
                else:
                    errs += 1
        close() if grpc_connect else conn.close()
        with lock:
            lat.extend(mine)
            errors[0] += errs
            sent[0] += n_sent
            first_error[0] = first_error[0] or first
            span[0], span[1] = min(span[0], lo), max(span[1], hi)

    def ticker():
        while not done_all.wait(LAG_TICK_S):
            t0 = time.perf_counter()
            time.sleep(LAG_TICK_S)
            if win0 <= clock() <= win1:
                lags.append(max(0.0, time.perf_counter() - t0 - LAG_TICK_S) * 1000)

    time.sleep(max(0.0, start_at - clock()))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    tick = threading.Thread(target=ticker, daemon=True)
    tick.start()
    ths = [threading.Thread(target=worker, daemon=True) for _ in range(conc)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    done_all.set()
    return {"lat": lat.tobytes(), "errors": errors[0], "first_error": first_error[0], "sent": sent[0],
            "cpu_s": cpu, "wall_s": wall, "lag": lags.tobytes(), "span": span}


def _worker(spec_d: dict, idx: int, start_at: float, region: str | None, q, counting=None) -> None:
    try:
        spec = LoadSpec(**spec_d)
        if spec.rate is None:
            q.put((idx, _threads(spec, idx, start_at, region, counting)))
            return
        try:
            import uvloop
            uvloop.install()
        except ImportError:
            pass
        q.put((idx, asyncio.run(_session(spec, idx, start_at, region))))
    except BaseException as e:  # reported by the parent as one line
        q.put((idx, {"fatal": f"{type(e).__name__}: {e}"}))


def _triton_stats(spec: LoadSpec) -> dict | None:
    if not spec.metrics_port:
        return None
    from hkgpu_tune.serve.running import client
    want = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count", "nv_inference_exec_count",
            "nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_input_duration_us", "nv_inference_compute_output_duration_us",
            "nv_inference_request_duration_us")
    out = dict.fromkeys(want, 0.0)
    gpu_util = []
    try:
        text = client.metrics_text(spec.host, spec.metrics_port)
        at = time.time()   # the figures are Triton's of a moment before: not after the answer came
        for (name, labels), v in client.parse_metrics(text).items():
            lab = dict(labels)
            if name in out and lab.get("model") == spec.model:
                out[name] += v
            elif name == "nv_gpu_utilization":
                gpu_util.append(v)
    except HkError:
        return None
    out["gpu_util"] = gpu_util
    out["at"] = at
    return out


def _settled(spec: LoadSpec, before: dict, answered: int) -> tuple[dict | None, bool]:
    """Triton's figures once its success count since `before` covers the `answered` requests the
    client saw succeed (at most SETTLE_S later); (figures, whether they cover them)."""
    t_end = time.monotonic() + SETTLE_S
    while True:
        after = _triton_stats(spec)
        ok = after is not None and after["nv_inference_request_success"] - before["nv_inference_request_success"] >= answered
        if ok or after is None or time.monotonic() >= t_end:
            return after, ok
        time.sleep(0.05)


class SharedInput:
    """One read-only POSIX shared-memory region holding the request's tensor, registered with
    Triton (system shared memory); unregistered and unlinked on close."""

    def __init__(self, spec: LoadSpec):
        from multiprocessing import shared_memory
        from hkgpu_tune.serve.running import client
        self.name = f"hkgpu-{uuid.uuid4().hex[:12]}"
        self.shm = shared_memory.SharedMemory(name=self.name, create=True, size=spec.nbytes)
        self.c = client.Client(spec.host, spec.port, timeout=10)
        body = json.dumps({"key": "/" + self.name, "offset": 0, "byte_size": spec.nbytes}).encode()
        status, _, text = self.c.request("POST", f"/v2/systemsharedmemory/region/{self.name}/register", body,
                                         {"Content-Type": "application/json"})
        if status != 200:
            self.close(unregister=False)
            raise HkError(f"loadgen: Triton refused the shared-memory region: {status} {text[:200]!r}")

    def close(self, unregister: bool = True) -> None:
        if unregister:
            try:
                self.c.request("POST", f"/v2/systemsharedmemory/region/{self.name}/unregister")
            except HkError:
                pass
        self.c.close()
        self.shm.close()
        try:
            self.shm.unlink()
        except FileNotFoundError:
            pass


def run(spec: LoadSpec) -> dict:
    """Run the load; returns one dict of figures (see module doc)."""
    try:
        import aiohttp  # noqa: F401  (checked here: the workers would fail one by one)
    except ImportError:
        raise HkError("loadgen: needs aiohttp (pip install 'hkgpu-tune[triton]')") from None
    import psutil
    if spec.protocol not in PROTOCOLS:
        raise HkError(f"loadgen: protocol {spec.protocol!r}: expected one of {', '.join(PROTOCOLS)}")
    if spec.protocol == "grpc":
        if spec.shm or spec.rate or spec.raw_path or not spec.grpc_port:
            raise HkError("loadgen: gRPC runs the closed loop over the socket, with the server's gRPC port "
                          "(no shared memory, open loop or raw path)")
        _grpc_caller(spec)   # tritonclient[grpc] is here: found now, not once per worker
    if spec.datatype not in SIZES:
        raise HkError(f"loadgen: no test data for data type {spec.datatype}")
    region = SharedInput(spec) if spec.shm else None
    ctx = multiprocessing.get_context("fork")   # no re-import of the caller's __main__
    q = ctx.Queue()
    counting = ctx.Event()   # requests mode: set once Triton's figures before the counted requests are read
    # the workers import their modules before the common start time
    start_at = time.time() + 0.5 + 0.05 * spec.processes
    procs = [ctx.Process(target=_worker, args=(asdict(spec), i, start_at, region and region.name, q, counting),
                         daemon=True) for i in range(spec.processes)]
    settled = None
    try:
        for p in procs:
            p.start()
        if spec.requests:   # Triton's figures from the end of the warm-up to the last answer
            time.sleep(max(0.0, start_at + spec.warmup_s - time.time()))
            before = _triton_stats(spec)
            counting.set()   # read before any counted request was sent, however late this process ran
            psutil.cpu_percent(None)
        else:
            time.sleep(max(0.0, start_at + spec.warmup_s - time.time()))
            before = _triton_stats(spec)
            psutil.cpu_percent(None)
            time.sleep(max(0.0, start_at + spec.warmup_s + spec.duration_s - time.time()))
            machine_cpu = psutil.cpu_percent(None)
            after = _triton_stats(spec)
        parts = {}
        deadline = time.time() + spec.timeout_s + 30
        while len(parts) < len(procs):
            left = deadline - time.time()
            if left <= 0:
                raise HkError(f"loadgen: {len(procs) - len(parts)} worker(s) did not finish")
            try:
                idx, res = q.get(timeout=left)
            except Exception:
                raise HkError(f"loadgen: {len(procs) - len(parts)} worker(s) did not finish") from None
            parts[idx] = res
        for p in procs:
            p.join(5)
        if spec.requests:
            machine_cpu = psutil.cpu_percent(None)
            answered = sum(len(r.get("lat", b"")) // 8 for r in parts.values())
            after, settled = _settled(spec, before, answered) if before else (None, None)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        if region:
            region.close()
    fatal = [r["fatal"] for r in parts.values() if "fatal" in r]
    if fatal:
        raise HkError(f"loadgen: a worker failed: {fatal[0]}")
    lat = array.array("d")
    for r in parts.values():
        lat.frombytes(r["lat"])
    vals = sorted(lat)
    errors = sum(r["errors"] for r in parts.values())
    cpu_s = sum(r["cpu_s"] for r in parts.values())
    wall = spec.duration_s + spec.warmup_s
    lags = array.array("d")
    for r in parts.values():
        lags.frombytes(r["lag"])
    duration = spec.duration_s
    if spec.requests:   # the span from the first send to the last answer
        first = min(r["span"][0] for r in parts.values())
        last = max(r["span"][1] for r in parts.values())
        duration = wall = max(1e-6, last - first)
    out = {
        "model": spec.model, "transport": transport(spec),
        "mode": "open" if spec.rate else "closed", "rate": spec.rate, "concurrency": spec.concurrency,
        "processes": spec.processes, "duration_s": spec.duration_s, "requests": len(vals), "errors": errors,
        "first_error": next((r["first_error"] for r in parts.values() if r["first_error"]), ""),
        "img_s": round(len(vals) * (spec.request[0][2][0] if spec.request else spec.shape[0]) / duration, 1),
        "req_s": round(len(vals) / duration, 1), "seconds": round(duration, 3),
        "offered_rate": round(sum(r["sent"] for r in parts.values()) / duration, 1),
        "sent": sum(r["sent"] for r in parts.values()),
        "mean_ms": round(sum(vals) / len(vals), 3) if vals else 0.0,
        "p50_ms": round(percentile(vals, 50), 3), "p90_ms": round(percentile(vals, 90), 3), "p95_ms": round(percentile(vals, 95), 3),
        "p99_ms": round(percentile(vals, 99), 3), "max_ms": round(vals[-1], 3) if vals else 0.0,
        "client_cpu_cores": round(cpu_s / wall, 2), "machine_cpu_pct": machine_cpu,
        # the busiest worker process: the share of one core it used
        "client_busiest_process": round(max(r["cpu_s"] / max(r["wall_s"], 1e-6) for r in parts.values()), 2),
        "client_loop_lag_ms": round(sum(lags) / len(lags), 3) if lags else 0.0,
        "client_loop_lag_p99_ms": round(percentile(sorted(lags), 99), 3),
        "cpus": os.cpu_count(),
        # the measured window (epoch seconds): samples taken alongside (GPU, CPU) are averaged over it
        "window": [round(start_at + spec.warmup_s, 3), round(start_at + spec.warmup_s + spec.duration_s, 3)],
        **spec.labels,
    }
    if before and after:
        d = {k: after[k] - before[k] for k in before if k not in ("gpu_util", "at")}
        n = d["nv_inference_request_success"] or 1
        # a duration load: Triton's rate from its first reading (however late this process took it)
        # to its second or the window's end, whichever came first (no load after it); a requests
        # load's count is that of the counted requests, over their span
        end = start_at + spec.warmup_s + spec.duration_s
        secs = duration if spec.requests else min(after["at"], end) - before["at"]
    if before and after and secs > 0:   # else Triton was first read after the window ended: no figures
        out["server"] = {
            "requests": d["nv_inference_request_success"],
            "failures": d["nv_inference_request_failure"],
            "req_s": round(d["nv_inference_request_success"] / secs, 1),
            "avg_batch": round(d["nv_inference_count"] / d["nv_inference_exec_count"], 2)
            if d["nv_inference_exec_count"] else 0.0,
            "queue_us": round(d["nv_inference_queue_duration_us"] / n, 1),
            "compute_input_us": round(d["nv_inference_compute_input_duration_us"] / n, 1),
            "compute_infer_us": round(d["nv_inference_compute_infer_duration_us"] / n, 1),
            "compute_output_us": round(d["nv_inference_compute_output_duration_us"] / n, 1),
            "request_us": round(d["nv_inference_request_duration_us"] / n, 1),
            "gpu_util_pct": after["gpu_util"],
        }
        if settled is not None:   # requests mode: whether Triton's count covers every request answered
            out["server"]["settled"] = settled
    out["client_bound"] = client_bound(out)
    return out


def transport(spec: LoadSpec) -> str:
    if spec.protocol == "grpc":
        return "grpc"
    return "raw-http" if spec.raw_path else ("http+shm" if spec.shm else "http-binary")


PER_PROCESS = 4   # requests in flight per process, by default


def processes_for(concurrency: int, processes: int | None = None) -> int:
    """The processes for a load: the ones asked for, or one per PER_PROCESS in flight, at most one
    per CPU. Many processes, not one busy one: a process waiting on the server costs nothing, and the
    scheduler shares the CPUs by thread with the server's threads."""
    if processes:
        return max(1, min(processes, concurrency))
    return max(1, min(math.ceil(concurrency / PER_PROCESS), os.cpu_count() or 1))


def client_bound(r: dict) -> str:
    """Why the client, not the server, set these figures ("" when it did not): a worker process
    near a full core, event loops waking late while most of the latency was spent outside Triton,
    or (open loop) fewer requests sent than the rate asked for."""
    why = []
    if r["client_busiest_process"] >= BUSY_PROCESS:
        why.append(f"a client process used {r['client_busiest_process']:.0%} of a core")
    lag, p50, mean = r["client_loop_lag_ms"], r["p50_ms"], r["mean_ms"]
    server_ms = r["server"]["request_us"] / 1000 if r.get("server") else None
    if lag >= LATE_LOOP_MS and (mean >= 1.5 * server_ms if server_ms is not None else lag >= 0.25 * p50):
        own = f" against Triton's own {server_ms:.1f} ms" if server_ms is not None else ""
        why.append(f"it got the CPU {lag:.1f} ms late on average (mean latency {mean:.1f} ms{own})")
    if not r["requests"] and not r["errors"] and r.get("sent") == 0 and r.get("duration_s"):
        why.append("it sent no request in its window (its processes did not get the CPU in time)")
    if r.get("rate") and r.get("offered_rate") is not None and r["offered_rate"] < 0.95 * r["rate"]:
        why.append(f"it sent {r['offered_rate']:.0f} requests/s of the {r['rate']:.0f} asked")
    return "; ".join(why)


def line(r: dict) -> str:
    s = (f"{r['img_s']:.0f} img/s, p50 {r['p50_ms']:.2f} ms, p95 {r['p95_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
         f"{r['errors']} errors, client {r['processes']} processes, CPU {r['client_cpu_cores']:.1f} cores, "
         f"loop lag {r.get('client_loop_lag_ms', 0):.2f} ms")
    if "server" in r:
        sv = r["server"]
        s += (f"; server: batch {sv['avg_batch']}, queue {sv['queue_us'] / 1000:.2f} ms, "
              f"compute {sv['compute_infer_us'] / 1000:.2f} ms per request")
        if sv.get("settled") is False:
            s += f" (Triton had counted {sv['requests']:.0f} of the {r['requests']} answered after {SETTLE_S:g} s)"
    return s
