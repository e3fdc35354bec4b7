"""mps subsystem against a fake control daemon: down -> started with settings -> quit on rollback."""
import json
import os
import pwd

import pytest

from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.subsystems.mps import Plugin, render_unit, to_bytes

from .conftest import FakeMps, FakeSystemd, backends, by_key, profile

USER = pwd.getpwuid(os.getuid()).pw_name


def text(tmp_path, enabled=True):
    return (f"mps:\n  enabled: {str(enabled).lower()}\n  pipe_dir: {tmp_path}/pipe\n  log_dir: {tmp_path}/log\n"
            f"  gpus: [0]\n  default_active_thread_percentage: 50\n  default_pinned_mem_limit: '0=16G'\n  user: {USER}\n")


def engine(tmp_path, facts, mps, systemd=None, enabled=True):
    return Engine(profile(text(tmp_path, enabled)), only=["mps"], state_dir=str(tmp_path / "state"),
                  backends=backends(facts, mps=mps, systemd=systemd))


def test_mps_down_is_drift_then_started_configured_and_quit(tmp_path, h200_facts):
    mps = FakeMps(running=False)
    eng = engine(tmp_path, h200_facts, mps)
    res = by_key(eng.verify())
    assert res[("mps", "daemon")].status == "drift" and res[("mps", "daemon")].current == "stopped"
    assert res[("mps", "unit")].status == "unsupported" and not res[("mps", "unit")].required   # no systemd
    assert res[("gpu0", "compute_mode")].status == "ok"
    rep = eng.apply()
    assert not rep.error, rep.error
    assert mps.starts == [(f"{tmp_path}/pipe", f"{tmp_path}/log", (0,), USER)]
    assert "set_default_active_thread_percentage 50" in mps.sent
    assert "set_default_device_pinned_mem_limit 0 16G" in mps.sent
    assert oct(os.stat(tmp_path / "pipe").st_mode & 0o777) == "0o755"
    assert oct(os.stat(tmp_path / "log").st_mode & 0o777) == "0o750"
    after = by_key(rep.results)
    assert {r.status for r in after.values()} - {"unsupported"} == {"ok"}
    assert after[("mps", "default_active_thread_percentage")].current == 50.0
    restored, errs = eng.rollback()
    assert not errs and not mps.running


def test_settings_drift_on_a_running_daemon(tmp_path, dgx):
    mps = FakeMps(running=True, pct=100.0)
    mps.limits[0] = "8G"
    eng = engine(tmp_path, dgx["gpu"], mps)
    changes, res = eng.plan()
    keys = {c.key: c for c in changes}
    assert keys["default_active_thread_percentage"].current == 100.0
    assert keys["default_pinned_mem_limit"].current == "8G"
    assert "daemon" not in keys


def test_compute_mode_prohibited_blocks_mps(tmp_path, h200_facts):
    h200_facts["gpus"][0]["compute_mode"] = "prohibited"
    r = by_key(engine(tmp_path, h200_facts, FakeMps(running=True)).verify())[("gpu0", "compute_mode")]
    assert r.status == "drift" and r.write is None and "prohibited" in r.reason


def test_disabled_but_running_is_stopped(tmp_path, h200_facts):
    mps = FakeMps(running=True)
    eng = engine(tmp_path, h200_facts, mps, enabled=False)
    changes, _ = eng.plan()
    assert [(c.key, c.desired) for c in changes] == [("daemon", "stopped")]
    eng.apply()
    assert not mps.running


def test_systemd_host_gets_the_rendered_unit(tmp_path, h200_facts):
    sd, mps = FakeSystemd(available=True), FakeMps(running=False)

    def enable(unit, now=True):   # the unit's ExecStart starts the daemon
        sd.calls.append(("enable", unit))
        mps.running = True
    sd.enable = enable
    eng = engine(tmp_path, h200_facts, mps, systemd=sd)
    rep = eng.apply()
    assert not rep.error
    unit = sd.units["nvidia-mps.service"]
    assert ("daemon-reload",) in sd.calls and ("enable", "nvidia-mps.service") in sd.calls
    assert mps.starts == []                       # systemd started it, not the library
    assert f"Environment=CUDA_MPS_PIPE_DIRECTORY={tmp_path}/pipe" in unit
    assert by_key(rep.results)[("mps", "unit")].status == "ok"
    eng.rollback()
    assert "nvidia-mps.service" not in sd.units


def test_render_unit():
    cfg = profile("mps:\n  gpus: [0, 1]\n  default_active_thread_percentage: 25\n"
                  "  default_pinned_mem_limit: '0=16G,1=8G'\n  user: mps\n").section("mps")
    u = render_unit(cfg, "/usr/bin/nvidia-cuda-mps-control", cfg.gpus)
    assert "Type=forking" in u and "User=mps" in u
    assert "Environment=CUDA_VISIBLE_DEVICES=0,1" in u and "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID" in u
    # systemd makes the service's own directories; nothing is chowned by a command line
    assert "RuntimeDirectory=nvidia-mps\nRuntimeDirectoryMode=0755" in u
    assert "LogsDirectory=nvidia-mps\nLogsDirectoryMode=0750" in u and "install -d" not in u
    tmp = profile("mps:\n  pipe_dir: /tmp/mps/pipe\n  log_dir: /tmp/mps/log\n").section("mps")
    assert "ExecStartPre=/bin/sh -c 'test -d /tmp/mps/pipe && test ! -L /tmp/mps/pipe'" in render_unit(tmp)
    assert "ExecStart=/usr/bin/nvidia-cuda-mps-control -d" in u
    assert "ExecStartPost=/bin/sh -c 'echo set_default_active_thread_percentage 25 | /usr/bin/nvidia-cuda-mps-control'" in u
    assert "ExecStartPost=/bin/sh -c 'echo set_default_device_pinned_mem_limit 1 8G | /usr/bin/nvidia-cuda-mps-control'" in u
    assert "ExecStop=/bin/sh -c 'echo quit | /usr/bin/nvidia-cuda-mps-control'" in u


def test_sizes():
    assert to_bytes("16G") == to_bytes("16384M") == 16 << 30
    assert to_bytes("nonsense") is None


def test_no_mps_binary_unsupported(tmp_path):
    res = engine(tmp_path, None, FakeMps(binary=None)).verify()
    assert [(r.key, r.status) for r in res] == [("daemon", "unsupported")]
    assert "nvidia-cuda-mps-control not found" in res[0].reason


def test_library_start_stop_health(tmp_path, h200_facts):
    mps = FakeMps()
    plug = Plugin(profile(text(tmp_path)), backends(h200_facts, mps=mps))
    h = plug.start()
    assert h["alive"] and h["default_active_thread_percentage"] == 50.0
    plug.stop()
    assert not plug.health()["alive"]


def test_mps_profile_errors():
    from hkgpu_tune.core.errors import ProfileError
    with pytest.raises(ProfileError, match="test.yaml:3: mps.default_pinned_mem_limit: expected device=size"):
        profile("mps:\n  enabled: true\n  default_pinned_mem_limit: 16G\n")
    with pytest.raises(ProfileError, match="mps.pipe_dir: expected an absolute directory path"):
        profile("mps:\n  pipe_dir: relative/dir\n")
    with pytest.raises(ProfileError, match="test.yaml:2: mps.pipe_dir: '/etc/mps' is not under one of /run"):
        profile("mps:\n  pipe_dir: /etc/mps\n")
    with pytest.raises(ProfileError, match="mps.log_dir: pipe_dir /run/m and log_dir /run/m/log must be separate"):
        profile("mps:\n  pipe_dir: /run/m\n  log_dir: /run/m/log\n")
    with pytest.raises(ProfileError, match="test.yaml:3: mps.default_pinned_mem_limit: device 1 is not one of the 1"):
        profile("mps:\n  gpus: [3]\n  default_pinned_mem_limit: '0=8G,1=8G'\n")
    with pytest.raises(ProfileError, match="mps.default_active_thread_percentage: expected an integer 1-100"):
        profile("mps:\n  default_active_thread_percentage: 150\n")


def test_cli_mps_and_placement_without_driver(tmp_path):
    """`hkgpu-tune mps` and `placement` on a host without the NVIDIA driver: one line, no traceback."""
    import subprocess
    import sys
    from hkgpu_tune.backends.mps import MpsControl
    if MpsControl().binary():
        pytest.skip("nvidia-cuda-mps-control is installed here")
    p = tmp_path / "p.yaml"
    p.write_text(text(tmp_path))
    run = [sys.executable, "-m", "hkgpu_tune"]
    st = subprocess.run(run + ["mps", "status", "-p", str(p)], capture_output=True, text=True)
    words = " ".join(st.stdout.split())   # lines wrap where COLUMNS is set
    assert st.returncode == 2 and words.startswith(f"mps status: profile {p} (--profile) mps stopped")
    start = subprocess.run(run + ["mps", "start", "-p", str(p)], capture_output=True, text=True)
    assert start.returncode == 1 and "Traceback" not in start.stderr
    assert "nvidia-cuda-mps-control not found" in start.stderr and not (tmp_path / "pipe").exists()
    pl = subprocess.run(run + ["placement", "--gpu", "0", "--json"], capture_output=True, text=True)
    assert pl.returncode == 0 and json.loads(pl.stdout)["mems"] == []
