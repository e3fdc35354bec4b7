"""MIG devices named by position (mig:GPU/SLOT), not by UUID: the boot unit re-creates a mig-parted
layout after a reboot and every device gets a new UUID (as on a real GPU; the replayed A30 of
tests/fixtures/gpu does the same), but the same slot. A profile naming positions stays right with
no edit: verify and health find the devices, a service's CUDA_VISIBLE_DEVICES and its unit's
start resolve the new UUIDs. A UUID is still accepted (and is drift once the layout is made again).
Positions the profile's own gpu.mig cannot have are refused at their line."""
import hashlib
import json
import os
import shlex
import subprocess
import sys

import pytest

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.serve.running import forms
from hkgpu_tune.serve.schema.config import section
from hkgpu_tune.serve.schema.devices import ENV_DIR, resolve
from hkgpu_tune.tune.engine import Engine

from .conftest import backends, by_key, load

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OLD = {0: "MIG-a30a30a3-0000-5000-8000-000000000301", 1: "MIG-a30a30a3-0000-5000-8000-000000000401"}
LAYOUT = '''gpu:
  pcie_check: false
  mig:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"2g.12gb": 2}
'''


def triton_profile(tmp_path, gpu, extra=LAYOUT, name="node.yaml"):
    import yaml
    from tests.triton.conftest import dump, profile_dict
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    doc["triton"].update(unit="triton-mig", gpu=yaml.safe_load(gpu) if gpu.startswith("[") else gpu)
    f = tmp_path / name
    f.write_text(extra + dump(doc))
    return f


def parse(f):
    return parse_profile_text(f.read_text(), str(f))


def a30():
    return backends(load("mig-a30.json")["gpu"])


def reboot(b):
    """A reboot: the GPU keeps MIG mode, its GPU and compute instances are gone."""
    b.nvml.facts["gpus"][0]["mig_instances"] = []


def boot_unit(prof, b, tmp_path):
    """What the boot unit runs for MIG (apply --only mig): the layout made again."""
    rep = Engine(prof, only=["mig"], state_dir=str(tmp_path / "state"), backends=b).apply()
    assert not rep.error, rep.error


def mig_rows(prof, b, tmp_path):
    res = Engine(prof, only=["mig", "triton"], state_dir=str(tmp_path / "state"), backends=b).verify()
    return {k: r for k, r in by_key(res).items() if k[1] in ("mig_device", "mig_mode", "mig_devices")}


def uuids(b):
    return [ci["uuid"] for gi in b.nvml.facts["gpus"][0]["mig_instances"] for ci in gi["compute"]]


def test_a_position_survives_the_layout_made_again(tmp_path):
    f = triton_profile(tmp_path, "mig:0/1")
    before = hashlib.sha256(f.read_bytes()).hexdigest()
    prof, b = parse(f), a30()
    t = section(prof)
    assert t.mig == "mig:0/1" and t.gpu is None
    # slot 1: the second GPU instance by placement (start 2), MIG-...0401
    rows = mig_rows(prof, b, tmp_path)
    r = rows[("mig:0/1", "mig_device")]
    assert (r.status, r.current) == ("ok", "2g.12gb on GPU 0") and OLD[1] in r.reason
    assert forms.server_env(t, b)["CUDA_VISIBLE_DEVICES"] == OLD[1]

    reboot(b)
    r = mig_rows(prof, b, tmp_path)[("mig:0/1", "mig_device")]
    assert (r.status, r.current) == ("drift", "absent") and "no MIG device in slot 1" in r.reason
    with pytest.raises(HkError, match=r"node.yaml:\d+: triton.gpu: mig:0/1: GPU 0 has no MIG device in slot 1"):
        forms.server_env(t, b)

    boot_unit(prof, b, tmp_path)
    new = uuids(b)
    assert len(new) == 2 and not set(new) & set(OLD.values())          # new UUIDs, as on a real GPU
    rows = mig_rows(prof, b, tmp_path)
    assert {k: r.status for k, r in rows.items()} == {("gpu0", "mig_mode"): "ok", ("gpu0", "mig_devices"): "ok",
                                                      ("mig:0/1", "mig_device"): "ok"}
    assert new[1] in rows[("mig:0/1", "mig_device")].reason
    assert forms.server_env(t, b)["CUDA_VISIBLE_DEVICES"] == new[1]
    assert resolve(b.nvml, "mig:0/0") == new[0]
    # health reads the same way
    from hkgpu_tune.observe import health
    rep = health.check(prof, nvml=b.nvml, kmsg_events=[])
    assert [(c.target, c.status) for c in rep.checks if c.name == "mig_device"] == [("mig:0/1", "ok")]
    assert hashlib.sha256(f.read_bytes()).hexdigest() == before        # no profile edited


def test_a_uuid_is_still_accepted_and_is_drift_once_made_again(tmp_path):
    prof, b = parse(triton_profile(tmp_path, OLD[0])), a30()
    assert mig_rows(prof, b, tmp_path)[(OLD[0], "mig_device")].status == "ok"
    assert forms.server_env(section(prof), b)["CUDA_VISIBLE_DEVICES"] == OLD[0]
    reboot(b)
    boot_unit(prof, b, tmp_path)
    r = mig_rows(prof, b, tmp_path)[(OLD[0], "mig_device")]
    assert r.status == "drift" and "name it by position, mig:GPU/SLOT" in r.reason
    # by the parent's UUID and slot
    gpu_uuid = b.nvml.facts["gpus"][0]["uuid"]
    prof = parse(triton_profile(tmp_path, f"mig:{gpu_uuid}/0", name="byuuid.yaml"))
    r = mig_rows(prof, b, tmp_path)[(f"mig:{gpu_uuid}/0", "mig_device")]
    assert r.status == "ok" and uuids(b)[0] in r.reason


def test_the_unit_resolves_the_position_when_it_starts(tmp_path):
    """The unit names the position, not a UUID: it is the same before and after the layout is made
    again (no drift, no restart), and its ExecStartPre, run as systemd would, writes the UUID of the
    moment to the file ExecStart reads."""
    prof, b = parse(triton_profile(tmp_path, "mig:0/1")), a30()
    t = section(prof)
    place = {"cpus": [0], "mems": [0], "numa_node": 0, "source": "test"}
    unit = forms.render_unit(t, place)
    lines = unit.splitlines()
    assert not any(x.startswith("Environment=") and "CUDA_VISIBLE_DEVICES" in x for x in lines), unit
    assert "hkgpu-tune.service" in next(x for x in lines if x.startswith("After="))
    env_file = f"{ENV_DIR}/mig-triton-mig.env"
    assert f"EnvironmentFile=-{env_file}" in lines
    (pre,) = [x for x in lines if x.startswith("ExecStartPre=+")]
    argv = shlex.split(pre[len("ExecStartPre=+"):])
    assert argv[-3:] == ["mig-env", "mig:0/1", env_file]
    reboot(b)
    boot_unit(prof, b, tmp_path)
    assert forms.render_unit(t, place) == unit
    # container form: --gpus from the same file
    cprof = parse(triton_profile(tmp_path, "mig:0/1", extra=LAYOUT, name="c.yaml"))
    ct = section(cprof)
    from dataclasses import replace
    ct = replace(ct, launch="container", image="tritonserver:24.08-py3")
    cunit = forms.render_unit(ct, place)
    assert "--gpus device=${CUDA_VISIBLE_DEVICES}" in cunit and f"EnvironmentFile=-{env_file}" in cunit

    if os.geteuid() != 0:
        pytest.skip("writing under /run/hkgpu-tune needs root")
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"gpu": b.nvml.facts}))
    out = f"{ENV_DIR}/mig-hkgpu-test-{os.getpid()}.env"
    env = {**os.environ, "HKGPU_TUNE_NVML_REPLAY": str(facts), "PYTHONPATH": REPO}
    try:
        p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "mig-env", "mig:0/1", out],
                           capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 0, p.stderr
        with open(out) as fh:
            assert fh.read() == f"CUDA_VISIBLE_DEVICES={uuids(b)[1]}\n"
        p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "mig-env", "mig:0/2", out],
                           capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 1 and "Traceback" not in p.stderr and "no MIG device in slot 2" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    finally:
        if os.path.exists(out):
            os.unlink(out)


@pytest.mark.parametrize("gpu, extra, msg", [
    ("mig:1/0", LAYOUT, "mig:1/0: GPU 1 has no entry in gpu.mig"),
    ("mig:0/2", LAYOUT, "mig:0/2: slot 2 is beyond GPU 0's layout in gpu.mig (line 4: 2 MIG devices, slots 0-1)"),
    ("mig:0/0", "gpu:\n  pcie_check: false\n  mig:\n    - devices: all\n      mig-enabled: false\n",
     "mig:0/0: MIG is off on GPU 0"),
    ("mig:0/x", LAYOUT, "expected a MIG device by position, mig:GPU/SLOT"),
    ("mig:64/0", LAYOUT, "expected a MIG device by position, mig:GPU/SLOT"),
    ("[mig:0/0, mig:0/1]", LAYOUT, "a MIG device is named alone"),
])
def test_a_bad_position_is_refused_at_its_line(tmp_path, gpu, extra, msg):
    f = triton_profile(tmp_path, gpu, extra=extra)
    with pytest.raises(HkError) as e:
        parse(f)
    lines = f.read_text().splitlines()
    line = next(i for i, x in enumerate(lines, 1) if x.startswith("  gpu:"))
    if gpu.startswith("["):    # the list's first item
        line += 1
    assert f"{f}:{line}: triton.gpu" in str(e.value) and msg in str(e.value), str(e.value)
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "triton", "command", "-p", str(f)],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=60)
    assert p.returncode == 1 and "Traceback" not in p.stderr and msg in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_mps_names_its_mig_device_by_position(tmp_path):
    from hkgpu_tune.subsystems.mps import Plugin, render_unit
    text = LAYOUT + f"mps:\n  enabled: true\n  pipe_dir: {tmp_path}/pipe\n  log_dir: {tmp_path}/log\n  gpus: [mig:0/0]\n"
    prof = parse_profile_text(text, "mps.yaml")
    b = a30()
    plug = Plugin(prof, b)
    assert plug._served() == (OLD[0],)
    unit = render_unit(plug.cfg, "/usr/bin/nvidia-cuda-mps-control", plug.cfg.gpus)
    assert "CUDA_VISIBLE_DEVICES" not in "".join(x for x in unit.splitlines() if x.startswith("Environment="))
    assert "mig-env mig:0/0 /run/hkgpu-tune/mig-nvidia-mps.env" in unit
    reboot(b)
    boot_unit(prof, b, tmp_path)
    assert plug._served() == (uuids(b)[0],)
    with pytest.raises(HkError, match=r"mps.yaml:\d+: mps.gpus\[0\]: mig:0/2: slot 2 is beyond"):
        parse_profile_text(text.replace("mig:0/0", "mig:0/2"), "mps.yaml")
