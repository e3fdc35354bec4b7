"""Hostile profiles given to the real CLI (`python -m hkgpu_tune plan --profile FILE`): exit 1, one
line naming file:line and the key, no traceback, nothing changed; bounded time and memory."""
import os
import resource
import subprocess
import sys

import pytest

from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.profile import load_profile, parse_profile_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 30
MEM_LIMIT = 512 << 20      # address space for the CLI: a profile never needs more


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))


def plan(path, tmp_path):
    """`plan --profile path` in its own process, memory-capped; a hang is a failure, not a stuck run."""
    state = tmp_path / "state"
    try:
        p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "plan", "--profile", str(path),
                            "--state-dir", str(state)], capture_output=True, text=True, cwd=ROOT,
                           timeout=TIMEOUT, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"plan --profile {path} did not finish in {TIMEOUT} s (blocked reading it?)")
    assert not state.exists(), "a refused profile must change nothing"
    return p


def refused(p, where):
    """Exit 1, one line on stderr naming `where` (file:line: key), no traceback, no report."""
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert where in lines[0], (where, lines[0])
    assert p.stdout == ""
    return lines[0]


def laughs(levels=9):
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    prev = "a"
    for name in "bcdefghijk"[:levels - 1]:
        text += f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]\n"
        prev = name
    return text


# (profile text, what the error line must contain): each of these passed or crashed before
HOSTILE = {
    # injection: a line break in a name reaches the sysctl.d comment, NUL/ESC reach /proc/sys and unit files
    "newline in name": ('name: "x\\nkernel.core_pattern = |/bin/sh"\n', ":1: name: contains the control character"),
    "NUL in sysctl value": ('sysctl:\n  net.ipv4.tcp_mtu_probing: "1\\0"\n',
                            ":2: sysctl.net.ipv4.tcp_mtu_probing: contains the control character"),
    "escape in interface name": ('network:\n  interfaces:\n    - match: {name: "eth\\e[2J"}\n',
                                 ":3: network.interfaces[0].match.name: contains the control character"),
    "line separator in description": ('description: "a\\Lb"\n', ":1: description: contains the control character"),
    "sysctl value too long": ("sysctl:\n  kernel.domainname: " + "x" * 2000 + "\n",
                              ":2: sysctl.kernel.domainname: a sysctl value longer than 1024"),
    "sysctl key with a slash": ("sysctl:\n  net.ipv4.conf.a/b.rp_filter: 1\n", ":2: sysctl.net.ipv4.conf.a/b.rp_filter: not a sysctl key"),
    # unusual YAML
    "python object tag": ("name: !!python/object/apply:os.system [id]\n", ":1: name: the tag !!python/object/apply:os.system"),
    "binary tag": ("description: !!binary aGVsbG8=\n", ":1: description: the tag !!binary"),
    "impossible date": ("sysctl:\n  kernel.hostname: 2024-13-45\n", ":2: sysctl.kernel.hostname: '2024-13-45' reads as a date"),
    "huge hex integer": ("sysctl:\n  net.core.rmem_max: 0x" + "f" * 3000 + "\n", ":2: sysctl.net.core.rmem_max: an integer out of range"),
    "70-bit integer": ("sysctl:\n  net.core.rmem_max: " + str(1 << 70) + "\n", ":2: sysctl.net.core.rmem_max: an integer out of range"),
    "merge key": ("x: &x {net.core.rmem_max: 1}\nsysctl:\n  <<: *x\n", ":3: sysctl.<<: merge keys"),
    "deep nesting": ("sysctl: " + "[" * 50000 + "]" * 50000 + "\n", ":1: not valid YAML: nested deeper than 32"),
    "billion laughs": (laughs() + "sysctl: {net.core.rmem_max: *i}\n", ":5: e: more than 20000 values once aliases"),
    "non-mapping top level": ("- sysctl\n- network\n", ":1: (top): expected a mapping, got a list"),
    "non-string key": ("? [a, b]\n: 1\n", ":1: (top): keys must be plain strings"),
    "duplicate key": ("sysctl:\n  net.core.rmem_max: 1\n  net.core.rmem_max: 2\n", ":3: sysctl.net.core.rmem_max: duplicate key"),
    # combinations of rules
    "one NIC pinned two ways": ("affinity:\n  nics:\n    - {match: {name: eth1}, irq_cpus: 0-3}\n"
                                "    - {match: {name: eth1}, irq_cpus: 4-7}\n",
                                ":4: affinity.nics[1]: match name=eth1 is already given at line 3 with irq_cpus 0-3"),
    "one service on two GPUs": ("affinity:\n  services:\n    - {name: tritonserver, gpu: 0}\n"
                                "    - {name: tritonserver, gpu: 1}\n",
                                ":4: affinity.services[1]: service tritonserver is already placed at line 3"),
    "reversed CPU range": ("affinity:\n  nics:\n    - {match: {name: eth1}, irq_cpus: 7-2}\n",
                           ":3: affinity.nics[0].irq_cpus: expected CPU ranges low-high"),
}


@pytest.mark.parametrize("case", list(HOSTILE), ids=list(HOSTILE))
def test_hostile_profile_refused_by_the_cli(tmp_path, case):
    text, where = HOSTILE[case]
    f = tmp_path / "hostile.yaml"
    f.write_text(text)
    refused(plan(f, tmp_path), f"{f}{where}")


def test_billion_laughs_fails_fast_with_little_memory(tmp_path):
    """Ten levels of nine aliases (10^9 strings if expanded): refused in well under a second of CPU
    time (not wall time: another process may hold the CPUs), in
    a process whose peak memory stays that of a bare import."""
    f = tmp_path / "laughs.yaml"
    f.write_text(laughs(10) + "sysctl: {net.core.rmem_max: *j}\n")
    code = ("import resource, sys, time\n"
            "from hkgpu_tune.core.profile import load_profile\n"
            "from hkgpu_tune.core.errors import ProfileError\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "t = time.process_time()\n"
            "try:\n    load_profile(sys.argv[1])\nexcept ProfileError as e:\n    print(e)\n"
            "print(time.process_time() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n")
    p = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True, cwd=ROOT,
                       timeout=TIMEOUT, preexec_fn=_limit_memory)
    assert p.returncode == 0, p.stderr
    msg, numbers = p.stdout.strip().splitlines()
    assert "once aliases are expanded" in msg and msg.startswith(f"{f}:")
    seconds, grew_kib = numbers.split()
    assert float(seconds) < 0.5 and int(grew_kib) < 20 * 1024, numbers


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_only_regular_files_are_read(tmp_path, kind):
    """A FIFO with no writer would block a plain open(); /dev/zero would fill memory."""
    if kind == "fifo":
        path = tmp_path / "p.yaml"
        os.mkfifo(path)
    elif kind == "device":
        path = "/dev/zero"
    else:
        path = tmp_path / "d.yaml"
        path.mkdir()
    refused(plan(path, tmp_path), f"{path}: not a regular file")


def test_oversized_file(tmp_path):
    f = tmp_path / "big.yaml"
    f.write_text("description: x\n" + "#" * (2 << 20) + "\n")
    refused(plan(f, tmp_path), f"{f}: larger than 1048576 bytes")


def test_a_bare_name_is_a_shipped_profile_even_with_a_file_of_that_name_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hk-latency").write_text("name: planted\nsysctl: {net.core.somaxconn: 7}\n")
    p = load_profile("hk-latency")
    assert p.name == "hk-latency" and "net.core.somaxconn" not in {s.key for s in p.sysctl}
    assert load_profile("./hk-latency").name == "planted"      # a slash names the file


def test_a_bare_name_that_is_not_shipped_is_a_clear_error(tmp_path):
    p = plan("hk-nope", tmp_path)
    line = refused(p, "'hk-nope': no shipped profile of that name (shipped: hk-inference, hk-latency)")
    assert "./hk-nope.yaml" in line


def test_sysctl_keys_map_under_proc_sys():
    for key in ("net.core.rmem_max", "net.ipv4.conf.enP1s0.rp_filter", "net.ipv6.conf.eth-1.mtu"):
        s = parse_profile_text(f"sysctl:\n  {key}: 1\n").sysctl[0]
        assert s.path == "/proc/sys/" + key.replace(".", "/") and os.path.normpath(s.path) == s.path
    for key in ("net", "net.", ".net.core", "net..core", "net.core.x y", "Net.core.x", "net.core." + "x" * 300):
        with pytest.raises(ProfileError, match="not a sysctl key"):
            parse_profile_text(f"sysctl:\n  '{key}': 1\n")
