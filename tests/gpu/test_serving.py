"""On the H200: ResNet-50 on the torch engine served through the toolkit's own Triton service, and
a short `triton sweep`. Checked with the host's own tools (nvidia-smi), not with hkgpu-tune's verify.

Never changes a GPU setting (read before and after); leaves no server and no MPS daemon.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import gone

pytestmark = pytest.mark.gpu
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH_PROFILE = os.path.join(REPO, "bench", "h200-resnet50.yaml")
SETTINGS = "persistence_mode,compute_mode,mig.mode.current,ecc.mode.current,power.limit"


def smi(*args):
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True).stdout


def hk(*argv, timeout=300):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.fixture
def profile(tmp_path):
    """The bench profile, small (max_batch 32, one instance), on its own ports and directories."""
    from tests.triton.conftest import free_ports
    text = open(BENCH_PROFILE).read().split("\nmps:")[0]
    http, grpc, metrics = free_ports(3)
    text = (text.replace("/tmp/hkgpu-bench", str(tmp_path)).replace("port: 8000", f"port: {http}")
            .replace("port: 8001", f"port: {grpc}").replace("port: 8002", f"port: {metrics}")
            .replace("max_batch_size: 64", "max_batch_size: 32").replace("count: 2", "count: 1"))
    p = tmp_path / "profile.yaml"
    p.write_text(text)
    before = smi(f"--query-gpu={SETTINGS}", "--format=csv")
    yield str(p)
    hk("triton", "stop", "-p", str(p))
    assert smi(f"--query-gpu={SETTINGS}", "--format=csv") == before, "a GPU setting changed"
    assert "nvidia-cuda-mps" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def _descendants(pid):
    """The live processes of a tree (a zombie waiting for a parent that is not ours to reap is gone)."""
    import psutil
    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    return {p.pid for p in procs if not gone(p.pid)}   # each read alone: one may exit meanwhile


def test_torch_engine_serves_resnet50_on_the_gpu(profile):
    from hkgpu_tune.core.profile import load_profile
    from hkgpu_tune.serve.running import client
    if shutil.which("trtexec"):
        pytest.skip("TensorRT is present: the engine chosen is TensorRT, not the torch engine")
    r = hk("triton", "start", "-p", profile, "--no-gate", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    pid = json.loads(r.stdout)["service"]["pid"]
    t = load_profile(profile).section("triton")
    c = client.Client(t.http.host, t.http.port, timeout=30)
    out = c.infer("resnet50", client.request_for(t.model("resnet50"), batch=3), outputs=("OUTPUT",))
    c.close()
    assert out["outputs"][0]["shape"] == [3, 1000] and out["outputs"][0]["datatype"] == "FP16", out
    # the host's own view: a process of the server's tree holds a context on the GPU
    apps = smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader")
    gpu_pids = {int(line.split(",")[0]) for line in apps.strip().splitlines() if line.strip()}
    assert gpu_pids & _descendants(pid), f"no process of the server ({pid}) on the GPU: {apps}"
    v = hk("verify", "--only", "triton", "-p", profile, "--json")
    rows = {(x["target"], x["key"]): x for x in json.loads(v.stdout)["results"]}
    assert rows[("resnet50", "engine")]["current"] == "torch", rows
    assert rows[("resnet50", "engine")]["status"] == "ok", rows
    assert "trtexec not found" in rows[("resnet50", "engine")]["reason"] or "no onnx" in rows[("resnet50", "engine")]["reason"]
    s = hk("triton", "stop", "-p", profile, "--json")
    assert s.returncode == 0, s.stdout + s.stderr
    assert not _descendants(pid)


def test_short_sweep_on_the_gpu(profile, tmp_path):
    png = tmp_path / "sweep.png"
    r = hk("triton", "sweep", "-p", profile, "--max-batch", "16,32", "--instances", "1", "--concurrency", "16,64",
           "--duration-s", "2", "--budget-s", "150", "--processes", "4", "--shm", "--slo-ms", "15",
           "--png", str(png), "--json", timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["best"] and doc["best"]["best"]["p99_ms"] <= 15, doc
    assert doc["best"]["best"]["img_s"] > 1000, doc["best"]   # the eager fp32 batch-1 server does 288
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
