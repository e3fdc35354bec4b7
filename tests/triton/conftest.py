"""Fixtures for the Triton tests: free loopback ports, a profile with a Python-backend model, and a
real tritonserver (from the nvidia-pytriton wheel) launched once per module through the library."""
from __future__ import annotations

import importlib.util
import os

import pytest
import yaml

DATA = os.path.join(os.path.dirname(__file__), "data")
MODEL_PY = os.path.join(DATA, "doubler.py")
HAVE_PYTRITON = importlib.util.find_spec("pytriton") is not None
needs_server = pytest.mark.skipif(not HAVE_PYTRITON, reason="needs the nvidia-pytriton wheel (its tritonserver)")


def free_ports(n: int) -> list[int]:
    """n free loopback ports outside the kernel's ephemeral range (client.free_ports)."""
    from hkgpu_tune.serve.running import client
    return client.free_ports(n)


def profile_dict(root, ports, *, delay_us=20000, p99_ms=2000, requests=64, concurrency=8) -> dict:
    """A triton: profile with one Python-backend model (OUTPUT0 = 2 * INPUT0) and dynamic batching."""
    http, grpc, metrics = ports
    return {"name": "triton-test", "triton": {
        "server": "pytriton", "model_repository": f"{root}/models", "run_dir": f"{root}/run", "gpu": None,
        # root starts the server as triton-server unless a profile names root (this machine has no such user)
        "user": "root",
        "http": {"port": http}, "grpc": {"port": grpc}, "metrics": {"port": metrics},
        "models": [{
            "name": "doubler", "backend": "python", "model_file": MODEL_PY, "max_batch_size": 16,
            "inputs": [{"name": "INPUT0", "data_type": "FP32", "dims": [4]}],
            "outputs": [{"name": "OUTPUT0", "data_type": "FP32", "dims": [4]}],
            "dynamic_batching": {"max_queue_delay_microseconds": delay_us},
            "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        }],
        "gate": {"ready_timeout_s": 60, "warmup_requests": 4,
                 "load": {"requests": requests, "concurrency": concurrency}, "p99_ms": p99_ms},
    }}


def dump(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture
def write_profile(tmp_path):
    def make(text: str, name: str = "profile.yaml") -> str:
        p = tmp_path / name
        p.write_text(text)
        return str(p)
    return make
