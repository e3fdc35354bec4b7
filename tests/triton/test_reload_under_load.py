"""Hot reload under load on a real tritonserver (the nvidia-pytriton wheel, CPU): an independent
client (bench/reload_client.py: plain http.client, no hkgpu_tune code) keeps 8 requests in flight
while `hkgpu-tune apply`, run as users run it, changes the instance count, the max batch and queue
delay, and the model file; then two reloads that must fail (a model file that does not load, a
model 400 ms slower per batch under an SLO no config meets). Every step: zero failed requests, the same server process, and for the bad ones
exit 1 with one error line and the previous files back on disk and serving.

The model file stands in for new weights here: the torch engine needs CUDA (bench/reload_h200.sh
reloads real weights on the GPU)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from .conftest import MODEL_PY, dump, free_ports, needs_server, profile_dict

pytestmark = [needs_server, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import reload_client  # noqa: E402  (the bench's independent client)

IN_FLIGHT = 8
BAD_INIT = '''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("these weights do not load")

    def execute(self, requests):
        return []
'''


def cli(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def server_pids(port: int) -> list[int]:
    """tritonserver processes serving HTTP on `port`, read from /proc (not from hkgpu_tune)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"tritonserver") and f"--http-port={port}".encode() in argv:
            out.append(int(d))
    return out


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("reload")
    ports = free_ports(3)
    state = str(root / "state")
    n = {"i": 0}

    def profile(count=2, max_batch=16, delay_us=2000, model_file=MODEL_PY, p99_ms=5000, sleep_ms=None):
        doc = profile_dict(root, ports, delay_us=delay_us, p99_ms=p99_ms, requests=16, concurrency=4)
        m = doc["triton"]["models"][0]
        m.update(model_file=model_file, max_batch_size=max_batch,
                 instance_group=[{"count": count, "kind": "KIND_CPU"}])
        if sleep_ms:   # the test model sleeps this long per batch (tests/triton/data/doubler.py)
            m["config"] = {"parameters": {"sleep_ms": {"string_value": str(sleep_ms)}}}
        n["i"] += 1
        path = root / f"p{n['i']}.yaml"
        path.write_text(dump(doc))
        return str(path)

    first = profile()
    p = cli("apply", "--only", "triton", "-p", first, "--state-dir", state)
    assert p.returncode == 0, p.stdout + p.stderr
    (pid,) = server_pids(ports[0])
    stop = root / "stop"
    load = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", "reload_client.py"), "--port", str(ports[0]),
                             "--model", "doubler", "--input", "INPUT0", "--output", "OUTPUT0", "--dtype", "FP32",
                             "--shape", "4", "--procs", "2", "--threads", str(IN_FLIGHT // 2), "--duration", "900",
                             "--stop-file", str(stop), "--out", str(root / "load")])
    try:
        time.sleep(3)   # the load is running before the first reload
        yield {"root": root, "state": state, "profile": profile, "pid": pid, "port": ports[0], "stop": stop,
               "load": load, "repo": f"{root}/models"}
    finally:
        stop.write_text("")
        load.wait(60)
        from hkgpu_tune.core.profile import load_profile
        from hkgpu_tune.serve.running import launch
        launch.stop(load_profile(first).section("triton"))


def records(node) -> list:
    """What the client recorded (each process writes its records when it stops)."""
    node["stop"].write_text("")
    node["load"].wait(60)
    recs = reload_client.load(str(node["root"] / "load"))
    os.unlink(node["stop"])
    return recs


def applied_under_load(node, path):
    t0 = time.time()
    p = cli("apply", "--only", "triton", "-p", path, "--state-dir", node["state"])
    t1 = time.time()
    time.sleep(1)
    return p, t0, t1


def check_window(node, recs, t0, t1):
    w = reload_client.window(recs, t0, t1 + 1)
    assert w["requests"] > IN_FLIGHT, w   # the load ran through the reload
    assert w["failed_requests"] == 0, w
    assert server_pids(node["port"]) == [node["pid"]], "the server process changed"
    return w


def one_error_line(p) -> str:
    out = p.stdout + p.stderr
    errs = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert p.returncode == 1 and len(errs) == 1 and "Traceback" not in out, out
    return errs[0]


def served_file(node) -> str:
    with open(os.path.join(node["repo"], "doubler", "1", "model.py")) as f:
        return f.read()


def test_reloads_under_load_fail_no_request(node, tmp_path):
    windows = {}
    new_file = tmp_path / "doubler_v2.py"
    new_file.write_text(open(MODEL_PY).read() + "\n# version 2 of the model\n")
    good = [("instance_count", node["profile"](count=3)),
            ("max_batch_and_delay", node["profile"](count=3, max_batch=8, delay_us=500)),
            ("model_file", node["profile"](count=3, max_batch=8, delay_us=500, model_file=str(new_file)))]
    for name, path in good:
        p, t0, t1 = applied_under_load(node, path)
        assert p.returncode == 0, (name, p.stdout + p.stderr)
        windows[name] = (t0, t1)
    last_good = good[-1][1]
    assert served_file(node) == new_file.read_text()

    bad_file = tmp_path / "bad.py"
    bad_file.write_text(BAD_INIT)
    # the config changes too: the put-back must not load the previous config over the new files
    p, t0, t1 = applied_under_load(node, node["profile"](count=3, max_batch=8, delay_us=600, model_file=str(bad_file)))
    err = one_error_line(p)
    assert "did not load" in err and "these weights do not load" in err, err
    assert err.endswith("the previous config is serving again (rolled back)"), err
    assert served_file(node) == new_file.read_text()
    windows["bad_model_file"] = (t0, t1)

    # an SLO no config meets no longer fails a reload by itself (the old config missed it too: the gate's
    # "before" rule); a model 400 ms slower per batch under it does
    p, t0, t1 = applied_under_load(node, node["profile"](count=3, max_batch=8, delay_us=700,
                                                         model_file=str(new_file), p99_ms=0.001, sleep_ms=400))
    err = one_error_line(p)
    assert "gate failed" in err and "the previous config is serving again" in err, err
    assert "as before the reload" not in err, err
    assert "sleep_ms" not in open(os.path.join(node["repo"], "doubler", "config.pbtxt")).read()
    windows["slower_model"] = (t0, t1)

    recs = records(node)
    for name, (t0, t1) in windows.items():
        check_window(node, recs, t0, t1)
    # after all of it: the last good profile verifies clean, read by the CLI
    v = cli("verify", "--only", "triton", "-p", last_good, timeout=120)
    assert v.returncode == 0, v.stdout + v.stderr
    assert served_file(node) == new_file.read_text()
