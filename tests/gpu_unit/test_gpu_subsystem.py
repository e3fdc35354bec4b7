"""gpu subsystem: plan/verify against the recorded H200 and the 8-GPU DGX H100, with drift cases."""
import subprocess
import sys

import pytest

from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.report import exit_code

from .conftest import Persistenced, backends, by_key, profile

BASE = "gpu:\n  persistence: true\n  compute_mode: default\n  pcie_check: true\n"


def engine(facts, text=BASE, tmp_path=None, **kw):
    return Engine(profile(text), only=["gpu"], state_dir=str(tmp_path) if tmp_path else None, backends=backends(facts, **kw))


def test_h200_as_recorded_is_ok(h200_facts):
    res = by_key(engine(h200_facts).verify())
    assert {k: r.status for k, r in res.items()} == {
        ("gpu0", "persistence"): "ok", ("gpu0", "compute_mode"): "ok", ("gpu0", "pcie_link"): "ok"}
    assert res[("gpu0", "pcie_link")].current == "gen5 x16"


def test_dgx_eight_gpus_one_init(dgx):
    eng = engine(dgx["gpu"])
    res = eng.verify()
    assert len(res) == 8 * 3 and {r.status for r in res} == {"ok"}
    assert eng.b.nvml.inits == 1


def test_persistence_off_is_fixed_through_nvml_and_rolled_back(h200_facts, tmp_path):
    h200_facts["gpus"][0]["persistence"] = False
    eng = engine(h200_facts, tmp_path=tmp_path)
    changes, res = eng.plan()
    assert [(c.target, c.key, c.current, c.desired) for c in changes] == [("gpu0", "persistence", False, True)]
    assert "NVML" in by_key(res)[("gpu0", "persistence")].reason   # no persistenced service here
    rep = eng.apply()
    assert not rep.error and eng.b.nvml.writes == [(0, "persistence", True)]
    assert by_key(rep.results)[("gpu0", "persistence")].status == "ok"
    restored, errs = eng.rollback()
    assert not errs and eng.b.nvml.writes[-1] == (0, "persistence", False)


def _persistence(eng):
    return [g["persistence"] for g in eng.b.nvml.facts["gpus"]]


def test_persistence_through_the_daemon_where_installed(dgx, tmp_path):
    """With nvidia-persistenced installed and systemd running, the fix is the service, not NVML:
    the daemon turns persistence on a moment after its start, the read-back waits for it, and the
    rollback stops the service (the daemon lets the GPUs go)."""
    for g in dgx["gpu"]["gpus"]:
        g["persistence"] = False
    sd = Persistenced()
    eng = engine(dgx["gpu"], tmp_path=tmp_path, systemd=sd, programs=["nvidia-persistenced"])
    sd.nvml = eng.b.nvml
    changes, res = eng.plan()
    assert len(changes) == 8 and all(c.data["how"] == "service" for c in changes)
    rep = eng.apply()
    assert not rep.error and not rep.rolled_back, rep.error
    assert {r.status for r in rep.results if r.key == "persistence"} == {"ok"} and len(rep.results) >= 8
    assert set(sd.calls) == {("enable", Persistenced.UNIT)} and sd.is_active(Persistenced.UNIT)
    assert _persistence(eng) == [True] * 8 and eng.b.nvml.writes == []     # the daemon did it, not NVML
    restored, errs = eng.rollback()
    assert not errs and len(restored) == 8
    assert ("disable", Persistenced.UNIT) in sd.calls and not sd.is_active(Persistenced.UNIT)
    assert _persistence(eng) == [False] * 8 and eng.b.nvml.writes == []
    sd.join()


def test_persistence_daemon_that_does_not_enable_it_is_rolled_back(dgx, tmp_path):
    """A site's unit that starts the daemon with --no-persistence-mode: the service runs, NVML still
    says off, so the read-back fails after its poll, the apply is an error and the service is left
    as it was (stopped)."""
    for g in dgx["gpu"]["gpus"]:
        g["persistence"] = False
    sd = Persistenced(args=["--no-persistence-mode"])
    eng = engine(dgx["gpu"], tmp_path=tmp_path, systemd=sd, programs=["nvidia-persistenced"])
    sd.nvml = eng.b.nvml
    eng.by_name["gpu"].poll_s = 0.5
    rep = eng.apply()
    assert rep.error and "gpu0 persistence: wrote True, NVML shows False" in rep.error and rep.rolled_back
    assert sd.calls[0] == ("enable", Persistenced.UNIT) and ("disable", Persistenced.UNIT) in sd.calls
    assert not sd.is_active(Persistenced.UNIT)
    sd.join()
    assert _persistence(eng) == [False] * 8 and eng.b.nvml.writes == []


def test_pcie_width_degraded_is_drift_not_fixable(dgx):
    dgx["gpu"]["gpus"][6]["pcie"].update(width=8)
    eng = engine(dgx["gpu"])
    changes, res = eng.plan()
    r = by_key(res)[("gpu6", "pcie_link")]
    assert r.status == "drift" and r.current == "gen5 x8" and "x8 of x16" in r.reason
    assert changes == [] and exit_code(res) == 2


@pytest.mark.parametrize("pstate,status", [(0, "drift"), (8, "ok")])
def test_pcie_gen_below_max_drift_only_under_load(h200_facts, pstate, status):
    h200_facts["gpus"][0]["pcie"]["gen"] = 3
    h200_facts["gpus"][0]["pstate"] = pstate
    r = by_key(engine(h200_facts).verify())[("gpu0", "pcie_link")]
    assert (r.status, r.current) == (status, "gen3 x16")


def test_compute_mode_clocks_power_plan_apply_rollback(h200_facts, tmp_path):
    text = BASE.replace("default", "exclusive_process") + "  application_clocks: {sm: 1755, mem: 3201}\n  power_limit_w: 650\n"
    eng = engine(h200_facts, text, tmp_path)
    changes, _ = eng.plan()
    assert {c.key: c.desired for c in changes} == {
        "compute_mode": "exclusive_process", "application_clocks": {"sm": 1755, "mem": 3201}, "power_limit_w": 650}
    rep = eng.apply()
    assert not rep.error and {r.status for r in rep.results} == {"ok"}
    eng.rollback()
    g = eng.b.nvml.gpu(0)
    assert (g["compute_mode"], g["app_clocks_mhz"]["sm"], g["power_limit_w"]) == ("default", 1980, 700.0)


def test_power_limit_outside_range_is_unsupported(h200_facts):
    r = by_key(engine(h200_facts, "gpu:\n  power_limit_w: 1000\n  pcie_check: false\n").verify())[("gpu0", "power_limit_w")]
    assert r.status == "unsupported" and "200-700 W" in r.reason


def test_write_refused_rolls_back(h200_facts, tmp_path):
    h200_facts["gpus"][0].update(compute_mode="prohibited", persistence=False, read_only=True)
    rep = engine(h200_facts, tmp_path=tmp_path).apply()
    assert rep.error.startswith("GPU 0 persistence: permission denied") and rep.rolled_back


def test_missing_gpu_index_is_an_error(h200_facts):
    res = by_key(engine(h200_facts, "gpu:\n  gpus: [0, 3]\n  persistence: true\n").verify())
    assert res[("gpu3", "present")].status == "error" and res[("gpu0", "persistence")].status == "ok"


def test_no_driver_every_setting_unsupported():
    res = engine(None).verify()
    assert len(res) == 3 and {r.status for r in res} == {"unsupported"}
    assert all(r.reason == "NVML library not found (libnvidia-ml.so.1)" for r in res)
    assert exit_code(res) == 2


@pytest.mark.parametrize("text,msg", [
    ("gpu:\n  compute_mode: exclusive\n", "test.yaml:2: gpu.compute_mode: expected one of default, exclusive_process"),
    ("gpu:\n  gpus: [0, 0]\n", "test.yaml:2: gpu.gpus: a GPU index is listed twice"),
    ("gpu:\n  persistance: true\n", "did you mean 'persistence'"),
    ("gpu:\n  application_clocks: {sm: 1980}\n", "missing required key 'mem'"),
])
def test_profile_errors_name_file_line_key(text, msg):
    with pytest.raises(ProfileError, match=msg.replace("(", r"\(")):
        profile(text)


def test_cli_without_driver_no_traceback(tmp_path):
    from hkgpu_tune.backends.nvml import Nvml
    if Nvml().available()[0]:
        pytest.skip("an NVIDIA driver is installed here")
    p = tmp_path / "p.yaml"
    p.write_text(BASE)
    r = subprocess.run([sys.executable, "-m", "hkgpu_tune", "verify", "--only", "gpu", "-p", str(p), "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "NVML library not found" in r.stdout


def test_a_replaced_gpu_is_another_device(h200_facts, tmp_path):
    """A GPU's original belongs to that GPU (its UUID), not to its index: after the board at
    index 0 is replaced, rollback never writes the old board's original to the new one (kept and
    reported), and apply on the new board saves the new board's own original."""
    h200_facts["gpus"][0]["persistence"] = False
    old = h200_facts["gpus"][0]["uuid"]
    assert old and old.startswith("GPU-")
    eng = engine(h200_facts, tmp_path=tmp_path)
    assert not eng.apply().error
    assert eng.b.nvml.writes == [(0, "persistence", True)]
    # the board is swapped: same index, another UUID, its persistence found on
    new = "GPU-" + "1" * 8 + old[12:]
    eng.b.nvml.facts["gpus"][0].update(uuid=new, persistence=False, compute_mode="exclusive_process")
    rep = eng.rollback()
    assert eng.b.nvml.writes == [(0, "persistence", True)], "the old board's original reached the new one"
    assert len(rep.kept) == 1 and f"is {new}, not {old}" in rep.errors[0], rep.errors
    # apply on the new board: its own originals (the same key too), beside the kept one
    eng = engine(eng.b.nvml.facts, tmp_path=tmp_path)
    assert not eng.apply().error
    saved = {(c.key, c.data.get("uuid")): c.current for c in eng.state.load()}
    assert saved == {("persistence", old): False, ("persistence", new): False,
                     ("compute_mode", new): "exclusive_process"}, saved
    # the old board comes back: its own original is restored to it
    eng.b.nvml.facts["gpus"][0]["uuid"] = old
    rep = eng.rollback()
    assert ("persistence", False) in [(c.key, c.current) for c in rep.restored], rep.errors
