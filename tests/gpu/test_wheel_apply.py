"""On the GPU machine: the installed wheel, run from a directory away from the source tree, applies a
torch-engine model with its gate (hkbatch built from the wheel's own C++ source), and the server it
started answers an inference. Checked with a plain HTTP request and nvidia-smi, not with verify.

The wheel: $HKGPU_TEST_WHEEL (built elsewhere and carried), else built here with pip (no index).
Never changes a GPU setting (read before and after); leaves no server.
"""
import glob
import importlib.util
import http.client
import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETTINGS = "persistence_mode,compute_mode,mig.mode.current,ecc.mode.current,power.limit"


def smi(*args):
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel installed with pip into a directory of its own (--target), beside nothing of the tree."""
    for mod in ("torch", "torchvision"):
        try:
            __import__(mod)
        except ImportError:
            pytest.skip(f"{mod} is not installed here: the torch engine cannot be served")
    if importlib.util.find_spec("pytriton") is None:   # the product runs its tritonserver; it never imports it
        pytest.skip("nvidia-pytriton is not installed here: no tritonserver to serve with")
    d = tmp_path_factory.mktemp("wheel-apply")
    whl = os.environ.get("HKGPU_TEST_WHEEL")
    if not whl:
        src = d / "src"
        shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".whl", ".dist", "tests", "bench", "docs",
                                                                 "build", "dist", "*.egg-info", "__pycache__"))
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "--quiet", "--wheel-dir", str(d / "dist"), str(src)], capture_output=True, text=True,
                           timeout=300)
        if r.returncode != 0:
            pytest.skip(f"no wheel given (HKGPU_TEST_WHEEL) and pip cannot build one here: {r.stderr[-300:]}")
        (whl,) = glob.glob(str(d / "dist" / "hkgpu_tune-*.whl"))
    site = d / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-compile",
                        "--target", str(site), whl], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    away = d / "elsewhere"
    away.mkdir()
    return site, away


def hk(installed, *argv, timeout=400):
    site, away = installed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *argv], capture_output=True, text=True, cwd=away,
                          env=env, timeout=timeout)


def infer(port: int, size: int) -> tuple[dict, bytes]:
    """One request as any HTTP client sends it (KServe v2, JSON input, binary output)."""
    body = json.dumps({"inputs": [{"name": "INPUT", "shape": [2, 3, size, size], "datatype": "UINT8",
                                   "data": [7] * (2 * 3 * size * size)}],
                       "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}]}).encode()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v2/models/resnet18/infer", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    assert r.status == 200, data[:500]
    n = int(r.getheader("Inference-Header-Content-Length"))
    return json.loads(data[:n]), data[n:]


def test_the_installed_wheel_applies_a_torch_engine_model_with_its_gate(installed):
    from tests.triton.conftest import free_ports
    site, away = installed
    where = hk(installed, "--version")
    assert where.returncode == 0, where.stderr
    loc = subprocess.run([sys.executable, "-c", "import hkgpu_tune; print(hkgpu_tune.__file__)"], cwd=away,
                         env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(site)},
                         capture_output=True, text=True).stdout.strip()
    assert loc.startswith(str(site)), loc    # the wheel's copy, not the tree's
    http_port, grpc_port, metrics_port = free_ports(3)
    size = 64
    (away / "p.yaml").write_text(f"""\
name: wheel-apply
triton:
  server: pytriton
  model_repository: {away}/models
  run_dir: {away}/run
  user: root
  gpu: 0
  http: {{port: {http_port}}}
  grpc: {{port: {grpc_port}}}
  metrics: {{port: {metrics_port}}}
  models:
    - name: resnet18
      platform: tensorrt_plan
      max_batch_size: 8
      inputs: [{{name: INPUT, data_type: UINT8, dims: [3, {size}, {size}]}}]
      outputs: [{{name: OUTPUT, data_type: FP16, dims: [1000]}}]
      dynamic_batching: {{max_queue_delay_microseconds: 500}}
      instance_group: [{{count: 1, kind: KIND_GPU}}]
      build: {{torchvision: resnet18, engine: torch, backend: hkbatch, image_size: {size}, fp16: true, cuda_graphs: true}}
      config:
        parameters:
          compile: {{string_value: "false"}}
  gate:
    ready_timeout_s: 180
    warmup_requests: 4
    load: {{requests: 200, concurrency: 8}}
    p99_ms: 500
""")
    before = smi(f"--query-gpu={SETTINGS}", "--format=csv")
    try:
        r = hk(installed, "apply", "--only", "triton", "-p", "p.yaml", "--state-dir", str(away / "state"), "--json")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        doc = json.loads(r.stdout)
        assert any(n.startswith("triton gate passed:") for n in doc.get("notes", [])), doc.get("notes")
        lib = away / "models" / "resnet18" / "libtriton_hkbatch.so"
        assert lib.is_file(), "the hkbatch library was not built into the repository"
        head, raw = infer(http_port, size)
        out = head["outputs"][0]
        assert out["shape"] == [2, 1000] and out["datatype"] == "FP16", head
        assert len(raw) == 2 * 1000 * 2, len(raw)
        apps = smi("--query-compute-apps=pid,process_name", "--format=csv,noheader")
        assert "tritonserver" in apps, f"no tritonserver on the GPU: {apps!r}"
    finally:
        s = hk(installed, "triton", "stop", "-p", "p.yaml")
        assert smi(f"--query-gpu={SETTINGS}", "--format=csv") == before, "a GPU setting changed"
    assert s.returncode == 0, s.stdout + s.stderr
