"""Trained weights for the torch engine (build.weights: file, sha256, format): the profile pins the
file by its sha256; a missing, altered or unreadable file is one line naming the profile key, exit 1,
nothing written; the repository gets the very bytes that were hashed; a changed copy in the
repository is drift. Loading the weights needs torch and a GPU: bench/reload_h200.sh loads them
(and a file of the wrong architecture) on the H200, docs/perf/reload-h200-*.json."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
import yaml

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.fsutil import copy_pinned
from hkgpu_tune.core.profile import load_profile
from hkgpu_tune.serve.schema import config
from hkgpu_tune.serve.repository import render, torch_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def profile(tmp_path, weights: dict, build_extra=None) -> str:
    build = {"torchvision": "resnet50", "engine": "torch", "backend": "python", "weights": weights,
             **(build_extra or {})}
    doc = {"name": "w", "triton": {
        "model_repository": str(tmp_path / "models"), "run_dir": str(tmp_path / "run"), "gpu": None,
        "models": [{"name": "r50", "backend": "python", "max_batch_size": 8,
                    "inputs": [{"name": "INPUT", "data_type": "FP16", "dims": [3, 224, 224]}],
                    "outputs": [{"name": "OUTPUT", "data_type": "FP16", "dims": [1000]}],
                    "build": build}]}}
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(p)


@pytest.fixture
def wfile(tmp_path):
    data = os.urandom(3000)
    p = tmp_path / "w.pt"
    p.write_bytes(data)
    return p, sha(data)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))


def one_line_error(p) -> str:
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "Traceback" not in out, out
    lines = [ln for ln in out.splitlines() if "error" in ln]
    assert len(lines) == 1, out
    return lines[0]


def test_pinned_weights_reach_the_config_and_the_repository(tmp_path, wfile):
    path, digest = wfile
    t = load_profile(profile(tmp_path, {"file": "w.pt", "sha256": digest.upper()})).section("triton")
    m = t.models[0]
    assert m.build.weights == config.Weights(str(path), digest, "state_dict")
    params = {k: v["string_value"] for k, v in m.config["parameters"].items()}
    assert params["weights_sha256"] == digest and params["weights_format"] == "state_dict"
    assert params["weights_file"] == "weights.pt"
    # the engine reads those parameters back (no torch needed for this part)
    assert torch_model.weight_options(params) == {"file": "weights.pt", "format": "state_dict", "sha256": digest}
    st = render.model_state(t, m)
    assert st["reason"] and "1/weights.pt absent" in st["reason"]
    written = render.write_model(t, m)
    copy = os.path.join(t.model_repository, "r50", "1", "weights.pt")
    assert copy in written
    with open(copy, "rb") as f:
        assert sha(f.read()) == digest
    st = render.model_state(t, m)
    assert st["current"] == st["desired"], st
    # someone changes the deployed copy: drift, and the next write puts the pinned bytes back
    with open(copy, "ab") as f:
        f.write(b"tampered")
    st = render.model_state(t, m)
    assert st["current"] != st["desired"] and "1/weights.pt is not the file build.weights pins" in st["reason"]
    assert copy in render.write_model(t, m)
    with open(copy, "rb") as f:
        assert sha(f.read()) == digest


@pytest.mark.parametrize("case, key, text", [
    ("missing", "build.weights.file", "cannot read: No such file or directory"),
    ("wrong_sha", "build.weights.sha256", "not the " + "0" * 64 + " given here"),
    ("bad_sha", "build.weights.sha256", "a sha256 (64 hex digits)"),
    ("bad_format", "build.weights.format", "pickle"),
    ("directory", "build.weights.file", "not a regular file"),
    ("no_architecture", "build.weights", "state_dict weights need 'torchvision'"),
])
def test_bad_weights_are_one_line_naming_the_key_and_nothing_is_written(tmp_path, wfile, case, key, text):
    path, digest = wfile
    w = {"file": "w.pt", "sha256": digest}
    extra = None
    if case == "missing":
        w["file"] = "nope.pt"
    elif case == "wrong_sha":
        w["sha256"] = "0" * 64
    elif case == "bad_sha":
        w["sha256"] = "xyz"
    elif case == "bad_format":
        w["format"] = "pickle"
    elif case == "directory":
        os.mkdir(tmp_path / "wdir")
        w["file"] = "wdir"
    p = profile(tmp_path, w, extra)
    if case == "no_architecture":
        doc = yaml.safe_load(open(p))
        del doc["triton"]["models"][0]["build"]["torchvision"]
        open(p, "w").write(yaml.safe_dump(doc, sort_keys=False))
    r = cli("apply", "--only", "triton", "-p", p, "--state-dir", str(tmp_path / "state"))
    line = one_line_error(r)
    assert f"p.yaml:" in line and f"triton.models[0].{key}" in line and text in line, line
    assert not os.path.exists(tmp_path / "models") and not os.path.exists(tmp_path / "run")


def test_a_file_changed_after_parsing_never_lands(tmp_path, wfile):
    """The bytes written are the bytes hashed: a file swapped between the profile check and the
    copy is refused, and the destination is left as it was."""
    path, digest = wfile
    dst = tmp_path / "repo" / "weights.pt"
    dst.parent.mkdir()
    dst.write_bytes(b"previous")
    path.write_bytes(b"swapped after the check")
    with pytest.raises(HkError, match="has sha256 .* not the .* pinned"):
        copy_pinned(str(path), str(dst), digest, "build.weights")
    assert dst.read_bytes() == b"previous"
    assert os.listdir(dst.parent) == ["weights.pt"]   # no temporary file left
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(HkError, match="not a regular file"):
        copy_pinned(str(fifo), str(dst), digest, "build.weights")


def test_engine_checks_its_weight_parameters():
    good = {"weights_file": "weights.pt", "weights_format": "torchscript", "weights_sha256": "a" * 64}
    assert torch_model.engine_options(good)["weights"]["format"] == "torchscript"
    assert torch_model.engine_options({})["weights"] is None
    for bad, msg in [({"weights_file": "weights.pt"}, "needed with the other"),
                     ({**good, "weights_file": "../weights.pt"}, "is not a file name"),
                     ({**good, "weights_format": "pickle"}, "is not one of"),
                     ({**good, "weights_sha256": "A" * 64}, "64 lowercase hex"),
                     ({**good, "fold_bn": "true"}, "only for state_dict weights")]:
        with pytest.raises(ValueError, match=msg):
            torch_model.engine_options(bad)
    assert torch_model.WEIGHT_FORMATS == config.WEIGHT_FORMATS
