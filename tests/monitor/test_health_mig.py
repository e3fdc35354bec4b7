"""health: each MIG device the profile names still exists (a MIG layout lost at a GPU reset or a
reboot is the classic field failure), against the recorded A30 (MIG on, 2 x 2g.12gb), with a 0/1
gauge per device that promtool accepts."""
import json
import os
import shutil
import subprocess

import pytest

from hkgpu_tune.backends.nvml import ReplayNvml
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.observe import collect, health

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "gpu")
MIG_A = "MIG-a30a30a3-0000-5000-8000-000000000301"


def a30():
    with open(os.path.join(FIX, "mig-a30.json")) as f:
        return json.load(f)["gpu"]


def prof(uuid=MIG_A):
    return parse_profile_text(f"mps:\n  gpus: [{uuid}]\nhealth: {{xids: []}}\n", "p.yaml")


def mig_checks(rep):
    return [(c.target, c.status, c.value) for c in rep.checks if c.name == "mig_device"]


def test_a_named_mig_device_present_is_healthy():
    r = health.check(prof(), nvml=ReplayNvml(a30()))
    assert mig_checks(r) == [(MIG_A, "ok", "2g.12gb on GPU 0")] and r.status == "healthy"


def test_a_mig_layout_lost_at_reboot_is_degraded_and_exported_as_0():
    doc = a30()
    doc["gpus"][0]["mig"] = {"current": False, "pending": False}     # after a reboot: MIG off, no devices
    doc["gpus"][0]["mig_instances"] = []
    r = health.check(prof(), nvml=ReplayNvml(doc))
    assert mig_checks(r) == [(MIG_A, "failing", "absent")] and r.status == "degraded"
    assert r.failing_names() == [f"mig_device:{MIG_A}"] and "GPU reset or reboot" in r.failing[0].reason
    fams = health.to_families(r)
    assert [f.name for f in fams][-1] == "hkgpu_tune_mig_device_present"
    text = "\n".join(collect.render(fams)) + "\n"
    assert f'hkgpu_tune_mig_device_present{{uuid="{MIG_A}"}} 0\n' in text
    assert 'hkgpu_tune_health_check{check="mig_device"} 1\n' in text
    ok = "\n".join(collect.render(health.to_families(health.check(prof(), nvml=ReplayNvml(a30()))))) + "\n"
    assert f'hkgpu_tune_mig_device_present{{uuid="{MIG_A}"}} 1\n' in ok


@pytest.mark.skipif(not shutil.which("promtool"), reason="needs promtool (Debian's prometheus)")
def test_promtool_accepts_the_mig_gauge():
    r = health.check(prof(), nvml=ReplayNvml(a30()))
    text = "\n".join(collect.render(health.to_families(r))) + "\n"
    out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout + out.stderr == "", out.stdout + out.stderr


def test_nvml_unreadable_is_an_error_not_ok_and_no_mig_named_adds_nothing():
    r = health.check(prof(), nvml=ReplayNvml.missing("NVML library not found"))
    [(target, status, _)] = mig_checks(r)
    assert (target, status) == (MIG_A, "error") and r.status == "error"
    r = health.check(parse_profile_text("mps:\n  gpus: [0]\nhealth: {xids: []}\n", "p.yaml"), nvml=ReplayNvml(a30()))
    assert mig_checks(r) == [] and [f.name for f in health.to_families(r)][-1] == "hkgpu_tune_health_check"
