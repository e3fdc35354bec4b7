"""Capture's parts on their own: a missing iperf3, the engine benchmark here, serve, delay/jitter."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from hkgpu_tune.baseline import capture, engine_bench, iperf, settings
from hkgpu_tune.core.profile import parse_profile_text

from tests.helpers import tagged

from .netns import Bed, sh


@pytest.mark.skipif(not shutil.which("ping"), reason="ping is not installed (iputils-ping)")
def test_missing_iperf3_is_one_line_and_the_rest_is_measured(monkeypatch):
    monkeypatch.setattr(iperf, "exe", lambda: None)
    prof = parse_profile_text("network:\n  fabric_peers: [127.0.0.1]\nbaseline:\n  quick: {ping_count: 10, ping_interval_ms: 20}\n")
    snap, problems = capture.capture(prof, quick=True, engine=False)
    assert problems == [iperf.MISSING]
    assert [(t["direction"], t["error"]) for t in snap["throughput"]] == [("send", iperf.MISSING), ("receive", iperf.MISSING)]
    (row,) = snap["latency"]
    assert row["peer"] == "127.0.0.1" and row["received"] == 10 and row["error"] is None
    assert snap["baseline_format"] == 1 and "retrans_segs" in snap["counters"]["tcp"]


def test_missing_ping_is_one_line(monkeypatch):
    monkeypatch.setattr(capture, "_ping_missing", lambda: True)
    prof = parse_profile_text("network:\n  wan_peers: [198.18.0.9, 198.18.0.10]\n")
    rows, problems = capture.ping_all(prof, settings.Settings().quick, 25)
    assert problems == ["ping is not installed (Debian package iputils-ping): no RTT measured"]
    assert [r["error"] for r in rows] == problems * 2


def test_engine_benchmark_without_gpu_is_unsupported_with_the_reason():
    r = engine_bench.run(settings.Engine(), quick=False)
    if importlib.util.find_spec("torch") is None:
        assert r == {"status": "unsupported",
                     "reason": "no trtexec (TensorRT is not installed); torch is not installed"}
    else:
        assert r["status"] in ("ok", "unsupported")
        if r["status"] == "unsupported":
            assert r["reason"].endswith("torch sees no CUDA GPU")
    assert engine_bench.run(settings.Engine(), quick=True)["status"] == "skipped"


STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_trtexec.py")


def standin_plan(tmp_path, key=True):
    """A dynamic-batch ResNet-50 engine for the trtexec stand-in (profile 1..32, opt 8) and, as
    `triton build` leaves it, the key file with the build flags beside it."""
    from hkgpu_tune.serve.repository import tensorrt
    plan = tmp_path / "m.plan"
    plan.write_text(json.dumps({"standin": "trtexec", "inputs": [
        {"name": "input", "dims": [-1, 3, 224, 224], "min": [1, 3, 224, 224], "opt": [8, 3, 224, 224],
         "max": [32, 3, 224, 224]}], "outputs": [{"name": "output", "dims": [-1, 1000]}]}))
    if key:     # the flags as `triton build` makes them for this model, kept as build_plan keeps them
        (tmp_path / "m.onnx").write_bytes(b"onnx")
        model = parse_profile_text(f"""\
triton:
  model_repository: {tmp_path}/repo
  models:
    - name: resnet50
      platform: tensorrt_plan
      max_batch_size: 32
      inputs: [{{name: input, data_type: FP16, dims: [3, 224, 224]}}]
      outputs: [{{name: output, data_type: FP16, dims: [1000]}}]
      build: {{onnx: m.onnx, fp16: true, opt_batch: 8}}
""", str(tmp_path / "p.yaml")).section("triton").models[0]
        flags = [a for a in tensorrt.trtexec_args(model.build, str(plan), model)
                 if not a.startswith(("--onnx=", "--saveEngine=", "--calib="))]
        assert "--optShapes=input:8x3x224x224" in flags
        (tmp_path / os.path.basename(tensorrt.key_path(str(plan)))).write_text(json.dumps({"key": {"flags": flags}}))
    return str(plan)


@pytest.fixture
def trtexec(tmp_path, monkeypatch):
    monkeypatch.setattr("hkgpu_tune.serve.repository.tensorrt.trtexec_path", lambda: STANDIN)
    monkeypatch.setenv("STANDIN_TRTEXEC_LOG", str(tmp_path / "calls.log"))
    return tmp_path / "calls.log"


def test_trtexec_runs_the_plan_at_the_configured_batch(tmp_path, trtexec):
    """trtexec --loadEngine with --shapes from the plan's build flags; its --exportTimes JSON is read
    (the stand-in: 1 ms + 0.25 ms per image)."""
    plan = standin_plan(tmp_path)
    r = engine_bench.run(settings.Engine(batch=16, seconds=5, plan=plan), quick=False)
    assert r["status"] == "ok" and r["tool"] == "trtexec" and r["batch"] == 16 and len(r["img_s"]) == 5, r
    assert r["img_s"][0] == pytest.approx(16 * 1000 / 5.0) and r["latency_p50_ms"] == 5.0
    assert all("--shapes=input:16x3x224x224" in ln.split() for ln in trtexec.read_text().splitlines())


def test_trtexec_plan_without_build_flags_is_counted_at_the_batch_it_ran(tmp_path, trtexec):
    """No shapes known: trtexec runs the dynamic input at 1, and the rate is of batch 1, not of the
    profile's batch (which would overstate img/s 32-fold)."""
    r = engine_bench.run(settings.Engine(batch=32, seconds=5, plan=standin_plan(tmp_path, key=False)), quick=False)
    assert r["status"] == "ok" and r["batch"] == 1 and r["img_s"][0] == pytest.approx(1000 / 1.25), r
    assert "trtexec ran batch 1" in r["note"]


def test_trtexec_refusals_are_one_line_errors(tmp_path, trtexec):
    r = engine_bench.run(settings.Engine(batch=64, plan=standin_plan(tmp_path)), quick=False)
    assert r["status"] == "error" and "optimization profile [1x3x224x224, 32x3x224x224]" in r["reason"], r
    bad = tmp_path / "bad.plan"
    bad.write_bytes(b"x")
    r = engine_bench.run(settings.Engine(plan=str(bad)), quick=False)
    assert r == {"status": "error", "tool": "trtexec",
                 "reason": "trtexec exited 1: [E] Error[1]: [runtime.cpp::deserializeCudaEngine] engine "
                           "deserialization failed"}


@pytest.mark.parametrize("argv,err", [(["--loadEngine=X", "--exportTime=t.json"], "Unknown option: --exportTime=t.json"),
                                      (["--loadEngine=X", "--duration"], "Option --duration needs a value"),
                                      (["--onnx=m.onnx"], "runs saved engines only")])
def test_the_trtexec_standin_refuses_what_trtexec_refuses(tmp_path, argv, err):
    p = subprocess.run([STANDIN, *argv], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 1 and err in p.stderr, p.stderr


def test_baseline_profile_section_errors_name_the_key(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("baseline:\n  quick: {ping_count: 0}\n")
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "baseline", "capture", "-p", str(f), "--out",
                        str(tmp_path / "s.json")], capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr == f"hkgpu-tune: error: {f}:2: baseline.quick.ping_count: expected an integer 1-1000, got 0\n"
    assert not (tmp_path / "s.json").exists()


@pytest.mark.root
def test_serve_is_bounded_and_a_port_in_use_is_one_line():
    if not shutil.which("iperf3"):
        pytest.skip("iperf3 is not installed (scripts/apt-packages.txt)")
    bed = Bed("s", port=5312)
    try:
        bed.serve(seconds=30)
        p = subprocess.run(["ip", "netns", "exec", bed.peer, sys.executable, "-m", "hkgpu_tune", "baseline", "serve",
                            "--port", "5312", "--seconds", "5", "--bind", bed.fabric[0]],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 1
        assert p.stderr.splitlines()[-1].startswith("hkgpu-tune: error: iperf3 -s on port 5312 exited with 1: ")
        assert "Address already in use" in p.stderr
        # a bounded one: gone after its time, its iperf3 with it
        p = subprocess.run(["ip", "netns", "exec", bed.peer, sys.executable, "-m", "hkgpu_tune", "baseline", "serve",
                            "--port", "5313", "--seconds", "1", "--bind", bed.fabric[1]],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0 and ":5313 " not in sh("ss", "-ltnH", ns=bed.peer).stdout
        # no --bind and a profile that names no address of this host: refused, nothing listens
        f = f"/tmp/hkbl-none-{os.getpid()}.yaml"
        with open(f, "w") as fh:
            fh.write("network:\n  fabric_peers: [198.19.255.1]\n")
        try:
            p = subprocess.run(["ip", "netns", "exec", bed.peer, sys.executable, "-m", "hkgpu_tune", "baseline",
                                "serve", "--port", "5314", "--seconds", "5", "--profile", f],
                               capture_output=True, text=True, timeout=30)
        finally:
            os.unlink(f)
        assert p.returncode == 1 and p.stderr == (
            "hkgpu-tune: error: baseline serve: none of the profile's network.fabric_peers or wan_peers is an address "
            "of this host, and no --bind ADDR was given: it never listens on every address\n"), p.stderr
        assert ":5314 " not in sh("ss", "-ltnH", ns=bed.peer).stdout
        bed.server.terminate()        # SIGTERM: serve stops its iperf3 before it exits
        bed.server.wait(timeout=10)
        assert ":5312 " not in sh("ss", "-ltnH", ns=bed.peer).stdout
    finally:
        bed.close()


def _netem_missing() -> str:
    if os.geteuid() != 0 or not shutil.which("tc"):
        return "needs root and tc"
    probe = tagged("hkbl-netemprobe")
    sh("ip", "netns", "add", probe, check=False)
    try:
        p = sh("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms", ns=probe, check=False)
        return "" if p.returncode == 0 else (
            "this kernel has no netem qdisc (sch_netem), so no delay or jitter can be added to a link here: "
            "the RTT and jitter statistics are tested on recorded ping output here (test_compare.py) and the delay "
            "itself on the VM test node, whose Debian kernel has netem (tests/vm/test_wan_vm.py)")
    finally:
        sh("ip", "netns", "del", probe, check=False)


@pytest.mark.root
@pytest.mark.slow
def test_added_delay_and_jitter_are_flagged(tmp_path):
    why = _netem_missing()
    if why:
        pytest.skip(why)
    bed = Bed("n", port=5314)
    try:
        prof = bed.profile(tmp_path / "p.yaml")
        bed.serve()
        a = bed.hk("baseline", "capture", "-p", prof, "--quick", "--out", str(tmp_path / "a.json"))
        assert a.returncode == 0, a.stderr
        sh("tc", "qdisc", "add", "dev", "hkbl1", "root", "netem", "delay", "20ms", "5ms", ns=bed.peer)
        bed.hk("baseline", "capture", "-p", prof, "--quick", "--out", str(tmp_path / "b.json"))
        c = bed.hk("baseline", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json")
        assert c.returncode == 2
        import json
        rows = {m["key"]: m for m in json.loads(c.stdout)["metrics"]}
        assert rows["rtt p50 wan sg"]["regressed"] and rows["jitter wan sg"]["regressed"]
    finally:
        bed.close()


@pytest.mark.gpu
def test_torch_engine_benchmark_on_a_gpu():
    """On the GPU machine: the torch engine in rounds, img/s and latency (skipped without one)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (the GPU machine has it)")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    r = engine_bench.run(settings.Engine(model="resnet50", batch=32, seconds=3), quick=False)
    assert r["status"] == "ok" and r["tool"] == "torch", r
    assert len(r["img_s"]) == engine_bench.ROUNDS and min(r["img_s"]) > 100
    assert 0 < r["latency_p50_ms"] <= r["latency_p99_ms"] < 1000
    # what compare makes of it: a rate and a latency metric, each with a spread
    from hkgpu_tune.baseline import compare
    from .snapshots import snapshot
    m = compare.metrics(compare.Snapshot("x", snapshot(engine=r)))
    assert len(m["engine torch resnet50 b32 img/s"].samples) == 5


def test_out_that_is_a_link_or_in_no_directory_is_one_line(tmp_path):
    """No peers: a capture of counters and facts only; the snapshot path is checked like every file
    the tool writes (atomic_write: a link there is refused, its target untouched)."""
    prof = tmp_path / "p.yaml"
    prof.write_text("sysctl: {}\n")
    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / "link.json").symlink_to(target)
    for out, msg in ((tmp_path / "link.json", "refusing to replace it: it is a link"),
                     (tmp_path / "nodir" / "s.json", f"no such directory {tmp_path / 'nodir'}")):
        p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "baseline", "capture", "-p", str(prof), "--quick",
                            "--out", str(out)], capture_output=True, text=True)
        assert p.returncode == 1 and msg in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
    assert target.read_text() == "keep"
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "baseline", "capture", "-p", str(prof), "--quick",
                        "--out", str(tmp_path / "s.json"), "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    import json
    assert json.loads(p.stdout) == json.loads((tmp_path / "s.json").read_text())
