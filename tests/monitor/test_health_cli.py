"""`hkgpu-tune health` end to end: the CLI as a process, GPUs replayed (HKGPU_TUNE_NVML_REPLAY) with
faults shaped as NVML's documented answers, the kernel log replayed (HKGPU_TUNE_KMSG_REPLAY), hooks
as real scripts that write marker files. The H200 itself is never faulted: only its recorded copy."""
import copy
import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "health")


def load(name):
    with open(os.path.join(FIX, name)) as f:
        return json.load(f)


def hk(*args, env=None, timeout=60):
    e = {**os.environ, **(env or {})}
    e.pop("HKGPU_TUNE_PROFILE", None)
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True,
                          env=e, timeout=timeout)


# faults: nvml_raw answers as nvml.h documents them
def ecc_uncorrected(n):        # nvmlDeviceGetTotalEccErrors(dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)
    return {"nvmlDeviceGetTotalEccErrors": {"corrected": {"volatile": 4, "aggregate": 9},
                                            "uncorrected": {"volatile": n, "aggregate": n}}}


REMAP_PENDING = {"nvmlDeviceGetRemappedRows": [0, 1, 1, 0]}   # (corrRows, uncRows, isPending, failureOccurred)
REMAP_FAILED = {"nvmlDeviceGetRemappedRows": [0, 512, 0, 1]}
LOST_CALLS = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTemperature",
              "nvmlDeviceGetPowerUsage", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTotalEccErrors",
              "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus")
GPU_LOST = {c: {"nvml_error": "GpuIsLost"} for c in LOST_CALLS}   # NVML_ERROR_GPU_IS_LOST on every call


class Host:
    """A replayed host in tmp_path: GPUs, kernel log, profile, state dir and hook scripts."""

    def __init__(self, tmp_path, base="two-gpu.json"):
        self.dir = tmp_path
        self.base = load(base)
        self.replay = tmp_path / "nvml.json"
        self.kmsg = tmp_path / "kmsg.txt"
        self.state = tmp_path / "state"
        self.profile = tmp_path / "p.yaml"
        self.set()
        self.kmsg.write_text("")

    def set(self, gpu=None, raw=None, drop=None, **fields):
        doc = copy.deepcopy(self.base)
        if drop is not None:
            del doc["gpus"][drop]
        if gpu is not None:
            doc["gpus"][gpu]["nvml_raw"].update(raw or {})
            doc["gpus"][gpu].update(fields)
        self.replay.write_text(json.dumps(doc))

    def script(self, name, body):
        p = self.dir / name
        p.write_text("#!/bin/sh\n" + body)
        p.chmod(0o755)
        return str(p)

    def marker_hooks(self):
        """on_unhealthy/on_healthy append one line per run (status, transition, failing) to marks.txt."""
        marks = self.dir / "marks.txt"
        line = f'echo "$0 $HKGPU_HEALTH_STATUS $HKGPU_HEALTH_TRANSITION $HKGPU_HEALTH_FAILING" >> {marks}\n'
        return self.script("drain.sh", line), self.script("undrain.sh", line), marks

    def write_profile(self, **health):
        lines = ["health:"]
        for k, v in health.items():
            lines.append(f"  {k}: {json.dumps(v)}")
        self.profile.write_text("\n".join(lines) + "\n")

    def run(self, *extra, env=None):
        e = {"HKGPU_TUNE_NVML_REPLAY": str(self.replay), "HKGPU_TUNE_KMSG_REPLAY": str(self.kmsg), **(env or {})}
        p = hk("health", "--json", "--profile", str(self.profile), "--state-dir", str(self.state), *extra, env=e)
        doc = json.loads(p.stdout) if p.stdout.strip().startswith("{") else None
        return p, doc


def failing(doc):
    return sorted(doc["failing"])


def marks(path):
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path)


def test_healthy_host_exit_0_every_check_with_value_and_threshold(host):
    host.write_profile(gpus_expected=2)
    p, doc = host.run()
    assert p.returncode == 0, p.stderr
    assert doc["command"] == "health" and doc["schema_version"] == 1 and doc["status"] == "healthy"
    names = {(c["name"], c["target"]): c for c in doc["checks"]}
    assert names[("gpu_count", "")]["value"] == 2 and names[("gpu_count", "")]["threshold"] == 2
    for g in ("gpu0", "gpu1"):
        assert names[("ecc_uncorrected", g)] == {"name": "ecc_uncorrected", "target": g, "status": "ok", "value": 0,
                                                 "threshold": 0, "reason": names[("ecc_uncorrected", g)]["reason"]}
        assert names[("remapped_rows", g)]["status"] == "ok"
        assert names[("retired_pages_pending", g)]["status"] == "skipped"   # NOT_SUPPORTED on Hopper
        assert names[("temperature", g)]["value"] in (31, 32) and names[("temperature", g)]["threshold"] == 85
        assert names[("pcie_width", g)]["value"] == 16 and names[("pcie_gen", g)]["value"] == 5
    assert names[("xid", "")]["status"] == "ok" and 79 in names[("xid", "")]["threshold"]
    st = os.stat(host.state / "health.json")
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert json.loads((host.state / "health.json").read_text())["acted"] == "healthy"


@pytest.mark.parametrize("fault, expect", [
    (dict(gpu=1, raw=ecc_uncorrected(2)), ["ecc_uncorrected:gpu1"]),
    (dict(gpu=0, raw=REMAP_PENDING), ["remapped_rows:gpu0"]),
    (dict(gpu=1, raw=REMAP_FAILED), ["remapped_rows:gpu1"]),
    (dict(gpu=1, raw=GPU_LOST), ["gpu_lost:gpu1"]),
    (dict(drop=1), ["gpu_count"]),
    (dict(gpu=0, raw={"nvmlDeviceGetTemperature": 96}), ["temperature:gpu0"]),
    (dict(gpu=1, pcie={"gen": 5, "max_gen": 5, "width": 8, "max_width": 16}), ["pcie_width:gpu1"]),
    (dict(gpu=0, pcie={"gen": 3, "max_gen": 5, "width": 16, "max_width": 16},
          raw={"nvmlDeviceGetCurrentClocksEventReasons": 0}), ["pcie_gen:gpu0"]),   # busy, not idle
])
def test_each_fault_is_degraded_exit_2(host, fault, expect):
    host.write_profile(gpus_expected=2)
    host.set(**fault)
    p, doc = host.run("--no-hooks")
    assert p.returncode == 2, p.stderr
    assert doc["status"] == "degraded" and failing(doc) == expect
    c = next(c for c in doc["checks"] if c["status"] == "failing")
    assert c["value"] is not None and "threshold" in c


def test_a_lower_link_generation_while_idle_is_not_a_fault(host):
    host.write_profile()
    # nvmlDeviceGetCurrentClocksEventReasons: nvmlClocksEventReasonGpuIdle (0x1)
    host.set(gpu=0, pcie={"gen": 1, "max_gen": 5, "width": 16, "max_width": 16},
             raw={"nvmlDeviceGetCurrentClocksEventReasons": 1})
    p, doc = host.run("--no-hooks")
    assert p.returncode == 0, doc
    c = next(c for c in doc["checks"] if c["name"] == "pcie_gen" and c["target"] == "gpu0")
    assert (c["status"], c["value"], c["threshold"]) == ("ok", 1, 5) and "idle" in c["reason"]
    host.set(gpu=0, pcie={"gen": 5, "max_gen": 5, "width": 4, "max_width": 16},
             raw={"nvmlDeviceGetCurrentClocksEventReasons": 1})
    p, doc = host.run("--no-hooks")
    assert p.returncode == 2 and failing(doc) == ["pcie_width:gpu0"]      # a narrower link is never power saving


def test_ecc_at_threshold_is_ok_over_is_failing(host):
    host.write_profile(ecc_uncorrected_max=2)
    host.set(gpu=0, raw=ecc_uncorrected(2))
    p, doc = host.run("--no-hooks")
    assert p.returncode == 0 and doc["status"] == "healthy"
    host.set(gpu=0, raw=ecc_uncorrected(3))
    p, doc = host.run("--no-hooks")
    assert p.returncode == 2 and failing(doc) == ["ecc_uncorrected:gpu0"]
    c = next(c for c in doc["checks"] if c["status"] == "failing")
    assert (c["value"], c["threshold"]) == (3, 2)


def test_retired_pages_pending_on_a_volta_gpu(tmp_path):
    h = Host(tmp_path, "v100.json")
    h.write_profile(gpus_expected=1)
    p, doc = h.run("--no-hooks")
    assert p.returncode == 0, doc
    st = {c["name"]: c["status"] for c in doc["checks"]}
    assert st["remapped_rows"] == "skipped" and st["retired_pages_pending"] == "ok"
    # nvmlDeviceGetRetiredPagesPendingStatus -> NVML_FEATURE_ENABLED
    h.set(gpu=0, raw={"nvmlDeviceGetRetiredPagesPendingStatus": 1, "nvmlDeviceGetRetiredPages": {"sbe": [], "dbe": [4096]}})
    p, doc = h.run("--no-hooks")
    assert p.returncode == 2 and failing(doc) == ["retired_pages_pending:gpu0"]


def test_xid_in_the_critical_set_fails_others_do_not(host):
    host.write_profile(xids=[79, 48])
    host.kmsg.write_text("4,1201,51234567,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python3, "
                         "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)\n")
    p, doc = host.run("--no-hooks")
    assert p.returncode == 0, doc
    host.kmsg.write_text(host.kmsg.read_text() + "3,1202,51234999,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', "
                         "name=<unknown>, GPU has fallen off the bus.\n")
    p, doc = host.run("--no-hooks")
    assert p.returncode == 2 and failing(doc) == ["xid"]
    c = next(c for c in doc["checks"] if c["name"] == "xid")
    assert c["value"] == {"79": 1} and c["threshold"] == [48, 79]


def test_transitions_run_each_hook_once_with_hold_down(host):
    drain, undrain, mk = host.marker_hooks()
    host.write_profile(gpus_expected=2, on_unhealthy=[drain, "--now"], on_healthy=[undrain], hold_down_s=4)
    p, doc = host.run()
    assert p.returncode == 0 and marks(mk) == [] and doc["action"]["transition"] is None

    host.set(gpu=1, raw=REMAP_PENDING)
    p, doc = host.run()
    assert p.returncode == 2 and doc["action"]["transition"] == "unhealthy" and doc["action"]["hook"]["ok"]
    assert marks(mk) == [f"{drain} degraded unhealthy remapped_rows:gpu1"]
    for _ in range(2):                       # still faulty: never run again
        p, doc = host.run()
        assert p.returncode == 2 and doc["action"]["hook"] is None and len(marks(mk)) == 1

    host.set()                               # healthy, but not for hold_down_s yet
    t0 = time.time()
    p, doc = host.run()
    assert p.returncode == 0 and doc["action"]["hook"] is None
    assert "on_healthy waits" in doc["action"]["held_down"] and len(marks(mk)) == 1
    host.set(gpu=0, raw=ecc_uncorrected(1))  # a flap inside the hold-down: still unhealthy, no hook
    p, doc = host.run()
    assert p.returncode == 2 and doc["action"]["hook"] is None and len(marks(mk)) == 1
    host.set()
    p, doc = host.run()                      # the recovery clock starts again at this run's time
    assert doc["action"]["hook"] is None and len(marks(mk)) == 1
    since = json.loads((host.state / "health.json").read_text())["observed_since"]
    time.sleep(max(0.0, since + 4.1 - time.time()))   # the run's own clock, not the test's (a slow start raced)
    p, doc = host.run()
    assert p.returncode == 0 and doc["action"]["transition"] == "healthy", doc["action"]
    assert marks(mk)[1] == f"{undrain} healthy healthy "
    assert time.time() - t0 >= 4
    p, doc = host.run()
    assert doc["action"]["hook"] is None and len(marks(mk)) == 2
    host.set(drop=0)                         # sick again after the hold-down: one more drain
    p, doc = host.run()
    assert doc["action"]["transition"] == "unhealthy" and marks(mk)[2] == f"{drain} degraded unhealthy gpu_count"


def test_a_failing_hook_is_reported_and_tried_again_next_run(host):
    mk = host.dir / "tries.txt"
    flag = host.dir / "fixed"
    hook = host.script("drain.sh", f'echo try >> {mk}\n[ -e {flag} ] || {{ echo "lb api down" >&2; exit 3; }}\n')
    host.write_profile(on_unhealthy=[hook], hold_down_s=0)
    host.set(gpu=0, raw=GPU_LOST)
    p, doc = host.run()
    assert p.returncode == 2
    h = doc["action"]["hook"]
    assert h["ok"] is False and h["rc"] == 3 and h["error"] == "exit status 3" and "lb api down" in h["output"]
    assert doc["action"]["transition"] is None and doc["action"]["state"] == "healthy"
    p2 = hk("health", "--profile", str(host.profile), "--state-dir", str(host.state),
            env={"HKGPU_TUNE_NVML_REPLAY": str(host.replay), "HKGPU_TUNE_KMSG_REPLAY": str(host.kmsg)})
    assert p2.returncode == 2 and "hook on_unhealthy: FAILED: exit status 3 (tried again on the next run)" in p2.stdout
    assert marks(mk) == ["try", "try"]
    flag.write_text("")
    p, doc = host.run()
    assert doc["action"]["hook"]["ok"] and doc["action"]["transition"] == "unhealthy"
    p, doc = host.run()
    assert doc["action"]["hook"] is None and marks(mk) == ["try"] * 3


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"   # a zombie of someone else's is gone too
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("trap", [False, True])
def test_a_hanging_hook_is_killed_with_its_group_no_orphan(host, trap):
    pids = host.dir / "pids.txt"
    body = ("trap '' TERM\n" if trap else "") + (
        f"sleep 300 &\necho $! >> {pids}\necho $$ >> {pids}\n"
        "echo started\nwhile :; do sleep 1; done\n")
    hook = host.script("hang.sh", body)
    host.write_profile(on_unhealthy=[hook], hook_timeout_s=1, hold_down_s=0)
    host.set(gpu=0, raw=REMAP_FAILED)
    t0 = time.monotonic()
    p, doc = host.run()
    took = time.monotonic() - t0
    assert p.returncode == 2
    h = doc["action"]["hook"]
    assert h["timed_out"] and not h["ok"] and h["error"] == "killed after 1 s (hook_timeout_s)"
    assert "started" in h["output"]
    assert took < 1 + 2 + 12, took      # timeout + TERM grace + two start-ups on a loaded machine
    child, shell = [int(x) for x in pids.read_text().split()]
    assert h["pid"] == shell
    for pid in (child, shell):
        assert _gone(pid), f"pid {pid} left running"
    assert doc["action"]["state"] == "healthy"   # not drained: tried again next run
    p, doc = host.run()
    assert doc["action"]["hook"]["timed_out"] and len(pids.read_text().split()) == 4
    for pid in map(int, pids.read_text().split()):
        assert _gone(pid)


def test_hook_cannot_start_is_reported(host):
    host.write_profile(on_unhealthy=[str(host.dir / "no-such-hook")])
    host.set(gpu=0, raw=REMAP_PENDING)
    p, doc = host.run()
    assert p.returncode == 2 and doc["action"]["hook"]["ok"] is False
    assert doc["action"]["hook"]["error"].startswith(f"cannot start {host.dir / 'no-such-hook'}")


def test_no_hooks_records_nothing(host):
    drain, undrain, mk = host.marker_hooks()
    host.write_profile(on_unhealthy=[drain])
    host.set(gpu=0, raw=REMAP_PENDING)
    p, doc = host.run("--no-hooks")
    assert p.returncode == 2 and marks(mk) == [] and not host.state.exists()


def test_an_unreadable_check_is_error_exit_1_and_no_hook(host):
    drain, undrain, mk = host.marker_hooks()
    host.write_profile(on_unhealthy=[drain], on_healthy=[undrain], hold_down_s=0)
    host.set(gpu=0, raw=REMAP_PENDING)
    p, doc = host.run()
    assert p.returncode == 2 and len(marks(mk)) == 1
    host.set()
    p, doc = host.run(env={"HKGPU_TUNE_KMSG_REPLAY": str(host.dir / "missing.txt")})
    assert p.returncode == 1 and doc["status"] == "error"
    assert [c["name"] for c in doc["checks"] if c["status"] == "error"] == ["xid"]
    assert doc["action"]["hook"] is None and len(marks(mk)) == 1     # unknown is not healthy
    p, doc = host.run()
    assert p.returncode == 0 and doc["action"]["transition"] == "healthy" and len(marks(mk)) == 2


def test_verify_drift_counts_when_configured(host):
    host.profile.write_text("sysctl:\n  kernel.ostype: NotLinux\nhealth:\n  verify_drift: false\n")
    p, doc = host.run("--no-hooks")
    assert p.returncode == 0, doc
    host.profile.write_text("sysctl:\n  kernel.ostype: NotLinux\nhealth:\n  verify_drift: true\n")
    p, doc = host.run("--no-hooks")
    assert p.returncode == 2 and failing(doc) == ["verify"]
    c = next(c for c in doc["checks"] if c["name"] == "verify")
    assert c["value"] == 1 and "kernel.ostype" in c["reason"]


@pytest.mark.parametrize("text, msg", [
    ("health:\n  temperature_max_c: hot\n", "p.yaml:2: health.temperature_max_c: expected degrees Celsius (0-200), got 'hot'"),
    ("health:\n  on_unhealthy: /usr/local/bin/drain --now\n", "p.yaml:2: health.on_unhealthy: expected a list, got '/usr/local/bin/drain --now'"),
    ("health:\n  on_healthy: [undrain]\n", "p.yaml:2: health.on_healthy[0]: the program must be an absolute path"),
    ("health:\n  on_healthy: []\n", "p.yaml:2: health.on_healthy: expected a command as a list"),
    ("health:\n  on_unhealthy: [/bin/true, {a: 1}]\n", "p.yaml:2: health.on_unhealthy[1]: expected a command-line argument (a string), got a mapping"),
    ("health:\n  hook_timeout_s: [30]\n", "p.yaml:2: health.hook_timeout_s: expected seconds (0.1-3600), got a list"),
    ("health:\n  hold_down_s: -1\n", "p.yaml:2: health.hold_down_s: expected seconds (0-604800), got '-1'"),
    ("health:\n  xids:\n    - 79\n    - fell off\n", "p.yaml:4: health.xids[1]: expected an integer 1-65536, got 'fell off'"),
    ("health:\n  ecc_uncorrected_max: true\n", "p.yaml:2: health.ecc_uncorrected_max: expected an integer 0-4294967296, got 'true'"),
    ("health:\n  remapped_rows: 1\n", "p.yaml:2: health.remapped_rows: expected true or false, got '1'"),
    ("health:\n  nic_errors: {max_increase: 1}\n", "p.yaml:2: health.nic_errors: missing required key 'devices'"),
    ("health:\n  hold_down: 30\n", "p.yaml:2: health.hold_down: unknown key; did you mean 'hold_down_s'?"),
])
def test_wrong_types_are_one_line_profile_errors(host, text, msg):
    host.profile.write_text(text)
    p, doc = host.run()
    assert p.returncode == 1 and doc is None and p.stdout == ""
    err = p.stderr.strip()
    assert err.startswith(f"hkgpu-tune: error: {host.dir}/{msg}"), err
    assert "\n" not in err and "Traceback" not in err
    assert not host.state.exists()


def test_untrusted_state_is_refused_and_no_hook_runs(host):
    drain, undrain, mk = host.marker_hooks()
    host.write_profile(on_unhealthy=[drain])
    host.set(gpu=0, raw=REMAP_PENDING)
    host.state.mkdir(mode=0o700)
    (host.state / "health.json").write_text('{"format": 1, "kind": "health", "acted": "drained"}')
    os.chmod(host.state / "health.json", 0o600)
    p, doc = host.run()
    assert p.returncode == 1 and "'acted' is not healthy or unhealthy: refused" in p.stderr and marks(mk) == []
    os.unlink(host.state / "health.json")
    os.symlink(host.dir / "elsewhere.json", host.state / "health.json")
    p, doc = host.run()
    assert p.returncode == 1 and "symbolic link: refused" in p.stderr and not (host.dir / "elsewhere.json").exists()
    os.unlink(host.state / "health.json")
    os.chmod(host.state, 0o777)
    p, doc = host.run()
    assert p.returncode == 1 and "writable by group or others" in p.stderr and marks(mk) == []


def test_a_second_run_during_a_hook_neither_waits_nor_runs_it_again(host):
    """The hook runs outside the host lock (a drain may take an hour): a second health run at the
    same time is not refused; it sees the first one's claim and does not start the hook again. An
    apply or rollback meanwhile is not refused either."""
    mk = host.dir / "ran"
    hook = host.script("slow.sh", f"echo x >> {mk}\nsleep 3\n")
    host.write_profile(on_unhealthy=[hook])
    host.set(gpu=0, raw=REMAP_PENDING)
    env = {**os.environ, "HKGPU_TUNE_NVML_REPLAY": str(host.replay), "HKGPU_TUNE_KMSG_REPLAY": str(host.kmsg)}
    first = subprocess.Popen([sys.executable, "-m", "hkgpu_tune", "health", "--profile", str(host.profile),
                              "--state-dir", str(host.state)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while time.time() < deadline and not mk.exists():
            time.sleep(0.05)
        assert mk.exists() and first.poll() is None
        p, doc = host.run()
        assert p.returncode == 2, p.stderr
        assert f"is running (pid {first.pid})" in doc["action"]["held_down"], doc["action"]
        r = hk("rollback", "--state-dir", str(host.state), "--lock-wait", "0")
        assert r.returncode == 0 and "nothing to roll back" in r.stdout, r.stdout + r.stderr
        assert first.poll() is None, "the hook ended before the checks above: they proved nothing"
    finally:
        first.wait(timeout=30)
    assert first.returncode == 2 and mk.read_text() == "x\n"
