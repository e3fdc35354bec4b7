"""The load generator's server figures (requests mode, as the gate runs it) against a stand-in for
Triton that shows both of its timing habits: a backend counts a request some time after sending its
answer, and a /metrics read takes a while (its figures are those at the end of the read). Triton's
count must cover every request the client counted: the figures before the counted requests are read
before the first one is sent, and those after once the count has caught up. A duration load's server
rate is over the time between Triton's readings, however late they came."""
from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hkgpu_tune.serve.measuring import loadgen

COUNT_LAG_S = 0.3     # a request is counted this long after its answer
METRICS_READ_S = 0.3  # a /metrics read takes this long
N = 100               # the requests counted


class FakeTriton(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, lag: float | None):
        super().__init__(("127.0.0.1", 0), Handler)
        self.lag = lag          # None: never counts
        self.answered = []      # the time of each answer sent
        self.lock = threading.Lock()

    def count(self) -> int:
        now = time.time()
        with self.lock:
            return 0 if self.lag is None else sum(1 for t in self.answered if t + self.lag <= now)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
        self.wfile.flush()
        with self.server.lock:
            self.server.answered.append(time.time())

    def do_GET(self):
        time.sleep(METRICS_READ_S)
        body = ("# TYPE nv_inference_request_success counter\n"
                f'nv_inference_request_success{{model="m",version="1"}} {self.server.count()}\n').encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def fake(request):
    srv = FakeTriton(request.param)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def spec(srv) -> loadgen.LoadSpec:
    port = srv.server_address[1]
    return loadgen.LoadSpec("127.0.0.1", port, "m", "INPUT0", "FP32", [1, 4], concurrency=4, processes=1,
                            duration_s=0.0, warmup_s=0.3, requests=N, metrics_port=port)


@pytest.mark.parametrize("fake", [COUNT_LAG_S], indirect=True)
def test_server_figures_cover_every_counted_request(fake):
    r = loadgen.run(spec(fake))
    assert r["requests"] == N and r["errors"] == 0, r
    # counted requests sent while the first /metrics read was under way are not lost to it, and those
    # answered last are in (the stand-in counts them late: it was short when the last answer came)
    assert r["server"]["requests"] >= N, r["server"]
    assert r["server"]["settled"] is True, r["server"]


@pytest.mark.parametrize("fake", [None], indirect=True)
def test_a_count_that_never_catches_up_is_marked(fake, monkeypatch):
    monkeypatch.setattr(loadgen, "SETTLE_S", 0.5)
    t0 = time.monotonic()
    r = loadgen.run(spec(fake))
    assert r["requests"] == N and r["server"]["requests"] == 0 and r["server"]["settled"] is False, r
    assert time.monotonic() - t0 < 10
    assert f"(Triton had counted 0 of the {N} answered after 0.5 s)" in loadgen.line(r), loadgen.line(r)


@pytest.mark.parametrize("fake", [0.0], indirect=True)
def test_a_duration_loads_server_rate_is_over_its_own_readings(fake):
    """The first reading comes METRICS_READ_S late into a 1.5 s window: Triton's count misses the
    window's start, and its rate is still the client's."""
    s = spec(fake)
    s.requests, s.duration_s = None, 1.5
    r = loadgen.run(s)
    assert r["errors"] == 0 and r["requests"] > 0, r
    assert r["server"]["requests"] < r["requests"], (r["server"], r["requests"])   # its window is shorter
    assert r["server"]["req_s"] == pytest.approx(r["req_s"], rel=0.1), (r["server"], r["req_s"])
