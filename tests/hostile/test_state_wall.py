"""The typed state checks are a second wall: whatever a state file says, root writes back only what
the tool itself renders or what a profile section can name. A sysctl that runs a program or guards
the kernel, a unit with directives the renderer never writes (ExecStartPre=, Environment=LD_PRELOAD=),
a container command with options it never writes (--privileged -v /:/host), an MPS unit that is not
the tool's own rendering: the whole state file is refused before anything is written."""
import json
import os
import subprocess
import sys

import pytest

from hkgpu_tune.core.errors import HkError, ProfileError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.core.report import Change
from hkgpu_tune.serve.schema import shapes
from hkgpu_tune.serve.running import forms, records
from hkgpu_tune.subsystems.mps import MpsProfile, render_unit
from hkgpu_tune.tune import settings

from ..triton.conftest import dump, profile_dict
from ..gpu_unit.conftest import h200_facts  # noqa: F401  (a fixture: recorded H200 facts)
from .test_state_trust import entry, run_rollback

PLACE = {"cpus": [0, 1, 2, 3], "mems": [0], "numa_node": 0, "source": "test"}


# ---------------------------------------------------------------- sysctl
@pytest.mark.parametrize("key", ["kernel.core_pattern", "kernel.modprobe", "fs.binfmt_misc.register",
                                 "kernel.yama.ptrace_scope", "kernel.usermodehelper.bset",
                                 "dev.tty.ldisc_autoload", "fs.suid_dumpable"])
def test_a_state_file_naming_a_sysctl_no_profile_may_name_is_refused(tmp_path, key):
    doc = {"format": 2, "entries": [entry(), entry(key=key, original="|/tmp/x %p")]}
    msg = run_rollback(tmp_path, doc=doc)
    assert key in msg and "entries[1]" in msg, msg


@pytest.mark.parametrize("key", ["kernel.core_pattern", "kernel.modprobe"])
def test_a_profile_naming_such_a_sysctl_is_refused_with_its_line(key):
    with pytest.raises(ProfileError, match=rf"p.yaml:3.*{key}.*never writes it"):
        parse_profile_text(f"name: x\nsysctl:\n  {key}: '|/tmp/x'\n", "p.yaml")


def test_the_sysctls_the_tool_tunes_stay_allowed():
    for key in ("net.core.rmem_max", "net.ipv4.tcp_rmem", "vm.swappiness", "kernel.numa_balancing", "fs.file-max"):
        settings.from_entry(entry(key=key))


@pytest.mark.root
def test_rollback_of_a_core_pattern_entry_leaves_the_kernel_alone(tmp_path):
    """Through the real CLI: the kernel's core_pattern is read before and after with cat."""
    before = open("/proc/sys/kernel/core_pattern").read()
    d = tmp_path / "st"
    d.mkdir(mode=0o700)
    (d / "state.json").write_text(json.dumps({"format": 2, "entries": [
        entry(key="kernel.core_pattern", original=f"|{tmp_path}/pwn %p", desired="core")]}))
    os.chmod(d / "state.json", 0o600)
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "rollback", "--state-dir", str(d)],
                       capture_output=True, text=True, timeout=60)
    assert subprocess.run(["cat", "/proc/sys/kernel/core_pattern"], capture_output=True,
                          text=True).stdout == before
    assert p.returncode == 1 and "Traceback" not in p.stderr and "kernel.core_pattern" in p.stderr, p.stderr


# ---------------------------------------------------------------- Triton unit and container command
def section(tmp_path, **top):
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    doc["triton"].update(top)
    if top.pop("with_mps", False) or "mps" in doc:
        pass
    return parse_profile_text(dump(doc), str(tmp_path / "p.yaml")).section("triton")


def each_form(tmp_path):
    """The rendered units of both forms, with and without MPS, GPUs and a user."""
    out = []
    for top in ({}, {"user": "triton-server", "supervisor": "systemd"},
                {"launch": "container", "image": "tritonserver:24.08-py3", "gpu": 0, "runtime": "podman"},
                {"launch": "container", "image": "nvcr.io/nvidia/tritonserver:24.08-py3", "gpu": [2, 3]}):
        doc = profile_dict(tmp_path, (18000, 18001, 18002))
        doc["triton"].update({k: v for k, v in top.items()})
        doc["mps"] = {"pipe_dir": f"/tmp/hkwall/pipe", "log_dir": "/tmp/hkwall/log"}
        for with_mps in (False, True):
            d = dict(doc) if with_mps else {k: v for k, v in doc.items() if k != "mps"}
            t = parse_profile_text(dump(d), str(tmp_path / "p.yaml")).section("triton")
            out.append(t)
    return out


def unit_entry(before):
    return settings.to_entry(Change("triton", "hkgpu-triton.service", "unit", "differs", "as rendered",
                                    {"before": None, "service": {"supervisor": "systemd"}})) | {
        "data": {"before": before, "service": {"supervisor": "systemd"}}}


def test_every_unit_the_tool_renders_passes_the_wall(tmp_path):
    for t in each_form(tmp_path):
        text = forms.render_unit(t, PLACE)
        shapes.check_unit_text(text)
        settings.from_entry(unit_entry(text))
        if t.launch == "container":
            argv = forms.container_argv(t, PLACE)
            shapes.check_container_argv(["/usr/bin/" + argv[0], *argv[1:]])


@pytest.mark.parametrize("edit,why", [
    (lambda u: u.replace("[Service]\n", "[Service]\nExecStartPre=/bin/sh -c 'id > /tmp/pwned'\n"), "ExecStartPre"),
    (lambda u: u.replace("[Service]\n", "[Service]\nEnvironment=LD_PRELOAD=/tmp/evil.so\n"), "LD_PRELOAD"),
    (lambda u: u.replace("[Service]\n", "[Service]\nEnvironmentFile=/tmp/env\n"), "EnvironmentFile"),
    (lambda u: u.replace("NoNewPrivileges=yes\n", ""), "hardening"),
    (lambda u: u.replace("ExecStart=", "ExecStart=+"), "prefix"),
    (lambda u: u.replace("\n[Install]", "\nExecStartPost=/bin/true\n[Install]"), "ExecStartPost"),
    (lambda u: u.replace("--exit-on-error=true", "--exit-on-error=true ; /bin/sh"), "tritonserver option"),
])
def test_a_saved_binary_unit_with_what_the_renderer_never_writes_is_refused(tmp_path, edit, why):
    t = section(tmp_path, user="triton-server", supervisor="systemd")
    good = forms.render_unit(t, PLACE)
    bad = edit(good)
    assert bad != good
    with pytest.raises(ValueError, match=why):
        settings.from_entry(unit_entry(bad))


@pytest.mark.parametrize("edit,why", [
    (lambda a: a[:2] + ["--privileged"] + a[2:], "--privileged"),
    (lambda a: a[:-1] + ["-v", "/:/host"] + a[-1:], "-v"),
    (lambda a: [x if x != "--rm" else "--rm" for x in a[:2]] + ["--rm", "--name", "x", "--cap-add=ALL"] + a[5:],
     "--cap-add"),
    (lambda a: [a[0].replace("podman", "sh"), "run"] + a[2:], "not a Triton server"),
    (lambda a: [x.replace(":/models:ro", ":/models") for x in a], "--volume"),
    (lambda a: [("/:/models:ro" if x.endswith(":/models:ro") else x) for x in a], "model repository"),
])
def test_a_saved_container_command_with_options_the_renderer_never_writes_is_refused(tmp_path, edit, why):
    t = section(tmp_path, launch="container", image="tritonserver:24.08-py3", gpu=0, runtime="podman")
    argv = forms.container_argv(t, PLACE)
    argv[0] = "/usr/bin/podman"
    rec = {"argv": argv, "env": {}, "user": None, "launch": "container", "placement": {}}
    records.check_record(rec)
    bad = {**rec, "argv": edit(list(argv))}
    with pytest.raises(HkError, match=why):
        records.check_record(bad)
    good = settings.to_entry(Change("triton", "process 1", "command", "differs", "as rendered",
                                    {"before": rec, "service": {"supervisor": "process"}}))
    with pytest.raises(ValueError, match="triton"):
        settings.from_entry({**good, "data": {**good["data"], "before": bad}})


def test_a_container_unit_with_a_privileged_run_is_refused(tmp_path):
    t = section(tmp_path, launch="container", image="tritonserver:24.08-py3", gpu=0, runtime="podman")
    good = forms.render_unit(t, PLACE)
    shapes.check_unit_text(good)
    with pytest.raises(ValueError, match="--privileged"):
        settings.from_entry(unit_entry(good.replace(" run --rm ", " run --privileged --rm ")))
    stop = next(ln for ln in good.split("\n") if ln.startswith("ExecStop="))
    with pytest.raises(ValueError, match="commands are not the ones"):
        settings.from_entry(unit_entry(good.replace(stop, "ExecStop=/bin/sh -c id")))


# ---------------------------------------------------------------- MPS unit
def mps_entry(old):
    return settings.to_entry(Change("mps", "mps", "unit", "differs", "x", {"unit": "nvidia-mps.service",
                                                                            "old": None})) | {
        "data": {"unit": "nvidia-mps.service", "old": old}}


def test_a_saved_mps_unit_must_be_the_tools_own_rendering():
    cfg = MpsProfile(pipe_dir="/tmp/mps/pipe", log_dir="/tmp/mps/log", default_active_thread_percentage=40,
                     default_pinned_mem_limit=((0, "16G"),), user="root")
    good = render_unit(cfg, "/usr/bin/nvidia-cuda-mps-control", (4, 5))
    settings.from_entry(mps_entry(good))
    for bad in (good.replace("[Service]\n", "[Service]\nExecStartPre=/bin/sh -c id\n"),
                good.replace("User=root\n", "User=root\nEnvironment=LD_PRELOAD=/tmp/x.so\n"),
                good.replace("/usr/bin/nvidia-cuda-mps-control -d", "/tmp/nvidia-cuda-mps-control -d"),
                good.replace("/tmp/mps/pipe", "/etc/mps"),
                "[Service]\nExecStart=/bin/sh -c id\n"):
        with pytest.raises(ValueError, match="data.old"):
            settings.from_entry(mps_entry(bad))
    with pytest.raises(ValueError, match="original"):   # an 'original' that is itself unit text
        settings.from_entry({**mps_entry(None), "original": "[Service]\nExecStart=/x"})


def test_apply_leaves_an_admins_own_mps_unit_alone(tmp_path, h200_facts):
    from ..gpu_unit.conftest import FakeMps, FakeSystemd, backends, by_key, profile
    from ..gpu_unit.test_mps_subsystem import text as mps_text
    facts = h200_facts
    sd = FakeSystemd(available=True)
    own = "[Unit]\nDescription=site MPS\n[Service]\nExecStart=/usr/bin/nvidia-cuda-mps-control -d\n"
    sd.units["nvidia-mps.service"] = own
    from hkgpu_tune.tune.engine import Engine
    eng = Engine(profile(mps_text(tmp_path)), only=["mps"], state_dir=str(tmp_path / "state"),
                 backends=backends(facts, mps=FakeMps(running=False), systemd=sd))
    rep = eng.apply()
    r = by_key(rep.results)[("mps", "unit")]
    assert r.status == "error" and "not one hkgpu-tune rendered" in r.reason, r
    assert sd.units["nvidia-mps.service"] == own
