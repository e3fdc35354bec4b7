"""The cpufreq subsystem (the worked example of docs/architecture.md) against a sysfs tree on disk:
the same files /sys/devices/system/cpu/cpuN/cpufreq holds, read back here with plain open(), not
with the tool. This machine's kernel has no cpufreq (a VM), which is the `unsupported` case."""
import os

import pytest

from hkgpu_tune.backends.procfs import SysFs
from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.core.report import Change
from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.tune.settings import validate

from .fakes import backends


def sysfs(tmp_path, cpus="0-1", governors=None, available="performance powersave schedutil"):
    root = tmp_path / "sys-root"
    cpu = root / "sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text(cpus + "\n")
    for n, gov in (governors or {}).items():
        d = cpu / f"cpu{n}" / "cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text(gov + "\n")
        (d / "scaling_available_governors").write_text(available + "\n")
    return root


def governor(root, n):
    with open(os.path.join(root, f"sys/devices/system/cpu/cpu{n}/cpufreq/scaling_governor")) as f:
        return f.read().strip()


def engine(tmp_path, root, text="cpufreq:\n  governor: performance\n"):
    return Engine(parse_profile_text(text, "t.yaml"), only=["cpufreq"], state_dir=str(tmp_path / "st"),
                  backends=backends(sysfs=SysFs(root=str(root))))


def test_plan_apply_verify_rollback(tmp_path):
    root = sysfs(tmp_path, governors={0: "powersave", 1: "performance"})
    eng = engine(tmp_path, root)
    changes, _ = eng.plan()
    assert [(c.target, c.current, c.desired) for c in changes] == [("cpu0", "powersave", "performance")]
    rep = eng.apply()
    assert not rep.error and governor(root, 0) == "performance" and governor(root, 1) == "performance"
    assert {r.status for r in eng.verify()} == {"ok"}
    _, errs = eng.rollback()
    assert not errs and governor(root, 0) == "powersave" and governor(root, 1) == "performance"


def test_no_cpufreq_is_unsupported_with_the_reason(tmp_path):
    (r,) = engine(tmp_path, sysfs(tmp_path)).verify()
    assert (r.subsystem, r.status, r.failed) == ("cpufreq", "unsupported", True)
    assert "the kernel has no cpufreq" in r.reason
    (r,) = engine(tmp_path, sysfs(tmp_path / "b"), "cpufreq: {governor: performance, optional: true}\n").verify()
    assert r.status == "unsupported" and not r.failed


def test_a_governor_the_driver_lacks_is_unsupported_not_drift(tmp_path):
    root = sysfs(tmp_path, governors={0: "powersave"}, available="powersave performance")
    (r,) = engine(tmp_path, root, "cpufreq: {governor: schedutil}\n").verify()
    assert r.status == "unsupported" and "offers powersave, performance" in r.reason
    changes, _ = engine(tmp_path, root, "cpufreq: {governor: schedutil}\n").plan()
    assert changes == [] and governor(root, 0) == "powersave"


def test_an_offline_cpu_is_not_touched(tmp_path):
    root = sysfs(tmp_path, cpus="0", governors={0: "powersave", 1: "powersave"})
    assert not engine(tmp_path, root).apply().error
    assert governor(root, 0) == "performance" and governor(root, 1) == "powersave"


@pytest.mark.parametrize("body, msg", [("governor: turbo", "expected one of"),
                                       ("optional: true", "governor"),
                                       ("governor: performance\n  speed: 3", "speed")])
def test_bad_input_names_the_line_and_key(body, msg):
    with pytest.raises(ProfileError) as e:
        parse_profile_text(f"cpufreq:\n  {body}\n", "t.yaml")
    assert str(e.value).startswith("t.yaml:") and msg in str(e.value)


def test_saved_entries_are_checked():
    assert validate(Change("cpufreq", "cpu3", "governor", "powersave", "performance")) == "cpufreq.governor"
    for bad in (Change("cpufreq", "cpu3/../../x", "governor", "powersave", "performance"),
                Change("cpufreq", "cpu3", "governor", "powersave\nx", "performance"),
                Change("cpufreq", "cpu3", "max_freq", "1", "2")):
        with pytest.raises(ValueError):
            validate(bad)
