"""tcp_buffers: TCP buffer maxima from bandwidth x RTT, never below the seed's floor unless asked;
the plan shows the arithmetic; apply writes them (checked with sysctl in a namespace)."""
import json
import os
import subprocess
import sys

import pytest

from .netns import sh

BUF = ("net.core.rmem_max", "net.core.wmem_max", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem")


def hk(*args, ns=None):
    pre = ["ip", "netns", "exec", ns] if ns else []
    return subprocess.run(pre + [sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True)


def plan(tmp_path, text):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    p = hk("plan", "-p", str(f), "--only", "sysctl", "--json")
    assert p.returncode in (0, 2), p.stderr
    return {r["key"]: r for r in json.loads(p.stdout)["results"] if r["key"] in BUF}


WAN = "network:\n  wan_peers:\n    - {address: 198.18.0.9, name: sg, rtt_ms: 38}\n    - {address: 198.18.0.10, name: tyo, rtt_ms: 52}\n"


def test_small_path_keeps_the_seed_floor(tmp_path):
    rows = plan(tmp_path, "sysctl:\n  net.ipv4.tcp_mtu_probing: 1\ntcp_buffers:\n  wan: {bandwidth_gbit: 10, rtt_ms: 60}\n")
    assert rows["net.core.rmem_max"]["desired"] == "268435456"
    assert rows["net.ipv4.tcp_rmem"]["desired"] == "4096 87380 268435456"
    assert rows["net.ipv4.tcp_wmem"]["desired"] == "4096 65536 268435456"
    why = rows["net.core.wmem_max"]["reason"]
    assert ("tcp_buffers: wan: 10 Gbit/s x 60 ms = 75,000,000 B BDP x 2 = 150,994,944 B (144 MiB); "
            "floor 268,435,456 (the seed's) -> 268,435,456") in why


def test_long_fat_path_raises_the_maxima_with_the_arithmetic(tmp_path):
    rows = plan(tmp_path, WAN + "sysctl:\n  net.ipv4.tcp_rmem: 4096 131072 268435456\n"
                "tcp_buffers:\n  fabric: {bandwidth_gbit: 200, rtt_ms: 0.1}\n  wan: {bandwidth_gbit: 100}\n")
    assert rows["net.core.rmem_max"]["desired"] == "1300234240"
    assert rows["net.ipv4.tcp_rmem"]["desired"] == "4096 131072 1300234240"    # min and default kept
    assert rows["net.ipv4.tcp_wmem"]["desired"] == "4096 65536 1300234240"
    why = rows["net.ipv4.tcp_rmem"]["reason"]
    assert "fabric: 200 Gbit/s x 0.1 ms = 2,500,000 B BDP x 2 = 5,242,880 B (5 MiB)" in why
    assert "wan: 100 Gbit/s x 52 ms (largest wan_peers rtt_ms) = 650,000,000 B BDP x 2 = 1,300,234,240 B (1240 MiB)" in why
    assert why.endswith("-> 1,300,234,240")


def test_below_the_floor_only_when_asked_and_capped_at_int_max(tmp_path):
    # `sysctl: {}`: tcp_buffers works through the sysctl subsystem, which a sysctl section brings
    rows = plan(tmp_path, "sysctl: {}\ntcp_buffers:\n  lan: {bandwidth_gbit: 1, rtt_ms: 10}\n  min_bytes: 4194304\n")
    assert rows["net.core.rmem_max"]["desired"] == "4194304"
    assert "floor 4,194,304 (min_bytes) -> 4,194,304" in rows["net.core.rmem_max"]["reason"]
    rows = plan(tmp_path, "sysctl: {}\ntcp_buffers:\n  far: {bandwidth_gbit: 400, rtt_ms: 300}\n")
    assert rows["net.core.rmem_max"]["desired"] == "2147483647"
    assert "capped at the kernel's 2,147,483,647" in rows["net.core.rmem_max"]["reason"]


@pytest.mark.parametrize("text, line, msg", [
    ("tcp_buffers:\n  wan: {bandwidth_gbit: 10}\n", 2,
     "tcp_buffers.wan.rtt_ms: missing, and no network.wan_peers[].rtt_ms to take it from"),
    ("tcp_buffers:\n  wan: {bandwidth_gbit: -1, rtt_ms: 5}\n", 2,
     "tcp_buffers.wan.bandwidth_gbit: expected Gbit/s (more than 0, at most 3200), got '-1'"),
    ("tcp_buffers:\n  wan: {bandwidth_gbit: 1, rtt: 5}\n", 2, "tcp_buffers.wan.rtt: unknown key; did you mean 'rtt_ms'?"),
    ("tcp_buffers:\n  wan: 10\n", 2, "tcp_buffers.wan: expected a peer group {bandwidth_gbit: N, rtt_ms: M} (or min_bytes, headroom)"),
    ("tcp_buffers:\n  min_bytes: 1\n  wan: {bandwidth_gbit: 1, rtt_ms: 5}\n", 2,
     "tcp_buffers.min_bytes: expected an integer 4096-2147483647, got 1"),
])
def test_bad_tcp_buffers_is_one_line(tmp_path, text, line, msg):
    f = tmp_path / "p.yaml"
    f.write_text("sysctl:\n  net.ipv4.tcp_mtu_probing: 1\n" + text)
    p = hk("plan", "-p", str(f))
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr == f"hkgpu-tune: error: {f}:{line + 2}: {msg}\n"


@pytest.mark.root
def test_apply_writes_the_derived_maxima_in_a_namespace(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    ns = f"hkbl-tb{os.getpid()}"
    sh("ip", "netns", "add", ns)
    try:
        before = sh("sysctl", "-n", "net.ipv4.tcp_rmem", ns=ns).stdout.split()
        f = tmp_path / "p.yaml"
        f.write_text(WAN + "sysctl: {}\ntcp_buffers:\n  wan: {bandwidth_gbit: 25}\n")
        st = tmp_path / "state"
        p = hk("apply", "-p", str(f), "--state-dir", str(st), "--json", ns=ns)
        want = str(25 * 10 ** 9 // 8 * 52 // 1000 * 2 // (1 << 20) * (1 << 20) + (1 << 20))   # 325,000,000 B -> 310 MiB
        assert want == "325058560"
        # rmem_max/wmem_max are global: read-only in a namespace (unsupported), tcp_rmem/wmem are its own
        # the maxima raised to the derived size (at_least: a larger min or default already there stays)
        rmem = sh("sysctl", "-n", "net.ipv4.tcp_rmem", ns=ns).stdout.split()
        assert rmem[2] == want and int(rmem[1]) >= 87380 and rmem[:2] == before[:2], p.stdout + p.stderr
        assert sh("sysctl", "-n", "net.ipv4.tcp_wmem", ns=ns).stdout.split()[2] == want
        res = {r["key"]: r["status"] for r in json.loads(p.stdout)["results"]}
        assert res["net.ipv4.tcp_rmem"] == "ok" and res["net.core.rmem_max"] == "unsupported"
        r = hk("rollback", "-p", str(f), "--state-dir", str(st), ns=ns)
        assert r.returncode == 0, r.stderr
        assert sh("sysctl", "-n", "net.ipv4.tcp_rmem", ns=ns).stdout.split() == before
    finally:
        sh("ip", "netns", "del", ns, check=False)


def test_tcp_buffers_without_a_sysctl_section_still_plans_and_shows_the_arithmetic(tmp_path):
    """No `sysctl:` section: tcp_buffers alone brings the sysctl subsystem (it did nothing, silently);
    the plan's table says how the size was reached, once, within 80 columns."""
    text = WAN + "tcp_buffers:\n  wan: {bandwidth_gbit: 100}\n"
    rows = plan(tmp_path, text)
    assert sorted(rows) == sorted(BUF) and rows["net.core.rmem_max"]["desired"] == "1300234240"
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "plan", "-p", str(tmp_path / "p.yaml")],
                       capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"})
    assert p.returncode in (0, 2), p.stderr
    assert not [ln for ln in p.stdout.splitlines() if len(ln) > 80], p.stdout
    flat = " ".join(p.stdout.split())
    assert flat.count("100 Gbit/s x 52 ms (largest wan_peers rtt_ms) = 650,000,000 B BDP x 2 = 1,300,234,240 B") == 1, p.stdout
    assert "net.core.rmem_max, net.core.wmem_max, net.ipv4.tcp_rmem, net.ipv4.tcp_wmem: tcp_buffers:" in flat


def test_persist_writes_the_derived_maxima_for_the_reboot():
    """sysctl.d gets the sizes apply set from tcp_buffers (it had only the sysctl section's keys),
    with the arithmetic as a comment."""
    from hkgpu_tune.tune.persist import sysctl_conf
    from hkgpu_tune.core.profile import parse_profile_text
    conf = sysctl_conf(parse_profile_text(WAN + "sysctl:\n  net.ipv4.tcp_mtu_probing: 1\n  net.ipv4.tcp_rmem: 4096 131072 1\n"
                                          "tcp_buffers:\n  wan: {bandwidth_gbit: 100}\n"), [])
    lines = [ln for ln in conf.splitlines() if not ln.startswith("#")]
    assert lines == ["net.ipv4.tcp_mtu_probing = 1", "net.ipv4.tcp_rmem = 4096 131072 1300234240",
                     "net.core.rmem_max = 1300234240", "net.core.wmem_max = 1300234240",
                     "net.ipv4.tcp_wmem = 4096 65536 1300234240"]
    assert "# tcp_buffers: wan: 100 Gbit/s x 52 ms" in conf
