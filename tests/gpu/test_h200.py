"""On a real GPU (the H200 test machine): facts, verify, dry-run plans and MPS through the library.

Never changes a GPU setting: plans and `apply --dry-run` only; the MPS daemon started here is a
process with its directories under /tmp, and it is always told to quit.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from hkgpu_tune.backends import Backends
from hkgpu_tune.backends.nvml import Nvml
from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.backends.topology import service_placement
from hkgpu_tune.subsystems.mps import Plugin as Mps

pytestmark = pytest.mark.gpu
SETTINGS = "persistence_mode,compute_mode,mig.mode.current,ecc.mode.current,power.limit,clocks.applications.graphics,clocks.applications.memory"


def smi(fields=SETTINGS):
    out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout
    return [[x.strip() for x in line.split(",")] for line in out.strip().splitlines()]


@pytest.fixture(scope="module")
def before():
    """The GPU settings before the tests; checked unchanged afterwards."""
    s = smi()
    yield s
    assert smi() == s, "a GPU setting changed during the tests"


@pytest.fixture()
def nv():
    n = Nvml()
    yield n
    n.close()


def test_facts_match_nvidia_smi(nv, before):
    info = nv.info()
    assert info["count"] == len(before) >= 1
    for i, row in enumerate(before):
        g = nv.gpu(i)
        assert g["persistence"] == (row[0] == "Enabled")
        assert g["compute_mode"] == {"Default": "default", "Exclusive_Process": "exclusive_process",
                                     "Prohibited": "prohibited"}[row[1]]
        assert abs(g["power_limit_w"] - float(row[4].split()[0])) < 1
        assert g["uuid"].startswith("GPU-") and g["pcie"]["max_width"] >= 1
        print(json.dumps(g, default=str))


def _profile(persistence, mode, extra=""):
    return parse_profile_text(f"gpu:\n  persistence: {str(persistence).lower()}\n  compute_mode: {mode}\n{extra}")


def test_verify_persistence_and_compute_mode(before):
    pers, mode = before[0][0] == "Enabled", {"Default": "default"}.get(before[0][1], "exclusive_process")
    eng = Engine(_profile(pers, mode), only=["gpu"], backends=Backends(nvml=Nvml()))
    res = {(r.target, r.key): r for r in eng.verify()}
    assert res[("gpu0", "persistence")].status == "ok"
    assert res[("gpu0", "compute_mode")].status == "ok"
    assert res[("gpu0", "pcie_link")].status in ("ok", "drift")
    for r in res.values():
        print(r.target, r.key, r.current, r.desired, r.status, r.reason)


def test_plan_is_a_dry_run(before, tmp_path):
    """A profile that wants other settings plans the writes and changes nothing."""
    pers = before[0][0] == "Enabled"
    other = "exclusive_process" if before[0][1] == "Default" else "default"
    prof = _profile(not pers, other, "  power_limit_w: 650\n")
    eng = Engine(prof, only=["gpu"], state_dir=str(tmp_path), backends=Backends(nvml=Nvml()))
    changes, _ = eng.plan()
    keys = {(c.target, c.key): c for c in changes}
    assert keys[("gpu0", "compute_mode")].desired == other
    assert keys[("gpu0", "persistence")].desired == (not pers)
    rep = eng.apply(dry_run=True)
    assert [c.applied for c in rep.changes] == [False] * len(rep.changes)
    assert not os.path.exists(tmp_path / "state.json")
    for c in changes:
        print("planned:", c.target, c.key, c.current, "->", c.desired, c.data)


MODES = {"Default": "default", "Exclusive_Process": "exclusive_process", "Prohibited": "prohibited"}


def test_cli_apply_dry_run(before, tmp_path):
    """A profile that differs from every GPU in both settings: the plan is exactly those two
    writes per GPU (current as nvidia-smi reads it), none applied, no state file."""
    pers = [row[0] == "Enabled" for row in before]
    mode = [MODES[row[1]] for row in before]
    other = "exclusive_process" if mode[0] == "default" else "default"
    prof = tmp_path / "p.yaml"
    prof.write_text(f"gpu:\n  compute_mode: {other}\n  persistence: {str(not pers[0]).lower()}\n")
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "apply", "--dry-run", "--json", "-p", str(prof),
                        "--only", "gpu", "--state-dir", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode in (0, 2), p.stderr
    doc = json.loads(p.stdout)
    got = sorted((c["target"], c["key"], c["current"], c["desired"], c["applied"]) for c in doc["changes"])
    want = []
    for i in range(len(before)):
        if mode[i] != other:
            want.append((f"gpu{i}", "compute_mode", mode[i], other, False))
        if pers[i] != (not pers[0]):
            want.append((f"gpu{i}", "persistence", pers[i], not pers[0], False))
    assert len(want) >= 2 and got == sorted(want), (got, want)
    assert not os.path.exists(tmp_path / "state.json")
    print(p.stdout)


def test_placement_from_nvml():
    pl = service_placement(Backends(nvml=Nvml()), 0)
    online = os.sched_getaffinity(0)
    assert pl["cpus"] and set(pl["cpus"]) <= set(range(os.cpu_count()))
    assert "nvml" in pl["source"]
    print(pl, "online", sorted(online))


MPS_PROFILE = """
mps:
  enabled: true
  pipe_dir: {d}/pipe
  log_dir: {d}/log
  gpus: [0]
  default_active_thread_percentage: 50
  default_pinned_mem_limit: "0=16G"
"""


@pytest.fixture()
def mps_dir():
    d = tempfile.mkdtemp(prefix="hkgpu-mps-", dir="/tmp")
    yield d
    # always quit what we started, whatever the test did
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, capture_output=True, timeout=10,
                   env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": f"{d}/pipe"})
    shutil.rmtree(d, ignore_errors=True)


def test_mps_lifecycle(mps_dir, before):
    prof = parse_profile_text(MPS_PROFILE.format(d=mps_dir))
    b = Backends(nvml=Nvml())
    eng = Engine(prof, only=["mps"], state_dir=mps_dir, backends=b)
    first = {(r.target, r.key): r.status for r in eng.verify()}
    assert first[("mps", "daemon")] == "drift"

    t0 = time.monotonic()
    rep = eng.apply()                       # creates the dirs, starts the daemon directly (no systemd), sends settings
    started = time.monotonic() - t0
    assert not rep.error, rep.error
    res = {(r.target, r.key): r for r in rep.results}
    assert res[("mps", "daemon")].status == "ok"
    assert res[("mps", "default_active_thread_percentage")].current == 50.0
    assert res[("mps dev0", "default_pinned_mem_limit")].status == "ok", res[("mps dev0", "default_pinned_mem_limit")]
    assert res[("mps", "pipe_dir")].current == "0755 root"

    # a CUDA client through the daemon
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": f"{mps_dir}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{mps_dir}/log"}
    c = subprocess.run([sys.executable, "-c", "import torch; x = torch.ones(1 << 20, device='cuda'); "
                        "print('client sum', x.sum().item())"], env=env, capture_output=True, text=True, timeout=120)
    assert c.returncode == 0, c.stderr
    plug = Mps(prof, b)
    h = plug.health()
    assert h["alive"] and h["servers"], h            # the client made the control daemon start a server
    # read without the library: each server it names is a live nvidia-cuda-mps-server, and the
    # server wrote its own log next to the control daemon's (NVIDIA's MPS guide: server.log)
    for pid in h["servers"]:
        assert os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("nvidia-cuda-mps-server"), pid
    assert os.path.getsize(f"{mps_dir}/log/server.log") > 0
    print("start+settings s", round(started, 3), "health", h, c.stdout.strip())
    print("pinned limit answer:", plug.mps.send(f"{mps_dir}/pipe", "get_default_device_pinned_mem_limit 0"))

    pids = plug.mps.processes(f"{mps_dir}/pipe")
    assert pids, pids                                # the control daemon (and its server)
    restored, errs = eng.rollback()         # quit: the daemon was the only change
    assert not errs
    assert not plug.health()["alive"]
    assert plug.mps.processes(f"{mps_dir}/pipe") == []
    print("mps processes before quit", pids, "control.log tail:", open(f"{mps_dir}/log/control.log").read()[-600:])
    print("rolled back:", [(x.key, x.current) for x in restored])
