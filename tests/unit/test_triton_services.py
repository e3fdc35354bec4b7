"""triton.services: several services in one profile. Each item names its unit and overrides keys of
the section; units, ports, run and repository directories are each one service's, or the profile
is refused at the line and key; the firewall, MPS and health readers see every service."""
from __future__ import annotations

import subprocess
import sys

import pytest

from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.serve.schema.config import Services, section, services

MODEL = ("    - {name: doubler, backend: python, model_file: MODEL, max_batch_size: 8,\n"
         "       inputs: [{name: I, data_type: FP32, dims: [4]}], outputs: [{name: O, data_type: FP32, dims: [4]}]}\n")


def text(model_file, services_yaml: str, top: str = "") -> str:
    return ("name: two\ntriton:\n  server: pytriton\n  user: root\n" + top + "  models:\n"
            + MODEL.replace("MODEL", str(model_file)) + "  services:\n" + services_yaml)


TWO = ("    - {unit: hk-a, gpu: 0}\n"
       "    - {unit: hk-b, gpu: 1, http: {port: 8010}, grpc: {port: 8011}, metrics: {port: 8012}}\n")


@pytest.fixture
def model(tmp_path):
    p = tmp_path / "doubler.py"
    p.write_text("# a model file\n")
    return p


def test_each_service_gets_the_section_with_its_own_keys(model):
    prof = parse_profile_text(text(model, TWO), "node.yaml")
    every = services(prof)
    assert isinstance(prof.section("triton"), Services) and [t.unit for t in every] == ["hk-a", "hk-b"]
    a, b = every
    assert (a.gpus, b.gpus) == ((0,), (1,))
    assert (a.http.port, a.grpc.port, a.metrics.port) == (8000, 8001, 8002)
    assert (b.http.port, b.grpc.port, b.metrics.port) == (8010, 8011, 8012)
    # repository and run directory: one each, under the unit's name
    assert (a.model_repository, b.model_repository) == ("/var/lib/hkgpu-triton/hk-a/models",
                                                        "/var/lib/hkgpu-triton/hk-b/models")
    assert (a.run_dir, b.run_dir) == ("/run/hkgpu-tune/triton/hk-a", "/run/hkgpu-tune/triton/hk-b")
    assert a.models[0].name == b.models[0].name == "doubler" and a.user == b.user == "root"
    assert section(prof, "hk-b") is b


def test_a_profile_of_one_service_is_unchanged(model):
    one = "name: one\ntriton:\n  models:\n" + MODEL.replace("MODEL", str(model))
    prof = parse_profile_text(one, "node.yaml")
    t = section(prof)
    assert not isinstance(prof.section("triton"), tuple)
    assert (t.unit, t.model_repository, t.run_dir) == ("hkgpu-triton", "/var/lib/hkgpu-triton/models",
                                                       "/run/hkgpu-tune/triton")


def test_section_without_a_unit_names_the_services(model):
    prof = parse_profile_text(text(model, TWO), "node.yaml")
    with pytest.raises(Exception, match=r"2 triton services \(hk-a, hk-b\): name one with --unit"):
        section(prof)
    with pytest.raises(Exception, match=r"no triton service with unit 'hk-c' \(have: hk-a, hk-b\)"):
        section(prof, "hk-c")


@pytest.mark.parametrize("services_yaml, top, where", [
    # a port used twice, across services
    ("    - {unit: hk-a}\n    - {unit: hk-b, http: {port: 8000}, grpc: {port: 8011}, metrics: {port: 8012}}\n", "",
     "node.yaml:10: triton.services[1].http: port 8000 is also that of service hk-a (line 9)"),
    # the same unit twice
    ("    - {unit: hk-a}\n    - {unit: hk-a, http: {port: 8010}, grpc: {port: 8011}, metrics: {port: 8012}}\n", "",
     "node.yaml:10: triton.services[1].unit: unit hk-a is also that of service hk-a (line 9)"),
    # a repository in the section: all services would share it
    (TWO, "  model_repository: /srv/models\n",
     "node.yaml:5: triton.model_repository: model_repository /srv/models is also that of service hk-a (line 10): "
     "each service needs its own (leave it out of the triton section"),
    ("    - {gpu: 0}\n", "", "node.yaml:9: triton.services[0]: missing required key 'unit'"),
    ("    []\n", "", "node.yaml:9: triton.services: expected at least one service"),
    ("    - {unit: hk-a, services: []}\n", "", "node.yaml:9: triton.services[0].services: unknown key"),
    ("    - {unit: 'hk a'}\n", "", "node.yaml:9: triton.services[0].unit: expected a systemd unit name"),
    # a unit name that would climb out of its default directories, or carry a backslash
    ("    - {unit: '..'}\n", "", "node.yaml:9: triton.services[0].unit: expected a systemd unit name"),
    ("    - {unit: 'hk\\\\a'}\n", "", "node.yaml:9: triton.services[0].unit: expected a systemd unit name"),
    # repositories side by side under one directory: the copies apply keeps and the backends go there
    ("    - {unit: hk-a, model_repository: /srv/triton/a}\n"
     "    - {unit: hk-b, model_repository: /srv/triton/b, http: {port: 8010}, grpc: {port: 8011}, metrics: {port: 8012}}\n",
     "", "node.yaml:10: triton.services[1].model_repository: the directory above model_repository /srv/triton is "
         "also that of service hk-a (line 9)"),
])
def test_bad_services_are_refused_at_their_line(model, services_yaml, top, where):
    with pytest.raises(ProfileError) as e:
        parse_profile_text(text(model, services_yaml, top), "node.yaml")
    assert str(e.value).startswith(where), str(e.value)


def test_the_cli_refuses_it_with_exit_1_and_no_traceback(model, tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text(text(model, "    - {unit: hk-a}\n    - {unit: hk-b}\n"))
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "plan", "-p", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1 and p.stdout == "", p.stdout
    assert f"{path}:10: triton.services[1]: port 8000" in p.stderr and "port 8000 is also that of service hk-a" in p.stderr
    assert "Traceback" not in p.stderr


def test_firewall_and_health_see_every_service(model):
    from hkgpu_tune.observe.health import named_mig
    from hkgpu_tune.subsystems.firewall import serving_ports
    prof = parse_profile_text(text(model, TWO), "node.yaml")
    assert serving_ports(prof) == [8000, 8001, 8002, 8010, 8011, 8012]
    mig = "MIG-a30a30a3-0000-5000-8000-000000000301"
    prof = parse_profile_text(text(model, f"    - {{unit: hk-a, gpu: 0}}\n    - {{unit: hk-m, gpu: {mig}, "
                                         "http: {port: 8010}, grpc: {port: 8011}, metrics: {port: 8012}}\n"),
                              "node.yaml")
    assert named_mig(prof) == [mig]


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="needs two CPUs to pin a process off one")
def test_verify_reads_each_servers_cpus_against_its_gpus(model, monkeypatch):
    """The cpus/mems rows: the server's real processes (/proc, here a sleep pinned to CPU 0) against
    its GPU's local CPUs and NUMA node (the placement NVML gives; set here, as no GPU is present)."""
    import os
    from hkgpu_tune.backends import Backends
    from hkgpu_tune.serve.running import forms, launch
    from hkgpu_tune.subsystems.triton import Service
    prof = parse_profile_text(text(model, TWO), "node.yaml")
    b = Backends()
    svc = Service(prof, b, section(prof, "hk-b"), [], several=True)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        os.sched_setaffinity(proc.pid, {0})
        monkeypatch.setattr(launch, "server_pids", lambda t, backends=None: [proc.pid])
        want = {"cpus": [1], "mems": [0], "numa_node": 0, "source": "nvml cpu affinity + nvml numa node"}
        monkeypatch.setattr(forms, "placement", lambda t, backends=None: want)
        rows = svc._placement_results(svc.t, "hk-b.service", svc._placement(svc.t))
        got = {r.key: (r.status, r.current, r.desired) for r in rows}
        assert got == {"cpus": ("drift", "0", "1"), "mems": ("ok", "0", "0")}, got
        assert rows[0].target == "hk-b.service" and f"pid {proc.pid} not on GPU 1's local CPUs" in rows[0].reason
        want["cpus"] = [0, 1]
        rows = svc._placement_results(svc.t, "hk-b.service", svc._placement(svc.t))
        assert [r.status for r in rows] == ["ok", "ok"], rows
        # no NVML: the GPU's CPUs are unknown, said so, never a silent ok
        monkeypatch.setattr(forms, "placement", lambda t, backends=None: {
            "cpus": [0, 1], "mems": [], "numa_node": None, "source": "all CPUs: NVML library not found", "known": False})
        (row,) = svc._placement_results(svc.t, "hk-b.service", svc._placement(svc.t))
        assert row.status == "unsupported" and "NVML library not found" in row.reason and not row.required
    finally:
        proc.kill()
        proc.wait()


def test_each_service_renders_its_own_unit(model, tmp_path):
    """triton unit --unit: each service's unit text with its own GPU, ports, repository and backends."""
    path = tmp_path / "node.yaml"
    path.write_text(text(model, TWO))
    units = {}
    for unit in ("hk-a", "hk-b"):
        p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "triton", "unit", "-p", str(path), "--unit", unit],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        units[unit] = p.stdout
    for unit, gpu, port in (("hk-a", 0, 8000), ("hk-b", 1, 8010)):
        u = units[unit]
        assert f"Environment=CUDA_VISIBLE_DEVICES={gpu}\n" in u
        assert f"--model-repository=/var/lib/hkgpu-triton/{unit}/models " in u and f"--http-port={port} " in u
        assert f"--backend-directory=/var/lib/hkgpu-triton/{unit}/triton-backends " in u
        assert f"ReadOnlyPaths=/var/lib/hkgpu-triton/{unit}/models\n" in u
