"""The production launch forms of the Triton service, run for real on the VM test node (Debian's
systemd, a unified cgroup tree), serving the CPU Python model (tests/triton/data/doubler.py) with
the nvidia-pytriton wheel's tritonserver (build.sh puts it into the node's Python).

1. The systemd unit, converged by the hkgpu_triton role (site.yml, tags install,triton): the
   unprivileged user, the hardening, CPUAffinity; the role's latency gate passes. Then the same
   unit pinned to NUMA node 1 (CPU 1, memory bound there) through the library, and the gate again.
2. The container form with Debian's podman: an image built inside the VM from its own root
   filesystem (tar | podman import, plus /opt/tritonserver laid out as in NVIDIA's image), no
   registry (the VM cannot reach one: restrict=on); run as a systemd unit with --network host,
   --ulimit memlock=-1, --shm-size, --cpuset-cpus and --cpuset-mems, and the gate passes.

Every check reads the node with its own tools (systemctl show, /proc, podman inspect), not through
hkgpu-tune's verify. Runs after test_node.py on the same VM (session fixture); alone, it installs
the toolkit itself.
"""
from __future__ import annotations

import json
import os
import shlex

import pytest
import yaml

from hkgpu_tune.fleet.rack import run_playbook

from .vm import REPO

pytestmark = [pytest.mark.root, pytest.mark.slow]

CLI = "/opt/hkgpu-tune/bin/hkgpu-tune"
PY = "/opt/hkgpu-tune/bin/python"
NODE_PROFILE = "/etc/hkgpu-tune/node.yaml"
PODMAN_PROFILE = "/etc/hkgpu-tune/podman.yaml"
USER = "triton-server"
IMAGE = "localhost/hkgpu-triton-cpu:test"
SITE = "/usr/local/lib/python3.11/dist-packages"   # where build.sh put the wheel
MODEL_ON_NODE = "/etc/hkgpu-tune/triton/doubler.py"
NODE1 = {"cpus": [1], "mems": [1], "numa_node": 1, "source": "test: NUMA node 1 (vm.py puts CPU 1 there)"}
# under software emulation the server takes minutes to load: bounded, generously
READY_S = 600
MODEL = {"name": "doubler", "backend": "python", "model_file": MODEL_ON_NODE, "max_batch_size": 16,
         "inputs": [{"name": "INPUT0", "data_type": "FP32", "dims": [4]}],
         "outputs": [{"name": "OUTPUT0", "data_type": "FP32", "dims": [4]}],
         "dynamic_batching": {"max_queue_delay_microseconds": 2000},
         "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
GATE = {"ready_timeout_s": READY_S, "warmup_requests": 4, "load": {"requests": 32, "concurrency": 4},
        "p99_ms": 30000}


@pytest.fixture(scope="module")
def node(vm, tmp_path_factory, wheel_dir):
    inv = vm.inventory(str(tmp_path_factory.mktemp("ansible-triton") / "hosts.yml"))
    extra = {"hkgpu_install_cache_dir": wheel_dir,
             "hkgpu_install_wheelhouse": os.path.join(vm.dir, "wheelhouse"),
             "hkgpu_triton_files": [{"src": os.path.join(REPO, "tests", "triton", "data", "doubler.py"),
                                     "dest": MODEL_ON_NODE}],
             "hkgpu_triton_models": [MODEL], "hkgpu_triton_gpu": None, "hkgpu_triton_supervisor": "systemd",
             "hkgpu_triton_gate": GATE}
    yield {"inventory": inv, "extra": extra}
    # one server at a time on this 1 GiB node, and none left for a later module
    vm.ssh("systemctl stop hkgpu-triton.service hkgpu-triton-podman.service; podman rm -f hkgpu-triton-podman",
           timeout=300)


def proc(vm, pid: int) -> dict:
    """/proc/PID/status of a guest process as a dict, plus its user and the NUMA policies in use."""
    out = vm.ssh(f"cat /proc/{pid}/status; echo user=$(ps -o user= -p {pid}); "
                 f"echo policies=$(awk '{{print $2}}' /proc/{pid}/numa_maps | sort -u | tr '\\n' ' ')",
                 check=True).stdout
    return {k.strip(): v.strip() for k, v in (ln.split(":" if ":" in ln and "=" not in ln else "=", 1)
                                               for ln in out.splitlines() if ":" in ln or "=" in ln)}


def server_tree(vm, unit: str) -> list[int]:
    """The unit's main process and every process in its cgroup (tritonserver and its Python stubs)."""
    out = vm.ssh(f"cat /sys/fs/cgroup$(systemctl show -P ControlGroup {unit})/cgroup.procs", check=True).stdout
    return [int(x) for x in out.split()]


def gate(vm, profile: str) -> dict:
    p = vm.ssh(f"{CLI} triton gate -p {profile} --json", timeout=READY_S)
    assert p.returncode == 0 and p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(p.stdout)


def test_systemd_unit_serves_the_cpu_model(vm, node, stage):
    with stage("triton: ansible-playbook site.yml --tags install,triton (systemd unit, gate)"):
        run = run_playbook("apply", node["inventory"], extravars=node["extra"], tags="install,triton")
    h = run.hosts["hkvm"]
    assert run.rc == 0 and not h.is_failed, json.dumps(run.to_dict(), indent=1, default=str)[-4000:]
    unit = "hkgpu-triton.service"
    show = dict(ln.split("=", 1) for ln in vm.ssh(
        f"systemctl show -p ActiveState,User,MainPID,CPUAffinity,NoNewPrivileges,ProtectSystem,ProtectHome,"
        f"PrivateTmp,CapabilityBoundingSet,LimitMEMLOCK {unit}", check=True).stdout.splitlines())
    assert show["ActiveState"] == "active" and show["User"] == USER, show
    assert (show["NoNewPrivileges"], show["ProtectSystem"], show["ProtectHome"], show["PrivateTmp"]) == \
        ("yes", "strict", "yes", "yes"), show
    assert show["CapabilityBoundingSet"] == "" and show["LimitMEMLOCK"] == "infinity", show
    # no GPU here: the placement is every online CPU; the server and its stubs run there, as the user
    assert show["CPUAffinity"] == "0-1", show
    pids = server_tree(vm, unit)
    assert int(show["MainPID"]) in pids and len(pids) >= 2, pids     # the server and a Python stub
    for pid in pids:
        st = proc(vm, pid)
        assert (st["user"], st["Cpus_allowed_list"], st["NoNewPrivs"], st["CapEff"]) == \
            (USER, "0-1", "1", "0000000000000000"), st
    # ProtectSystem=strict as the kernel enforces it: /usr is read-only in the server's namespace
    p = vm.ssh(f"nsenter -t {show['MainPID']} -m touch /usr/hkgpu-probe")
    assert p.returncode != 0 and "Read-only file system" in p.stderr, p.stderr

    # pinned to NUMA node 1 (CPU 1, memory bound there), through the library, and the gate again
    script = (f"from hkgpu_tune.core.profile import load_profile; from hkgpu_tune.serve.schema.config import section; "
              f"from hkgpu_tune.serve.running import launch; t = section(load_profile('{NODE_PROFILE}')); "
              f"launch.stop(t); launch.start(t, place={NODE1!r}); launch.wait_ready(t, timeout={READY_S})")
    with stage("triton: the unit pinned to NUMA node 1, restart to ready"):
        p = vm.ssh(f"{PY} -c {shlex.quote(script)}", timeout=READY_S + 120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    text = vm.ssh(f"cat /etc/systemd/system/{unit}", check=True).stdout
    assert "CPUAffinity=1\n" in text and "NUMAPolicy=bind\nNUMAMask=1\n" in text, text
    for pid in server_tree(vm, unit):
        st = proc(vm, pid)
        assert st["Cpus_allowed_list"] == "1" and st["user"] == USER, st
        assert "bind:1" in st["policies"].split(), st     # its memory is bound to node 1
    with stage("triton: gate (pinned unit)"):
        rep = gate(vm, NODE_PROFILE)
    assert rep["passed"] is True and rep["message"].startswith("doubler: p99 "), rep


def build_image(vm) -> int:
    """The node's own root filesystem as an image (no kernel, no container storage, no toolkit
    venv), with the server laid out as in NVIDIA's image: /opt/tritonserver/bin on PATH and the
    Python backend (with the stub for this Python) in /opt/tritonserver/backends. Returns its size."""
    wheel = f"{SITE}/pytriton/tritonserver"
    excl = " ".join(f"--exclude=./{d}" for d in (
        "boot", "usr/lib/modules", "usr/lib/firmware", "var/lib/containers", "var/cache", "var/lib/apt", "var/tmp",
        "var/log", "opt/hkgpu-tune", "root", "home", "usr/share/doc", "usr/share/man", "usr/share/locale",
        "etc/ssh", "var/lib/hkgpu-tune", "var/lib/hkgpu-triton", "var/lib/hkgpu-podman", "etc/hkgpu-tune",
        # the node's own tools that the server does not use (less to import under emulation)
        "usr/bin/podman", "usr/lib/podman", "usr/lib/udev", f"{SITE[1:]}/grpc", f"{SITE[1:]}/ml_dtypes"))
    script = f"""set -e
o=/opt/tritonserver
rm -rf $o && mkdir -p $o/bin $o/backends/python
ln -s {wheel}/bin/tritonserver $o/bin/tritonserver
cp {wheel}/backends/python/libtriton_python.so {wheel}/backends/python/triton_python_backend_utils.py \\
   {wheel}/python_backend_stubs/3.11/triton_python_backend_stub $o/backends/python/
tar -C / --one-file-system {excl} -cf - . | podman import \\
  --change 'ENV PATH=/opt/tritonserver/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin' \\
  --change 'ENV LD_LIBRARY_PATH={SITE}/nvidia_pytriton.libs' - {IMAGE} >/dev/null
rm -rf $o
podman image inspect --format '{{{{.Size}}}}' {IMAGE}
"""
    p = vm.ssh(script, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return int(p.stdout.split()[-1])


def test_container_form_with_podman(vm, node, stage):
    vm.ssh("systemctl stop hkgpu-triton.service", timeout=300)   # one server at a time (1 GiB)
    vm.ssh(f"id {USER} >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin {USER}",
           check=True)
    with stage("podman: image from the node's root filesystem (tar | podman import)"):
        size = build_image(vm)
    assert size > 0
    prof = {"name": "podman-test", "triton": {
        "server": "pytriton", "launch": "container", "runtime": "podman", "image": IMAGE, "supervisor": "systemd",
        "unit": "hkgpu-triton-podman", "user": USER, "gpu": None, "shm_size": "256m",
        "model_repository": "/var/lib/hkgpu-podman/models", "run_dir": "/run/hkgpu-podman",
        "http": {"port": 8100}, "grpc": {"port": 8101}, "metrics": {"port": 8102},
        "models": [MODEL], "gate": GATE}}
    vm.ssh(f"cat > {PODMAN_PROFILE} <<'EOF'\n{yaml.safe_dump(prof, sort_keys=False)}EOF", check=True)
    script = (f"from hkgpu_tune.core.profile import load_profile; from hkgpu_tune.serve.schema.config import section; "
              f"from hkgpu_tune.serve.repository import render; from hkgpu_tune.serve.running import launch; t = section(load_profile('{PODMAN_PROFILE}')); "
              f"render.write_repository(t); launch.start(t, place={NODE1!r}); "
              f"print(round(launch.wait_ready(t, timeout={READY_S}), 1))")
    with stage("podman: the container unit started, to ready"):
        p = vm.ssh(f"{PY} -c {shlex.quote(script)}", timeout=READY_S + 120)
    if p.returncode != 0:
        p2 = vm.ssh("journalctl -o cat -n 60 -u hkgpu-triton-podman.service")
        pytest.fail(p.stdout[-2000:] + p.stderr[-3000:] + "\n--- journal\n" + p2.stdout)
    name = "hkgpu-triton-podman"
    unit = vm.ssh(f"systemctl show -p ActiveState,ExecStart {name}.service", check=True).stdout
    assert "ActiveState=active" in unit and "podman run --rm --name hkgpu-triton-podman" in unit, unit
    with stage("podman: gate"):
        rep = gate(vm, PODMAN_PROFILE)
    assert rep["passed"] is True and rep["message"].startswith("doubler: p99 "), rep

    # what podman applied, and what the kernel shows of the container's server (its PID 1)
    info = json.loads(vm.ssh(f"podman inspect {name}", check=True).stdout)[0]
    hc = info["HostConfig"]
    assert (hc["NetworkMode"], hc["CpusetCpus"], hc["CpusetMems"], hc["ShmSize"]) == \
        ("host", "1", "1", 256 * 2 ** 20), hc
    assert any(u["Name"] == "RLIMIT_MEMLOCK" and u["Soft"] in (-1, 2 ** 64 - 1) for u in hc["Ulimits"]), hc["Ulimits"]
    pid = info["State"]["Pid"]
    st = proc(vm, pid)
    assert (st["user"], st["Cpus_allowed_list"], st["Mems_allowed_list"]) == (USER, "1", "1"), st
    inside = vm.ssh(f"grep 'Max locked memory' /proc/{pid}/limits; "
                    f"readlink /proc/{pid}/ns/net /proc/1/ns/net; "
                    f"grep ' /dev/shm ' /proc/{pid}/mounts; "
                    f"cat /sys/fs/cgroup$(cut -d: -f3 /proc/{pid}/cgroup)/cpuset.cpus.effective", check=True).stdout.splitlines()
    assert inside[0].split()[3:5] == ["unlimited", "unlimited"], inside
    assert inside[1] == inside[2], inside                       # the host's network namespace
    assert "size=262144k" in inside[3], inside
    assert inside[4] == "1", inside

    with stage("podman: stop"):
        p = vm.ssh(f"{CLI} triton stop -p {PODMAN_PROFILE}", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    left = vm.ssh(f"systemctl is-active {name}.service; podman ps -a --filter name={name} -q").stdout.split()
    assert left == ["inactive"], left
