"""The wheel serves what the source tree serves: every file the package reads at run time is in it
(the hkbatch backend's C++ source above all), and a torch-engine model is planned and its model
repository rendered (the hkbatch library built from the wheel's source) by the installed package,
run from a directory away from the source tree."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

from tests.helpers import REPO

# files (not modules) that hkgpu_tune opens at run time, relative to the package
RUNTIME_FILES = ["serve/repository/batch_backend.cc", "serve/repository/torch_model.py", "profiles/hk-inference.yaml"]


def test_the_wheel_carries_the_files_the_package_reads(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in RUNTIME_FILES:
        assert f"hkgpu_tune/{f}" in names, f
    # every non-Python file under hkgpu_tune/ that git tracks (but the ansible links' targets) ships
    tracked = subprocess.run(["git", "-C", REPO, "ls-files", "hkgpu_tune"], capture_output=True, text=True).stdout
    for f in tracked.split():
        if not f.endswith(".py") and "/ansible/" not in f and os.path.isfile(os.path.join(REPO, f)):
            assert f in names, f"{f} is not in the wheel"


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """The wheel alone in a fresh venv; its dependencies from this Python's site-packages
    (--system-site-packages, pip --no-deps: no package index needed)."""
    d = tmp_path_factory.mktemp("venv-serving")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(d)], check=True,
                   capture_output=True, timeout=120)
    r = subprocess.run([str(d / "bin" / "pip"), "install", "--quiet", "--no-deps", "--no-index",
                        "--disable-pip-version-check", wheel], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return d


def run(venv, cwd, *argv):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin" / "python"), "-m", "hkgpu_tune", *argv], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


def test_a_torch_engine_model_is_planned_and_rendered_from_the_installed_wheel(venv, tmp_path):
    away = tmp_path / "elsewhere"
    away.mkdir()
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import hkgpu_tune; print(hkgpu_tune.__file__)"],
                           capture_output=True, text=True, cwd=away,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}).stdout.strip()
    assert where.startswith(str(venv)), where          # the wheel's copy, not the source tree
    (away / "p.yaml").write_text(f"""\
triton:
  model_repository: {away}/models
  run_dir: {away}/run
  gpu: null
  models:
    - name: resnet18
      platform: tensorrt_plan
      max_batch_size: 8
      inputs: [{{name: input, data_type: FP16, dims: [3, 64, 64]}}]
      outputs: [{{name: output, data_type: FP16, dims: [1000]}}]
      build: {{torchvision: resnet18, engine: torch, backend: hkbatch, image_size: 64}}
""")
    r = run(venv, away, "plan", "-p", "p.yaml", "--only", "triton", "--json")
    assert r.returncode in (0, 2), r.stdout[-2000:] + r.stderr[-2000:]
    results = json.loads(r.stdout)["results"]
    repo = [x for x in results if x["key"] == "repository"]
    assert repo and repo[0]["status"] == "drift" and "absent" in repo[0]["reason"], repo
    assert not [x for x in results if x["status"] == "error"], results
    r = run(venv, away, "triton", "render", "-p", "p.yaml")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lib = away / "models" / "resnet18" / "libtriton_hkbatch.so"
    assert lib.is_file() and (away / "models" / "resnet18" / "1" / "model.py").is_file()
    nm = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert "TRITONBACKEND_ModelInstanceExecute" in nm
