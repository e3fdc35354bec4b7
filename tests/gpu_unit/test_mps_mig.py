"""An MPS daemon on one MIG device (mps.gpus: [MIG-...]; NVIDIA's MIG user guide runs one control
daemon per MIG device with CUDA_VISIBLE_DEVICES set to it), against the recorded A30 (MIG on,
2 x 2g.12gb: MIG-...0301 and MIG-...0401)."""
import pytest

from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.subsystems.mps import render_unit
from hkgpu_tune.tune.engine import Engine

from .conftest import FakeMps, backends, by_key, load, profile

MIG_A = "MIG-a30a30a3-0000-5000-8000-000000000301"
GONE = "MIG-00000000-0000-5000-8000-000000000000"


def text(tmp_path, gpus):
    return (f"mps:\n  pipe_dir: {tmp_path}/pipe\n  log_dir: {tmp_path}/log\n  gpus: {gpus}\n"
            f"  default_pinned_mem_limit: '0=4G'\n")


def test_the_daemon_unit_sees_the_mig_device():
    cfg = profile(text("/tmp/x", f"[{MIG_A}]")).section("mps")
    assert cfg.gpus == (MIG_A,)
    u = render_unit(cfg, "/usr/bin/nvidia-cuda-mps-control", cfg.gpus)
    assert f"Environment=CUDA_VISIBLE_DEVICES={MIG_A}" in u.splitlines()


@pytest.mark.parametrize("gpus, msg", [
    (f"[{MIG_A}, MIG-a30a30a3-0000-5000-8000-000000000401]", "one MIG device per MPS daemon"),
    (f"[0, {MIG_A}]", "one MIG device per MPS daemon"),
    ("[MIG-a30a30a3]", "test.yaml:4: mps.gpus[0]: expected a MIG device UUID"),
])
def test_bad_mig_gpus_name_their_line(gpus, msg):
    with pytest.raises(ProfileError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        profile(text("/tmp/x", gpus))


def test_verify_reads_the_mig_device_and_the_parent_compute_mode(tmp_path):
    facts = load("mig-a30.json")["gpu"]
    facts["gpus"][0]["compute_mode"] = "default"      # the A30 record carries no compute mode
    eng = Engine(profile(text(tmp_path, f"[{MIG_A}]")), only=["mps"], state_dir=str(tmp_path / "s"),
                 backends=backends(facts, mps=FakeMps(running=True)))
    r = by_key(eng.verify())
    assert r[(MIG_A, "mig_device")].status == "ok" and r[(MIG_A, "mig_device")].current == "2g.12gb on GPU 0"
    assert r[("gpu0", "compute_mode")].status == "ok"          # the parent GPU's mode is read
    facts["gpus"][0]["compute_mode"] = "prohibited"
    eng = Engine(profile(text(tmp_path, f"[{MIG_A}]")), only=["mps"], state_dir=str(tmp_path / "s1"),
                 backends=backends(facts, mps=FakeMps(running=True)))
    assert by_key(eng.verify())[("gpu0", "compute_mode")].status == "drift"
    eng = Engine(profile(text(tmp_path, f"[{GONE}]")), only=["mps"], state_dir=str(tmp_path / "s2"),
                 backends=backends(facts, mps=FakeMps(running=True)))
    r = by_key(eng.verify())[(GONE, "mig_device")]
    assert r.status == "drift" and r.current == "absent" and "GPU reset" in r.reason
