"""hkbatch checks the backend API version it was written for when tritonserver loads it
(TRITONBACKEND_Initialize reads TRITONBACKEND_ApiVersion, as Triton's own backends do) and refuses
another major, or an older minor, with one line. tests/standins/backend_host.cc stands in for the
server's backend loader (Triton's backend docs: the library is opened and TRITONBACKEND_Initialize
called before any model). The real server accepting it: tests/triton/test_batch_backend.py."""
from __future__ import annotations

import os
import subprocess

import pytest

from hkgpu_tune.serve.repository import batch_backend

HOST = os.path.join(os.path.dirname(os.path.dirname(__file__)), "standins", "backend_host.cc")
pytestmark = pytest.mark.skipif(batch_backend.compiler() is None, reason="needs a C++ compiler (g++)")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("hkbatch-api")
    batch_backend.install(str(d))
    subprocess.run(["c++", "-rdynamic", "-o", str(d / "host"), HOST, "-ldl"], check=True, timeout=120)
    return d


def load(built, major, minor):
    return subprocess.run([str(built / "host"), str(built / batch_backend.LIBRARY)], capture_output=True, text=True,
                          env={**os.environ, "MAJOR": str(major), "MINOR": str(minor)}, timeout=30)


@pytest.mark.parametrize("major,minor", [(1, 19), (1, 25)])
def test_the_version_it_was_written_for_loads(built, major, minor):
    r = load(built, major, minor)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stdout


@pytest.mark.parametrize("major,minor", [(2, 0), (1, 12), (0, 30)])
def test_another_version_is_refused_with_one_line(built, major, minor):
    r = load(built, major, minor)
    assert r.returncode == 1 and r.stdout == (
        f"hkbatch: this Triton's backend API is {major}.{minor}; hkbatch was written for 1.19 and later 1.x "
        "(use the python backend)\n"), r.stdout
