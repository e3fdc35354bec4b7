"""What a hand-written inference service does: eager fp32 ResNet-50 at batch 1, one request at a
time, a plain HTTP server with no batching. The baseline of bench/serve_h200.py.

    python3 bench/naive_server.py --port 8500        # POST /infer with raw FP32 [1,3,224,224] bytes
"""
import argparse
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
import torchvision


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--image-size", type=int, default=224)
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = getattr(torchvision.models, a.model)(weights=None).eval().to(dev)
    shape = (1, 3, a.image_size, a.image_size)
    lock = threading.Lock()   # one request at a time
    with torch.no_grad():
        model(torch.zeros(shape, device=dev))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"   # keep-alive, as a client library would use
        disable_nagle_algorithm = True  # else headers and body in two sends meet delayed ACKs: 40 ms stalls

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock, torch.no_grad():
                x = torch.frombuffer(bytearray(body), dtype=torch.float32).view(shape).to(dev)
                out = model(x).cpu().numpy().tobytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    srv.daemon_threads = True
    print("READY", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
