"""`systemd-analyze verify` on every unit the tool writes: the Triton unit (binary and container
forms), the MPS unit, the boot unit of `apply --persist`, and the units of roles/hkgpu_verify
(every template there, so a timer added later is checked too).

The analyser runs against this host's root: it loads each unit with its dependencies and checks
every directive and that each command it names is executable. The one remark allowed is
"Command X is not executable" for a program this host lacks (a container runtime, NVIDIA's MPS
control daemon): the test names which, and any other remark fails it."""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

import jinja2
import pytest
import yaml

from hkgpu_tune.tune import persist
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.subsystems import mps
from hkgpu_tune.serve.running import forms

from ..helpers import REPO, role_filters
from .conftest import HAVE_PYTRITON, dump, profile_dict

pytestmark = pytest.mark.skipif(not shutil.which("systemd-analyze"),
                                reason="systemd-analyze is not installed (Debian's systemd package)")

PLACE = {"cpus": [0, 1], "mems": [0], "numa_node": 0, "source": "test placement"}
MISSING = re.compile(r"^(?P<unit>\S+): Command (?P<cmd>\S+) is not executable: No such file or directory$")


def hkgpu_exe() -> str:
    """The installed console script (what `apply --persist` and the roles write into units)."""
    exe = shutil.which("hkgpu-tune") or os.path.join(os.path.dirname(sys.executable), "hkgpu-tune")
    assert os.access(exe, os.X_OK), f"no hkgpu-tune console script at {exe} (pip install -e .)"
    return exe


def analyze(tmp_path, units: dict[str, str]) -> tuple[list[str], set[str]]:
    """Write the units into a directory of their own and verify them together: (other remarks,
    commands reported missing that this host indeed lacks)."""
    d = tmp_path / "units"
    d.mkdir(exist_ok=True)
    for name, text in units.items():
        (d / name).write_text(text)
    p = subprocess.run(["systemd-analyze", "verify", "--man=no", "--generators=no",
                        *[str(d / n) for n in units]], capture_output=True, text=True, timeout=120)
    other, missing = [], set()
    for line in (p.stderr + p.stdout).splitlines():
        if not line.strip():
            continue
        mt = MISSING.match(line)
        cmd = mt and mt["cmd"]
        if cmd and not (os.path.isabs(cmd) and os.path.exists(cmd)) and not (not os.path.isabs(cmd) and shutil.which(cmd)):
            missing.add(cmd)
        else:
            other.append(line)
    if p.returncode != 0 and not missing:
        other.append(f"systemd-analyze exited {p.returncode}")
    return other, missing


def triton(tmp_path, mps_dirs=None, **top):
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    doc["triton"].update(top)
    if mps_dirs:
        doc["mps"] = {"pipe_dir": mps_dirs[0], "log_dir": mps_dirs[1]}
    from hkgpu_tune.serve.schema.config import section
    return section(parse_profile_text(dump(doc), str(tmp_path / "p.yaml")))


def test_the_analyser_catches_a_bad_unit(tmp_path):
    """The check can fail: a misspelt directive and a wrong CPU list are reported."""
    bad = forms.render_unit(triton(tmp_path, server=sys.executable), PLACE)
    bad = bad.replace("CPUAffinity=0-1", "CPUAffinity=zero").replace("PrivateTmp=yes", "PrivateTemp=yes")
    other, _ = analyze(tmp_path, {"bad.service": bad})
    assert any("PrivateTemp" in x for x in other) and any("CPU affinity" in x for x in other), other


@pytest.mark.skipif(not HAVE_PYTRITON, reason="needs the nvidia-pytriton wheel (the binary the unit runs)")
def test_triton_binary_unit(tmp_path):
    t = triton(tmp_path, user="triton-server", gpu=0, mps_dirs=("/run/nvidia-mps", "/tmp/mps"))
    assert "BindPaths=/tmp/mps" in forms.render_unit(t, PLACE)   # the MPS lines are in what is checked
    head = forms.render_unit(t, PLACE).split("[Service]")[0]      # started after the MPS daemon
    assert "After=network-online.target nvidia-persistenced.service nvidia-mps.service" in head
    assert "Wants=network-online.target nvidia-mps.service" in head
    other, missing = analyze(tmp_path, {"hkgpu-triton.service": forms.render_unit(t, PLACE)})
    assert (other, missing) == ([], set())


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_triton_container_unit(tmp_path, runtime):
    t = triton(tmp_path, launch="container", image="localhost/tritonserver:test", runtime=runtime, gpu=0,
               unit=f"hkgpu-triton-{runtime}")
    text = forms.render_unit(t, PLACE)
    # the container goes with the service: removed after stop, not left exited (tests/vm saw it)
    assert any(x.startswith("ExecStopPost=-") and x.endswith(f"{runtime} rm --force hkgpu-triton-{runtime}")
               for x in text.splitlines()), text
    other, missing = analyze(tmp_path, {f"hkgpu-triton-{runtime}.service": text})
    assert other == []
    assert missing <= {runtime, f"/usr/bin/{runtime}"}, missing    # only when this host has no such runtime


@pytest.mark.skipif(not HAVE_PYTRITON, reason="needs the nvidia-pytriton wheel (the binary the unit runs)")
@pytest.mark.parametrize("form", ["binary", "container"])
def test_triton_unit_on_a_mig_position(tmp_path, form):
    """A MIG device named by position: ExecStartPre (as root) writes its UUID of the moment to the
    EnvironmentFile that ExecStart reads (the container's --gpus through ${CUDA_VISIBLE_DEVICES})."""
    top = {"launch": "container", "image": "localhost/tritonserver:test", "runtime": "podman"} \
        if form == "container" else {"user": "triton-server"}
    t = triton(tmp_path, gpu="mig:0/1", unit=f"hkgpu-triton-{form}", **top)
    text = forms.render_unit(t, PLACE)
    assert f"EnvironmentFile=-/run/hkgpu-tune/mig-hkgpu-triton-{form}.env" in text.splitlines()
    assert any(x.startswith("ExecStartPre=+") and x.endswith(f"mig-env mig:0/1 /run/hkgpu-tune/mig-hkgpu-triton-{form}.env")
               for x in text.splitlines()), text
    other, missing = analyze(tmp_path, {f"hkgpu-triton-{form}.service": text})
    assert other == []
    assert missing <= {"podman", "/usr/bin/podman"}, missing


def test_mps_unit_on_a_mig_position(tmp_path):
    prof = parse_profile_text("mps:\n  pipe_dir: /run/nvidia-mps\n  log_dir: /var/log/nvidia-mps\n  gpus: [mig:0/0]\n",
                              str(tmp_path / "p.yaml"))
    cfg = prof.section("mps")
    text = mps.render_unit(cfg, gpus=cfg.gpus)
    assert "mig-env mig:0/0 /run/hkgpu-tune/mig-nvidia-mps.env" in text
    other, missing = analyze(tmp_path, {"nvidia-mps.service": text})
    assert other == []
    assert missing <= {f"/usr/bin/{mps.CONTROL}"}, missing


@pytest.mark.parametrize("dirs", [("/run/nvidia-mps", "/var/log/nvidia-mps"), ("/tmp/mps-pipe", "/tmp/mps-log")],
                         ids=["systemd-dirs", "tmp-dirs"])
def test_mps_unit(tmp_path, dirs):
    prof = parse_profile_text(f"mps:\n  pipe_dir: {dirs[0]}\n  log_dir: {dirs[1]}\n"
                              "  default_active_thread_percentage: 50\n  default_pinned_mem_limit: 0=8G,1=8G\n",
                              str(tmp_path / "p.yaml"))
    other, missing = analyze(tmp_path, {"nvidia-mps.service": mps.render_unit(prof.section("mps"), gpus=[0, 1])})
    assert other == []
    assert missing <= {f"/usr/bin/{mps.CONTROL}"}, missing


def test_persist_boot_unit(tmp_path):
    text = persist.boot_unit(hkgpu_exe(), ["link", "ethtool", "qdisc", "gpu", "affinity"],
                             ["ens1f0np0", "bond0.100", "ib-fab0"])
    other, missing = analyze(tmp_path, {persist.UNIT_NAME: text})
    assert (other, missing) == ([], set())
    # waits for the interfaces it tunes (device units, as systemd-escape names them), not udev-settle
    assert "udev-settle" not in text
    want = [persist.device_unit(d) for d in ("ens1f0np0", "bond0.100", "ib-fab0")]
    esc = subprocess.run(["systemd-escape", "--path", "--suffix=device", *[f"/sys/subsystem/net/devices/{d}"
                          for d in ("ens1f0np0", "bond0.100", "ib-fab0")]], capture_output=True, text=True)
    assert esc.stdout.split() == want
    for key in ("Wants", "After"):
        assert any(ln.startswith(f"{key}=") and all(w in ln for w in want) for ln in text.splitlines()), key


def role_vars() -> dict:
    """The variables the verify role's templates see: the defaults of hkgpu and hkgpu_verify, with
    hkgpu_cli pointing at this host's console script."""
    v = {"ansible_managed": "Ansible managed"}
    for role in ("hkgpu", "hkgpu_verify"):
        for f in ("defaults/main.yml",):
            path = os.path.join(REPO, "roles", role, f)
            if os.path.exists(path):
                with open(path) as fh:
                    v.update(yaml.safe_load(fh) or {})
    v["hkgpu_cli"] = hkgpu_exe()
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    for _ in range(5):   # defaults refer to each other ("{{ hkgpu_prefix }}/bin/python")
        v = {k: env.from_string(x).render(v) if isinstance(x, str) and "{{" in x else x for k, x in v.items()}
    return v


def verify_role_units() -> dict[str, str]:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters.update(role_filters())
    v = role_vars()
    out = {}
    for path in sorted(glob.glob(os.path.join(REPO, "roles", "hkgpu_verify", "templates", "*.j2"))):
        name = os.path.basename(path)[:-3]
        if name.rsplit(".", 1)[-1] in ("service", "timer", "path", "socket", "target"):
            with open(path) as f:
                out[name] = env.from_string(f.read()).render(v)
    return out


def test_verify_role_units(tmp_path):
    units = verify_role_units()
    assert {"hkgpu-tune-verify.service", "hkgpu-tune-verify.timer"} <= set(units), sorted(units)
    # a timer is checked with the service it starts (and a service with what it is ordered after)
    units.setdefault(persist.UNIT_NAME, persist.boot_unit(hkgpu_exe(), ["link"]))
    other, missing = analyze(tmp_path, units)
    assert (other, missing) == ([], set()), sorted(units)


def test_verify_service_is_hardened_and_yields(tmp_path):
    """systemd-analyze security of the verify service: better than the 9.6 (UNSAFE) of a bare unit;
    below the inference service for CPU and disk; the rack's timers spread over 30 s."""
    units = verify_role_units()
    svc, timer = units["hkgpu-tune-verify.service"], units["hkgpu-tune-verify.timer"]
    (tmp_path / "hkgpu-tune-verify.service").write_text(svc)
    p = subprocess.run(["systemd-analyze", "security", "--offline=true", str(tmp_path / "hkgpu-tune-verify.service")],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d)", p.stdout + p.stderr)
    assert m, p.stdout + p.stderr
    assert float(m.group(1)) <= 7.0, p.stdout
    lines = svc.splitlines()
    assert "Nice=10" in lines and "IOSchedulingClass=idle" in lines
    assert "RandomizedDelaySec=30s" in timer.splitlines()
    # what it needs stays reachable: /dev/kmsg (kmsg collector), /dev/nvidia* (NVML)
    assert not any(ln.startswith(("ProtectKernelLogs=yes", "DevicePolicy=", "DeviceAllow=", "PrivateDevices="))
                   for ln in lines)
