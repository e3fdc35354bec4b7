"""A small HTTP client for Triton's KServe v2 API (health, config, infer with binary tensors) and /metrics.

One keep-alive connection per Client; use one Client per thread.

>>> c = Client("127.0.0.1", 8000)        # doctest: +SKIP
>>> c.ready(), c.model_ready("doubler")  # doctest: +SKIP
(True, True)
"""
from __future__ import annotations

import http.client
import json
import math
import socket
import struct

from hkgpu_tune.core.errors import HkError

# bytes per element of Triton's data types (BYTES is length-prefixed)
SIZES = {"BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8, "INT8": 1, "INT16": 2, "INT32": 4,
         "INT64": 8, "FP16": 2, "BF16": 2, "FP32": 4, "FP64": 8}


class Client:
    def __init__(self, host: str, port: int, timeout: float = 10.0, grpc: tuple[str, int] | None = None):
        """grpc: the server's gRPC endpoint, for model control (load_model, unload_model)."""
        self.host, self.port, self.timeout, self.grpc = host, port, timeout, grpc
        self.conn: http.client.HTTPConnection | None = None

    def _conn(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return self.conn

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    # tritonserver's stop waits (up to its exit timeout) for every open HTTP connection to close
    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, method: str, path: str, body: bytes | None = None, headers=None) -> tuple[int, dict, bytes]:
        for attempt in (1, 2):  # a keep-alive connection the server closed: reconnect once
            try:
                c = self._conn()
                c.request(method, path, body=body, headers=headers or {})
                r = c.getresponse()
                return r.status, dict(r.getheaders()), r.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self.close()
                if attempt == 2:
                    raise HkError(f"triton {self.host}:{self.port}{path}: {e}") from None
            except (OSError, http.client.HTTPException) as e:
                self.close()
                raise HkError(f"triton {self.host}:{self.port}{path}: {e}") from None
        raise AssertionError("unreachable")

    def _ok(self, path: str) -> bool:
        try:
            return self.request("GET", path)[0] == 200
        except HkError:
            return False

    def ready(self) -> bool:
        return self._ok("/v2/health/ready")

    def live(self) -> bool:
        return self._ok("/v2/health/live")

    def model_ready(self, name: str) -> bool:
        return self._ok(f"/v2/models/{name}/ready")

    def model_config(self, name: str) -> dict:
        status, _, body = self.request("GET", f"/v2/models/{name}/config")
        if status != 200:
            raise HkError(f"triton: /v2/models/{name}/config answered {status}: {body[:200].decode(errors='replace')}")
        return json.loads(body)

    def _control(self, call) -> bool:
        """Model control over gRPC where this client knows the gRPC port and tritonclient[grpc] is
        here: True when it answered, HkError with Triton's first line when it refused, False (use
        HTTP) otherwise. Triton answers a load on the thread that took it, and an HTTP thread owns
        its connections: a load over HTTP stalls every request of that thread's connections for
        the whole load (docs/perf/README.md, 2026-12-05); a gRPC load stalls none."""
        if self.grpc is None:
            return False
        try:
            import tritonclient.grpc as tg
            from tritonclient.utils import InferenceServerException
        except (ImportError, RuntimeError):   # tritonclient without its grpc extras raises RuntimeError
            return False
        host, port = self.grpc
        c = tg.InferenceServerClient(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        try:
            call(c)
            return True
        except InferenceServerException as e:
            if str(e.status()) == "StatusCode.UNAVAILABLE":   # gRPC not reachable from here
                return False
            line = ((e.message() or "").strip().splitlines() or ["(no message)"])[0].strip()
            raise HkError(line if len(line) <= 160 else line[:159] + "…") from None
        finally:
            c.close()

    def load_model(self, name: str, config: dict | None = None) -> None:
        """Load (or reload) a model through the repository API (explicit model control), over gRPC
        where it can (see _control). With `config` (a ModelConfig as JSON) that config is served
        instead of config.pbtxt. Triton keeps serving the version it had when a load fails; the
        error is the first line of Triton's answer."""
        failed = f"load failed for model '{name}': "
        try:
            if self._control(lambda g: g.load_model(name, config=json.dumps(config) if config is not None else None,
                                                    client_timeout=self.timeout)):
                return
        except HkError as e:
            raise HkError(f"triton: {name} did not load: {str(e).removeprefix(failed)}") from None
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        status, _, data = self.request("POST", f"/v2/repository/models/{name}/load", json.dumps(body).encode(),
                                       {"Content-Type": "application/json"})
        if status != 200:
            msg = _error_line(data).removeprefix(failed)
            raise HkError(f"triton: {name} did not load: {msg}")

    def unload_model(self, name: str) -> None:
        try:
            if self._control(lambda g: g.unload_model(name, client_timeout=self.timeout)):
                return
        except HkError as e:
            raise HkError(f"triton: unloading {name} failed: {e}") from None
        status, _, data = self.request("POST", f"/v2/repository/models/{name}/unload", b"{}",
                                       {"Content-Type": "application/json"})
        if status != 200:
            raise HkError(f"triton: unloading {name} failed: {_error_line(data)}")

    def infer(self, model: str, inputs: list[tuple[str, str, list[int], bytes]], outputs=()) -> dict:
        """inputs: (name, datatype without TYPE_, shape with batch, raw bytes). Returns the JSON header;
        the outputs named in `outputs` (all of them when none is named) come back binary, each one's
        bytes under "raw": Triton refuses FP16 and BF16 outputs in JSON."""
        hb = infer_header(inputs, outputs)
        body = hb + b"".join(raw for *_, raw in inputs)
        status, hdrs, data = self.request("POST", f"/v2/models/{model}/infer", body, {
            "Inference-Header-Content-Length": str(len(hb)), "Content-Type": "application/octet-stream"})
        if status != 200:
            raise HkError(f"triton: infer {model} answered {status}: {data[:300].decode(errors='replace')}")
        n = int(hdrs.get("Inference-Header-Content-Length", len(data)))
        head = json.loads(data[:n])
        for o in head.get("outputs", []):
            size = o.get("parameters", {}).get("binary_data_size")
            if size is not None:
                o["raw"], n = data[n:n + size], n + size
        return head


def infer_header(inputs: list[tuple[str, str, list[int], bytes]], outputs=()) -> bytes:
    """The JSON header of a binary-tensor infer request: every output asked for in binary
    (binary_data_output covers the outputs of a request that names none)."""
    header = {"inputs": [{"name": n, "datatype": dt, "shape": shape,
                          "parameters": {"binary_data_size": len(raw)}} for n, dt, shape, raw in inputs]}
    if outputs:
        header["outputs"] = [{"name": o, "parameters": {"binary_data": True}} for o in outputs]
    else:
        header["parameters"] = {"binary_data_output": True}
    return json.dumps(header, separators=(",", ":")).encode()


def _error_line(data: bytes) -> str:
    """Triton's {"error": "..."} down to its first line (a Python model's traceback follows it)."""
    try:
        msg = str(json.loads(data).get("error", ""))
    except (ValueError, AttributeError):
        msg = data.decode(errors="replace")
    line = (msg.strip().splitlines() or ["(no message)"])[0].strip()
    return line if len(line) <= 160 else line[:159] + "…"


def tensor_bytes(data_type: str, shape: list[int]) -> bytes:
    """Zero-filled raw bytes of a tensor (BYTES: one-byte strings, length-prefixed)."""
    dt = data_type.removeprefix("TYPE_")
    count = math.prod(shape)
    if dt in ("BYTES", "STRING"):
        return (struct.pack("<I", 1) + b"0") * count
    if dt not in SIZES:
        raise HkError(f"triton: no test data for data type {data_type}")
    return bytes(SIZES[dt] * count)


def request_for(model, batch: int = 1) -> list[tuple[str, str, list[int], bytes]]:
    """A request for a profile model: zero data, variable dims (-1) as 1, batch dim where batching."""
    out = []
    for i in model.inputs:
        dims = [1 if int(d) < 0 else int(d) for d in i.get("dims", [])]
        shape = ([batch] if model.max_batch_size > 0 else []) + dims
        dt = i["data_type"].removeprefix("TYPE_")
        out.append((i["name"], "BYTES" if dt == "STRING" else dt, shape, tensor_bytes(dt, shape)))
    return out


def metrics_text(host: str, port: int, timeout: float = 5.0) -> str:
    c = Client(host, port, timeout)
    try:
        status, _, body = c.request("GET", "/metrics")
    finally:
        c.close()
    if status != 200:
        raise HkError(f"triton metrics {host}:{port}: answered {status}")
    return body.decode()


def metrics(host: str, port: int) -> dict[tuple[str, tuple], float]:
    """Triton's /metrics as {(sample name, sorted labels): value}, parsed by prometheus_client."""
    return parse_metrics(metrics_text(host, port))


def parse_metrics(text: str) -> dict[tuple[str, tuple], float]:
    """A /metrics text as {(sample name, sorted labels): value}, parsed by prometheus_client."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        raise HkError("triton: reading /metrics needs prometheus-client (pip install 'hkgpu-tune[triton]')") from None
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            # the parser names counter samples NAME_total; Triton's own names have no suffix
            name = fam.name if fam.type == "counter" and s.name == fam.name + "_total" else s.name
            out[(name, tuple(sorted(s.labels.items())))] = s.value
    return out


def model_counts(host: str, port: int, model: str) -> dict[str, float]:
    """nv_inference_count / exec_count / request_success of one model, summed over versions."""
    out = {"nv_inference_count": 0.0, "nv_inference_exec_count": 0.0, "nv_inference_request_success": 0.0}
    for (name, labels), v in metrics(host, port).items():
        if name in out and dict(labels).get("model") == model:
            out[name] += v
    return out


def model_p99_ms(host: str, port: int, model: str) -> float | None:
    """Triton's own p99 time per request of one model (queue + compute, nv_inference_request_summary_us,
    a sliding window of about a minute; the launch turns the summaries on), the highest over versions;
    None when the server exports no summary or it holds no request."""
    out = None
    for (name, labels), v in metrics(host, port).items():
        d = dict(labels)
        if name == "nv_inference_request_summary_us" and d.get("model") == model and d.get("quantile") == "0.99":
            if not math.isnan(v):
                out = v / 1000 if out is None else max(out, v / 1000)
    return out


def metrics_answer(host: str, port: int) -> dict:
    try:
        text = metrics_text(host, port)
    except HkError as e:
        return {"ok": False, "status": "not answering", "reason": str(e)}
    if "nv_inference_count" not in text:
        return {"ok": False, "status": "answering", "reason": "no nv_inference_count in /metrics"}
    return {"ok": True, "status": "answering", "reason": f"{len(text.splitlines())} lines"}


def free_ports(n: int, address: str = "127.0.0.1") -> list[int]:
    """n ports on `address` nothing listens on, outside the kernel's ephemeral range: a port the kernel
    hands out (bind to 0) can go to an outgoing connection before the server binds it."""
    import random
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        low, high = 32768, 60999
    pool = range(max(1024, low - 12000), low)
    if len(pool) < 64:   # the range starts near 1024: above it instead
        pool = range(high + 1, min(65536, high + 12001))
    rng, ports = random.Random(), []
    for _ in range(1000 if len(pool) >= 64 else 0):
        port = rng.randrange(pool.start, pool.stop)
        if port not in ports and port_free(address, port):
            ports.append(port)
            if len(ports) == n:
                return ports
    raise HkError(f"no {n} free ports on {address} outside the ephemeral range {low}-{high} "
                  f"(net.ipv4.ip_local_port_range)")


def port_free(address: str, port: int) -> bool:
    """Whether a listener could bind address:port now (what tritonserver will try)."""
    fam = socket.AF_INET6 if ":" in address else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((address, port))
        return True
    except OSError:
        return False
    finally:
        s.close()
