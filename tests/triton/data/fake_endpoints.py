"""A stand-in for tritonserver's start-up order: gRPC, then HTTP (ready at once), then metrics
`delay` seconds later (tritonserver starts its metrics endpoint last: StartEndpoints in
triton-inference-server/server src/main.cc; /metrics in the text format of Prometheus' exposition
format document). Positional arguments only, checked:
    fake_endpoints.py HTTP_PORT GRPC_PORT METRICS_PORT DELAY_S (a negative delay: never)"""
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Ok(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"nv_inference_count{model=\"doubler\",version=\"1\"} 0\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve(port):
    threading.Thread(target=ThreadingHTTPServer(("127.0.0.1", port), Ok).serve_forever, daemon=True).start()


if len(sys.argv) != 5:
    sys.exit(f"usage: {sys.argv[0]} HTTP_PORT GRPC_PORT METRICS_PORT DELAY_S")
http, grpc, metrics, delay = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
g = socket.socket()
g.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
g.bind(("127.0.0.1", grpc))
g.listen(8)
threading.Thread(target=lambda: [g.accept()[0].close() for _ in iter(int, 1)], daemon=True).start()
serve(http)
if delay >= 0:
    time.sleep(delay)
    serve(metrics)
time.sleep(600)
