"""Output conventions of every command: tables readable at 80 columns, values in the words of
sysctl/ethtool/tc (never a Python repr), one JSON envelope, a quiet broken pipe."""
from __future__ import annotations

import ctypes.util
import io
import json
import os
import re
import subprocess
import sys

import pytest

from hkgpu_tune.core.report import DRIFT, OK, UNSUPPORTED, Change, Result, fmt, print_changes, print_table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "docs", "examples", "triton-resnet50.yaml")
REPR = re.compile(r"\{'|\['|\bTrue\b|\bFalse\b|\bNone\b")
HEAD = ["schema_version", "command", "host", "profile", "profile_source", "time", "version"]


def hk(*args, env=None, timeout=180):
    e = {k: v for k, v in os.environ.items() if k not in ("HKGPU_TUNE_PROFILE",)}
    e.update({"HKGPU_TUNE_ETC_DIR": "/nonexistent-hkgpu-etc", "COLUMNS": "80"}, **(env or {}))
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True,
                          env=e, cwd=ROOT, timeout=timeout)


def commands(tmp_path) -> dict[str, list[str]]:
    st = ["--state-dir", str(tmp_path / "state")]
    return {
        "verify": ["verify", *st],
        "verify example": ["verify", "-p", EXAMPLE, *st],
        "plan": ["plan", *st],
        "apply --dry-run": ["apply", "--dry-run", "-p", EXAMPLE, *st],
        "facts": ["facts", *st],
        "rollback": ["rollback", *st],
        "mps status": ["mps", "status", "-p", EXAMPLE],
        "placement": ["placement", "--gpu", "0"],
        "profiles list": ["profiles", "list"],
        "profiles show": ["profiles", "show", "hk-latency"],
        "triton command": ["triton", "command", "-p", EXAMPLE],
        "triton unit": ["triton", "unit", "-p", EXAMPLE],
    }


# printed as they are used, not as tables: a shell command line and a systemd unit file
NOT_TABLES = {"triton command", "triton unit"}


@pytest.mark.slow
def test_every_table_fits_80_columns_without_python_reprs(tmp_path):
    for name, argv in commands(tmp_path).items():
        p = hk(*argv)
        assert p.returncode in (0, 2), (name, p.stderr)
        assert p.stdout.strip(), name
        out = p.stdout + p.stderr
        assert not REPR.search(out), (name, REPR.search(out).group(), out)
        if name not in NOT_TABLES:
            wide = [ln for ln in p.stdout.splitlines() if len(ln) > 80]
            assert not wide, (name, wide)
    assert not (tmp_path / "state").exists()   # nothing written


@pytest.mark.parametrize("cmd", ["verify", "plan", "apply", "rollback", "facts", "mps", "placement", "triton",
                                 "rack", "profiles", "completion", "man"])
def test_help_has_an_example_and_the_exit_codes_in_80_columns(cmd):
    p = hk(cmd, "--help")
    assert p.returncode == 0, p.stderr
    assert "example:\n  hkgpu-tune " + cmd in p.stdout
    assert "exit codes:\n  0  ok\n  1  error" in p.stdout and "\n  2  drift" in p.stdout
    assert not [ln for ln in p.stdout.splitlines() if len(ln) > 80], p.stdout


def test_values_in_the_tools_words():
    assert fmt({"combined": "max"}) == "combined max"
    assert fmt({"rx": "max", "tx": 4096}) == "rx max tx 4096"
    assert fmt({"gro": True, "gso": True, "lro": False}) == "gro on gso on lro off"
    assert [fmt(v) for v in (True, False, None, 9000, 2.5, [0, 1], {})] == ["on", "off", "-", "9000", "2.5", "0 1", "-"]


def test_table_at_80_columns_keeps_keys_whole():
    res = [Result("sysctl", "host", "net.core.netdev_max_backlog", "1000", "250000", DRIFT, "below the desired value"),
           Result("sysctl", "host", "net.ipv4.tcp_rmem", "4096 131072 33554432", "4096 87380 268435456", DRIFT,
                  "below the desired value"),
           Result("sysctl", "host", "net.core.default_qdisc", "pfifo_fast", "fq_codel", UNSUPPORTED,
                  "qdisc fq_codel is unsupported by this kernel (sch_fq_codel missing: No such file or directory)"),
           Result("ethtool", "enp59s0f0np0", "channels", {"combined": 8}, {"combined": "max"}, DRIFT, "differs"),
           Result("ethtool", "enp59s0f0np0", "offloads", {"gro": False, "tso": True}, {"gro": True, "tso": True},
                  DRIFT, "differs"),
           Result("gpu", "gpu0", "persistence", True, True, OK),
           Result("gpu", "gpu", "compute_mode", None, "default", UNSUPPORTED, "NVML sees no GPU", required=False)]
    from rich.console import Console
    buf = io.StringIO()
    print_table(res, Console(file=buf, width=80, color_system=None))
    print_changes([Change(r.subsystem, r.target, r.key, r.current, r.desired) for r in res], res,
                  Console(file=buf, width=80, color_system=None))
    out = buf.getvalue()
    assert not [ln for ln in out.splitlines() if len(ln) > 80], out
    assert not REPR.search(out), out
    for r in res:   # each key on one line, whole
        assert re.search(rf"^{re.escape(r.key)}\s", out, re.M), (r.key, out)
    assert "combined 8" in out and "combined max" in out and "gro off tso on" in out
    assert "unsupported: optional; NVML sees no GPU" in out


def envelope_ok(doc: dict, command: str) -> None:
    assert list(doc)[:len(HEAD)] == HEAD, list(doc)
    assert doc["schema_version"] == 1 and doc["command"] == command
    assert doc["host"] == os.uname().nodename
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", doc["time"])


@pytest.mark.slow
def test_every_command_json_has_the_envelope(tmp_path):
    for name, argv in commands(tmp_path).items():
        p = hk(*argv, "--json")
        assert p.returncode in (0, 2), (name, p.stderr)
        doc = json.loads(p.stdout)
        envelope_ok(doc, name.replace(" --dry-run", "").replace(" example", ""))
        if name in ("verify", "verify example", "plan", "apply --dry-run"):
            assert {"results", "failures", "summary"} <= set(doc), name
    doc = json.loads(hk("verify", "--json").stdout)
    assert (doc["profile"], doc["profile_source"]) == ("hk-inference", "default")
    doc = json.loads(hk("placement", "--json").stdout)
    assert doc["profile"] is None and doc["cpus"] == sorted(os.sched_getaffinity(0))
    doc = json.loads(hk("mps", "status", "-p", EXAMPLE, "--json").stdout)
    assert doc["profile"] == EXAMPLE and doc["alive"] is False
    doc = json.loads(hk("facts", "--only", "sysctl", "--json").stdout)
    assert doc["facts"]["sysctl"]["net.ipv4.tcp_mtu_probing"] in ("0", "1", "2")


@pytest.mark.parametrize("argv", [["verify"], ["verify", "--json"], ["facts"], ["plan"], ["profiles", "list"],
                                  ["man"], ["completion", "bash"]])
def test_broken_pipe_is_quiet(argv):
    """`hkgpu-tune verify | head -0`: the reader is gone; no traceback, no message, the command's code."""
    cmd = " ".join([sys.executable, "-m", "hkgpu_tune", *argv]) + " | head -0"
    p = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, cwd=ROOT,
                       timeout=120, env={**os.environ, "HKGPU_TUNE_ETC_DIR": "/nonexistent-hkgpu-etc"})
    alone = hk(*argv)
    assert p.stderr == "", p.stderr
    assert p.returncode == alone.returncode


def test_errors_go_to_stderr_in_one_line(tmp_path):
    for argv in (["verify", "-p", str(tmp_path / "nope.yaml")], ["verify", "--json", "-p", str(tmp_path / "x.yaml")],
                 ["profiles", "show", "nope"], ["mps", "status", "-p", "hk-latency"],
                 ["triton", "command", "-p", "hk-latency"]):
        p = hk(*argv)
        assert p.returncode == 1 and p.stdout == "", (argv, p.stdout)
        assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith("hkgpu-tune: error: "), (argv, p.stderr)
        assert not REPR.search(p.stderr), p.stderr


NO_GPU = ctypes.util.find_library("nvidia-ml") is None and not os.path.exists("/dev/nvidia0")


@pytest.mark.skipif(not NO_GPU, reason="checks a host without a GPU or NVIDIA driver")
def test_shipped_gpu_settings_are_unsupported_without_a_gpu():
    """hk-inference asks for persistence and compute mode: without NVML they are `unsupported`
    with NVML's reason, required, so verify exits 2 (the README's rule for a required setting)."""
    p = hk("verify", "--only", "gpu", "--json")
    doc = json.loads(p.stdout)
    rows = {r["key"]: r for r in doc["results"]}
    assert {"persistence", "compute_mode"} <= set(rows)
    assert rows["persistence"]["desired"] is True and rows["compute_mode"]["desired"] == "default"
    for r in rows.values():
        assert r["status"] == "unsupported" and r["required"] and "NVML" in r["reason"], r
    assert p.returncode == 2
    table = hk("verify", "--only", "gpu").stdout
    assert re.search(r"^persistence\s+-\s+on\s+unsupported: NVML", table, re.M), table
    # the NIC interrupt placement: no mlx5 NIC here
    doc = json.loads(hk("verify", "--only", "affinity", "--json").stdout)
    irq = [r for r in doc["results"] if r["key"] == "irq_affinity"]
    assert irq and irq[0]["status"] == "unsupported" and irq[0]["desired"] == "local"


def test_example_triton_profile_loads():
    from hkgpu_tune.core.profile import load_profile
    from hkgpu_tune.subsystems import triton
    p = load_profile(EXAMPLE)
    assert {"network", "sysctl", "gpu", "mps", "affinity", "triton"} <= set(p.sections)
    t = triton.check_models(triton.section(p))   # the config against Triton's own schema
    assert [m.name for m in t.models] == ["resnet50"] and t.gate.p99_ms == 15
