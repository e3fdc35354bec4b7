"""gpu.mig: MIG layouts planned on the recorded H200 (read-only there), applied and rolled back on
A30/A100 records built from NVIDIA's documents (tests/fixtures/gpu/make_mig.py says which)."""
import subprocess
import sys

import pytest

from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.report import Change
from hkgpu_tune.tune.settings import validate

from .conftest import backends, by_key, load, profile


def mig_profile(devices="all", enabled=True, layout=None):
    text = f"gpu:\n  pcie_check: false\n  mig:\n    - devices: {devices}\n      mig-enabled: {str(enabled).lower()}\n"
    if layout:
        text += "      mig-devices:\n" + "".join(f"        \"{k}\": {v}\n" for k, v in layout.items())
    return profile(text)


def engine(fixture, prof, tmp_path, facts=None):
    facts = facts or load(fixture)["gpu"]
    return Engine(prof, only=["mig"], state_dir=str(tmp_path), backends=backends(facts))


def layout(eng, i=0):
    """Straight from the replayed record, not through the subsystem's read."""
    gis = eng.b.nvml.facts["gpus"][i]["mig_instances"]
    return sorted(gi["name"] for gi in gis), [ci["uuid"] for gi in gis for ci in gi["compute"]]


def test_h200_plan_names_the_drain_and_writes_nothing(tmp_path):
    eng = engine("mig-h200.json", mig_profile(layout={"1g.18gb": 7}), tmp_path)
    changes, res = eng.plan()
    assert [(c.target, c.key, c.current, c.desired) for c in changes] == [
        ("gpu0", "mig_mode", False, True), ("gpu0", "mig_devices", {}, {"1g.18gb": 7})]
    r = by_key(res)
    assert "drain GPU 0" in r[("gpu0", "mig_mode")].reason and "reboot" in r[("gpu0", "mig_mode")].reason
    assert "after the MIG mode change" in r[("gpu0", "mig_devices")].reason
    assert eng.b.nvml.writes == []
    eng.apply(dry_run=True)
    assert eng.b.nvml.writes == [] and not eng.b.nvml.facts["gpus"][0]["mig"]["pending"]


def test_h200_profile_it_lacks_is_unsupported(tmp_path):
    eng = engine("mig-h200.json", mig_profile(layout={"1g.10gb": 7}), tmp_path)
    r = by_key(eng.verify())[("gpu0", "mig_devices")]
    assert r.status == "unsupported" and "1g.18gb" in r.reason and "no MIG profile 1g.10gb" in r.reason


@pytest.mark.parametrize("want, why", [({"1g.18gb": 8}, "at most 7 x 1g.18gb"),
                                        ({"4g.71gb": 1, "3g.71gb": 1, "1g.18gb": 1}, "8 slices asked")])
def test_h200_layout_that_cannot_fit(tmp_path, want, why):
    r = by_key(engine("mig-h200.json", mig_profile(layout=want), tmp_path).verify())[("gpu0", "mig_devices")]
    assert r.status == "unsupported" and why in r.reason


def test_a30_relayout_apply_verify_rollback(tmp_path):
    eng = engine("mig-a30.json", mig_profile(layout={"1g.6gb": 4}), tmp_path)
    before = layout(eng)
    assert before[0] == ["2g.12gb", "2g.12gb"]
    changes, _ = eng.plan()
    assert [(c.key, c.current, c.desired) for c in changes] == [("mig_devices", {"2g.12gb": 2}, {"1g.6gb": 4})]
    rep = eng.apply()
    assert not rep.error, rep.error
    names, uuids = layout(eng)
    assert names == ["1g.6gb"] * 4 and len(set(uuids)) == 4 and all(u.startswith("MIG-") for u in uuids)
    ok = by_key(rep.results)[("gpu0", "mig_devices")]
    assert ok.status == "ok" and all(u in ok.reason for u in uuids)   # each MIG device named by its UUID
    facts = eng.facts()["mig"]["gpu0"]
    assert sorted(d["uuid"] for d in facts["devices"]) == sorted(uuids)
    _, errs = eng.rollback()
    assert not errs and layout(eng)[0] == before[0]


def test_a30_busy_gpu_is_refused_and_left_alone(tmp_path):
    facts = load("mig-a30.json")["gpu"]
    facts["gpus"][0]["processes"] = {"compute": [4242], "mps": []}
    eng = engine("mig-a30.json", mig_profile(layout={"4g.24gb": 1}), tmp_path, facts=facts)
    before = layout(eng)
    rep = eng.apply()
    assert rep.error and "in use by pid 4242" in rep.error and "drain" in rep.error
    assert layout(eng) == before and eng.b.nvml.writes == []


def test_a30_disable_destroys_then_switches_and_rollback_rebuilds(tmp_path):
    eng = engine("mig-a30.json", mig_profile(enabled=False), tmp_path)
    changes, _ = eng.plan()
    assert [(c.key, c.current, c.desired) for c in changes] == [("mig_mode", True, False)]
    rep = eng.apply()
    # NVML refuses to turn MIG off while instances exist (the record answers IN_USE)
    assert rep.error and "in use" in rep.error and rep.rolled_back
    assert eng.b.nvml.facts["gpus"][0]["mig"]["current"] is True


def test_a100_enable_in_passthrough_needs_reboot_and_leaves_no_pending(tmp_path):
    eng = engine("mig-a100.json", mig_profile(devices="[1]", layout={"3g.20gb": 2}), tmp_path)
    changes, _ = eng.plan()
    assert [c.target for c in changes] == ["gpu1", "gpu1"]
    rep = eng.apply()
    assert rep.error and "reboot the VM" in rep.error and "nvidia-smi -i 1 -mig 1" in rep.error
    g = eng.b.nvml.facts["gpus"][1]["mig"]
    assert g == {"current": False, "pending": False}


def test_a100_enable_where_nvml_can_reset(tmp_path):
    facts = load("mig-a100.json")["gpu"]
    facts["gpus"][0]["mig_reset_required"] = False     # bare metal: NVML resets the GPU itself
    eng = engine("mig-a100.json", mig_profile(devices="[0]", layout={"3g.20gb": 1, "2g.10gb": 2}), tmp_path, facts)
    assert not eng.apply().error
    assert layout(eng)[0] == ["2g.10gb", "2g.10gb", "3g.20gb"]
    assert {r.status for r in eng.verify()} == {"ok"}
    _, errs = eng.rollback()
    assert not errs and eng.b.nvml.facts["gpus"][0]["mig"] == {"current": False, "pending": False}
    assert eng.b.nvml.facts["gpus"][0]["mig_instances"] == []


def test_gpu_without_mig_is_unsupported(tmp_path, h200_facts):
    h200_facts["gpus"][0]["mig"] = None
    r = by_key(engine(None, mig_profile(layout={"1g.18gb": 1}), tmp_path, facts=h200_facts).verify())
    assert r[("gpu0", "mig_mode")].status == "unsupported" and "has no MIG" in r[("gpu0", "mig_mode")].reason


@pytest.mark.parametrize("body, msg", [
    ("    - devices: all\n      mig-enabled: true\n    - devices: [0]\n      mig-enabled: false\n", "overlap"),
    ("    - devices: [0]\n      mig-enabled: true\n    - devices: [0]\n      mig-enabled: true\n", "already in"),
    ("    - devices: all\n      mig-enabled: false\n      mig-devices: {\"1g.5gb\": 1}\n", "needs mig-enabled"),
    ("    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1c.2g.10gb\": 1}\n", "compute-instance"),
    ("    - devices: all\n      mig-enabled: true\n      mig-devices: {\"../x\": 1}\n", "MIG profile name"),
    ("    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.5gb\": 9}\n", "1-8"),
])
def test_bad_layouts_name_file_line_and_key(body, msg):
    with pytest.raises(ProfileError) as e:
        profile("gpu:\n  mig:\n" + body)
    assert msg in str(e.value) and str(e.value).startswith("test.yaml:") and "gpu.mig" in str(e.value)


def test_bad_layout_through_the_cli_is_one_line(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("gpu:\n  mig:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"7g\": 1}\n")
    r = subprocess.run([sys.executable, "-m", "hkgpu_tune", "plan", "--only", "mig", "--profile", str(p)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{p}:5: gpu.mig[0].mig-devices.7g" in r.stderr


def test_saved_entry_checks():
    good = Change("mig", "gpu0", "mig_devices", {"2g.12gb": 2}, {"1g.6gb": 4}, {"index": 0, "uuid": "GPU-x"})
    assert validate(good) == "mig.layout"
    for bad in (Change("mig", "gpu0", "mig_devices", {"../../x": 1}, {}, {"index": 0}),
                Change("mig", "gpu0", "mig_devices", {"1g.6gb": 99}, {}, {"index": 0}),
                Change("mig", "gpu0", "mig_mode", "yes", True, {"index": 0}),
                Change("mig", "eth0", "mig_mode", False, True, {"index": 0})):
        with pytest.raises(ValueError):
            validate(bad)
