"""The hkbatch backend on a real tritonserver (the nvidia-pytriton wheel's, CPU): built from its
source by the library, requests of one and of several rows batched together and each answered with
its own rows, Triton's statistics, a failing run() answered as errors while the server keeps
serving, and a model file without the class refused at load with the reason."""
from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.profile import load_profile
from hkgpu_tune.serve.repository import batch_backend, render
from hkgpu_tune.serve.running import launch

from .conftest import DATA, dump, free_ports, needs_server, profile_dict

pytestmark = [needs_server, pytest.mark.slow,
              pytest.mark.skipif(not batch_backend.available()[0], reason=f"hkbatch: {batch_backend.available()[1]}")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("hkbatch")
    doc = profile_dict(root, free_ports(3), delay_us=20000)
    m = doc["triton"]["models"][0]
    m.update(name="rows", backend="hkbatch", model_file=os.path.join(DATA, "batch_rows.py"))
    m["instance_group"] = [{"count": 2, "kind": "KIND_CPU"}]
    (root / "profile.yaml").write_text(dump(doc))
    t = load_profile(str(root / "profile.yaml")).section("triton")
    written = render.write_repository(t)
    launch.start(t)
    try:
        launch.wait_ready(t)
        yield {"t": t, "root": root, "written": written}
    finally:
        launch.stop(t)


def grpc_client(t):
    import tritonclient.grpc as g
    return g, g.InferenceServerClient(f"{t.grpc.host}:{t.grpc.port}")


def infer(g, c, x, model="rows"):
    inp = g.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return c.infer(model, [inp], client_timeout=30).as_numpy("OUTPUT0")


def test_the_library_is_built_from_its_source_into_the_model_directory(server):
    d = os.path.join(server["t"].model_repository, "rows")
    lib = os.path.join(d, batch_backend.LIBRARY)
    assert lib in server["written"]
    assert batch_backend.installed_sha(d) == batch_backend.source_sha()[:12]
    assert batch_backend.install(d) is False   # current: not rebuilt
    st = render.model_state(server["t"], server["t"].models[0])
    assert not st["reason"] and "unsupported" not in st, st
    log = open(os.path.join(server["t"].run_dir, "tritonserver.log")).read()
    assert log.count("batches up to 16, rows of 16 bytes in, 16 out, 3 copy thread(s)") == 2   # both instances
    assert "batch_rows: instance 2 of this model's namespace" in log   # model.py ran once for both


def test_each_request_gets_its_own_rows_from_shared_batches(server):
    g, c = grpc_client(server["t"])
    before = c.get_inference_statistics("rows", as_json=True)["model_stats"][0]

    def one(i):
        rows = 1 + (i % 3 == 0)   # requests of one and of two rows in the same batches
        x = (np.arange(4 * rows, dtype=np.float32).reshape(rows, 4) + 10 * i)
        return np.array_equal(infer(g, c, x), x * 2 + x.sum(axis=1, keepdims=True)), rows

    with ThreadPoolExecutor(24) as ex:
        res = list(ex.map(one, range(240)))
    assert all(ok for ok, _ in res), sum(not ok for ok, _ in res)
    after = c.get_inference_statistics("rows", as_json=True)["model_stats"][0]
    rows = sum(r for _, r in res)
    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == rows
    execs = int(after["execution_count"]) - int(before.get("execution_count", 0))
    assert execs < len(res) / 3, f"{execs} executions for {len(res)} requests: the batcher did not batch"
    assert any(int(b["batch_size"]) > 1 for b in after["batch_stats"])


def test_a_failing_run_answers_errors_and_the_server_keeps_serving(server):
    g, c = grpc_client(server["t"])
    from tritonclient.utils import InferenceServerException
    with pytest.raises(InferenceServerException, match="a row starts with -1"):
        infer(g, c, np.array([[-1, 0, 0, 0]], np.float32))
    x = np.array([[1, 2, 3, 4]], np.float32)
    assert np.array_equal(infer(g, c, x), x * 2 + 10)


@pytest.mark.parametrize("name,file,msg", [
    ("nocls", "batch_none.py", "hkbatch: nocls/1/model.py has no class TritonBatchModel"),
    ("leaves", "batch_exit.py", "hkbatch: leaves/1/model.py: TritonBatchModel(): this model leaves"),
    ("fp8", "batch_bad_dtype.py", "hkbatch: output_dtype FP8 is not a Triton data type"),
])
def test_a_model_that_cannot_start_fails_to_load_and_the_server_keeps_serving(server, name, file, msg):
    t = server["t"]
    d = os.path.join(t.model_repository, name)
    os.makedirs(os.path.join(d, "1"))
    shutil.copyfile(os.path.join(DATA, file), os.path.join(d, "1", "model.py"))
    batch_backend.install(d)
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write(f'name: "{name}"\nbackend: "hkbatch"\nmax_batch_size: 4\n'
                'input [{name: "INPUT0", data_type: TYPE_FP32, dims: [4]}]\n'
                'output [{name: "OUTPUT0", data_type: TYPE_FP32, dims: [4]}]\n')
    from hkgpu_tune.serve.running import client
    with client.Client(t.http.host, t.http.port) as c, pytest.raises(HkError) as e:
        c.load_model(name)
    assert msg in str(e.value), e.value
    g, gc_ = grpc_client(t)   # still serving: a SystemExit in a model must not end the server
    x = np.ones((1, 4), np.float32)
    assert np.array_equal(infer(g, gc_, x), x * 2 + 4)
    if file == "batch_bad_dtype.py":   # the model object existed: its finalize() ran
        assert "batch_bad_dtype: finalized" in open(os.path.join(t.run_dir, "tritonserver.log")).read()


def test_the_server_stops_without_waiting_out_its_exit_timeout(server):
    """tritonserver's stop waits up to its exit timeout for open HTTP connections: a Client left
    open (a traceback that keeps one alive is enough) made this stop take 30 s."""
    t = server["t"]
    rep = launch.stop(t)
    assert rep["stopped"] and rep["how"] == "SIGTERM" and "note" not in rep, rep
    assert "Exit timeout expired" not in open(os.path.join(t.run_dir, "tritonserver.log")).read()


def test_server_env_names_this_python():
    import sysconfig
    env = batch_backend.server_env()
    assert os.path.isfile(env["HKGPU_PYTHON_LIBRARY"]) and os.access(env["HKGPU_PYTHON_EXECUTABLE"], os.X_OK)
    # the embedded Python's home is the base prefix: a venv's packages come through PYTHONPATH
    assert sysconfig.get_paths()["purelib"] in env["PYTHONPATH"].split(":")
