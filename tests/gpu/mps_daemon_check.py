"""On the GPU machine: what verify reads of a real MPS control daemon (NVIDIA's
nvidia-cuda-mps-control), compared with the stand-in's answers (tests/standins/nvidia-cuda-mps-control).
Starts a daemon with its directories under /tmp, reads it, and always quits it.
    python3 tests/gpu/mps_daemon_check.py"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from hkgpu_tune.backends.mps import MpsControl  # noqa: E402


def main():
    d = tempfile.mkdtemp(prefix="hk-mps-")
    pipe, log = os.path.join(d, "pipe"), os.path.join(d, "log")
    os.makedirs(pipe)
    os.makedirs(log)
    m = MpsControl()
    out = {"binary": m.binary()}
    m.start(pipe, log, gpus=[0])
    try:
        out["daemon"] = m.daemon(pipe)
        out["health"] = m.health(pipe)
        with open(f"/proc/{out['daemon']['pid']}/comm") as f:
            out["comm"] = f.read().strip()
        with open(f"/proc/{out['daemon']['pid']}/cmdline", "rb") as f:
            out["cmdline"] = f.read().split(b"\0")[0].decode()
        out["no_daemon_answer"] = None
    finally:
        m.stop(pipe)
    out["after_quit"] = m.daemon(pipe)
    try:
        m.send(pipe, "get_server_list")
    except Exception as e:  # noqa: BLE001 - the message is the point
        out["no_daemon_answer"] = str(e)
    print(json.dumps(out, indent=1))


main()
