"""Against the real kernel: veth pairs in namespaces, the real CLI, real ping, real tc."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from .conftest import sh, statuses

pytestmark = pytest.mark.root


def profile(tmp_path, pair, qdisc="pfifo_fast", extra="", sysctl="  net.ipv4.tcp_mtu_probing: 1\n"):
    f = tmp_path / "p.yaml"
    f.write_text(f"""\
network:
  interfaces:
    - match: {{name: {pair.a}}}
      mtu: 9000
      channels: {{combined: max}}
      rings: {{rx: max, tx: max}}
      offloads: {{gro: true, gso: true, tso: true, lro: false}}
      qdisc: {qdisc}
  fabric_peers: [{pair.ipb}]
{extra}sysctl:
{sysctl}""")
    return str(f)


def failures(doc):
    return {(r["target"], r["key"]): r["status"] for r in doc["failures"]}


def test_apply_verify_drift_rollback(pair, tmp_path):
    sh("ip", "link", "set", pair.b, "mtu", "9000", ns=pair.B)
    p = profile(tmp_path, pair)
    st = tmp_path / "state"
    chan_before = sh("ethtool", "-l", pair.a, ns=pair.A).stdout.split("Current hardware settings:")[1]
    rc, doc = pair.hkjson("apply", "--profile", p, state=st)
    assert doc["error"] == "", doc["error"]
    # rings are not on veth: unsupported (required), everything else ok
    assert failures(doc) == {(pair.a, "rings rx"): "unsupported", (pair.a, "rings tx"): "unsupported"}
    assert rc == 2
    s = statuses(doc)
    assert s[("link", pair.a, "mtu")] == "ok"
    assert s[("qdisc", pair.a, "queue 2")] == "ok"
    assert s[("ethtool", pair.a, "channels rx")] == "ok"
    # the kernel's own view agrees
    assert "mtu 9000" in sh("ip", "link", "show", pair.a, ns=pair.A).stdout
    tcq = sh("tc", "qdisc", "show", "dev", pair.a, ns=pair.A).stdout
    assert "qdisc mq 1: root" in tcq and tcq.count("pfifo_fast") == 2
    assert "generic-receive-offload: on" in sh("ethtool", "-k", pair.a, ns=pair.A).stdout
    assert sh("sysctl", "-n", "net.ipv4.tcp_mtu_probing", ns=pair.A).stdout.strip() == "1"

    # drift by hand: exactly those keys
    sh("ip", "link", "set", pair.a, "mtu", "1500", ns=pair.A)
    sh("ethtool", "-K", pair.a, "gro", "off", ns=pair.A)
    rc, doc = pair.hkjson("verify", "--profile", p, "--only", "link,ethtool,qdisc,sysctl")
    drift = {k for k, v in failures(doc).items() if v == "drift"}
    assert drift == {(pair.a, "mtu"), (pair.a, "gro")} and rc == 2

    # rollback restores the originals
    r = pair.hk("rollback", "--profile", p, state=st)
    assert r.returncode == 0, r.stderr
    assert "mtu 1500" in sh("ip", "link", "show", pair.a, ns=pair.A).stdout
    assert "qdisc noqueue" in sh("tc", "qdisc", "show", "dev", pair.a, ns=pair.A).stdout
    assert "generic-receive-offload: off" in sh("ethtool", "-k", pair.a, ns=pair.A).stdout
    assert sh("sysctl", "-n", "net.ipv4.tcp_mtu_probing", ns=pair.A).stdout.strip() == "0"
    assert sh("ethtool", "-l", pair.a, ns=pair.A).stdout.split("Current hardware settings:")[1] == chan_before
    assert not (st / "state.json").exists()


def test_mtu_probe_fails_when_peer_stays_at_1500(pair, tmp_path):
    p = profile(tmp_path, pair)
    rc, doc = pair.hkjson("apply", "--profile", p, "--only", "link", state=tmp_path / "st")
    assert rc == 1
    assert f"fabric peer {pair.ipb} did not answer a 8972-byte don't-fragment ping" in doc["error"]
    assert doc["rolled_back"]
    assert "mtu 1500" in sh("ip", "link", "show", pair.a, ns=pair.A).stdout


def test_mtu_probe_passes_at_9000(pair, tmp_path):
    sh("ip", "link", "set", pair.b, "mtu", "9000", ns=pair.B)
    p = profile(tmp_path, pair)
    rc, doc = pair.hkjson("apply", "--profile", p, "--only", "link", state=tmp_path / "st")
    assert rc == 0 and doc["error"] == ""
    assert "mtu 9000" in sh("ip", "link", "show", pair.a, ns=pair.A).stdout
    assert sh("ping", "-c1", "-M", "do", "-s", "8972", "-W", "1", pair.ipb, ns=pair.A).returncode == 0


def test_wan_route_mtu_and_wan_peer(pair, tmp_path):
    """Cross-border prefixes keep 1500 while the fabric runs 9000; WAN peers checked at 1472."""
    sh("ip", "link", "set", pair.b, "mtu", "9000", ns=pair.B)
    sh("ip", "addr", "add", "198.19.7.1/32", "dev", "lo", ns=pair.B)
    extra = (f"  wan_peers: [{{address: 198.19.7.1, name: singapore, rtt_ms: 35}}]\n"
             f"  wan_routes: [{{prefix: 198.19.0.0/16, via: {pair.ipb}, mtu: 1500}}]\n")
    p = profile(tmp_path, pair, extra=extra)
    rc, doc = pair.hkjson("apply", "--profile", p, "--only", "link", state=tmp_path / "st")
    assert doc["error"] == "" and rc == 0, doc
    assert "mtu 1500" in sh("ip", "route", "show", "198.19.0.0/16", ns=pair.A).stdout
    assert sh("ping", "-c1", "-M", "do", "-s", "1472", "-W", "1", "198.19.7.1", ns=pair.A).returncode == 0
    r = pair.hk("rollback", state=tmp_path / "st")
    assert r.returncode == 0, r.stderr
    assert sh("ip", "route", "show", "198.19.0.0/16", ns=pair.A).stdout.strip() == ""


def test_sysctls_in_a_namespace(pair, tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("sysctl:\n  net.ipv4.tcp_rmem: 4096 87380 268435456\n  net.core.rmem_max: 1073741824\n"
                 "  net.core.netdev_max_backlog: 250000\n")
    rc, doc = pair.hkjson("apply", "--profile", str(f), state=tmp_path / "st")
    s = statuses(doc)
    assert doc["error"] == ""
    assert s[("sysctl", "host", "net.ipv4.tcp_rmem")] == "ok"
    assert sh("sysctl", "-n", "net.ipv4.tcp_rmem", ns=pair.A).stdout.split()[-1] == "268435456"
    # global keys are read-only from a non-initial namespace; netdev_max_backlog is not there at all
    r = {x["key"]: x for x in doc["results"]}
    assert r["net.core.rmem_max"]["status"] == "unsupported" and "read-only" in r["net.core.rmem_max"]["reason"]
    assert r["net.core.netdev_max_backlog"]["status"] == "unsupported"
    assert pair.hk("rollback", state=tmp_path / "st").returncode == 0
    assert sh("sysctl", "-n", "net.ipv4.tcp_rmem", ns=pair.A).stdout.split()[-1] != "268435456"


def test_global_sysctl_restored_by_rollback(tmp_path):
    """In the initial namespace: raise net.core.rmem_max, then the tool's own rollback restores it."""
    path = "/proc/sys/net/core/rmem_max"
    before = open(path).read().strip()
    f = tmp_path / "g.yaml"
    f.write_text(f"sysctl:\n  net.core.rmem_max: {int(before) + 4096}\n")
    st = tmp_path / "st"
    try:
        p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "apply", "--profile", str(f), "--state-dir", str(st),
                            "--json"], capture_output=True, text=True)
        assert json.loads(p.stdout)["summary"]["ok"] == 1, p.stdout + p.stderr
        assert open(path).read().strip() == str(int(before) + 4096)
        p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "rollback", "--state-dir", str(st)],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    finally:
        now = open(path).read().strip()
        if now != before:
            open(path, "w").write(before)
            pytest.fail(f"rollback did not restore net.core.rmem_max ({now} != {before})")


def test_fq_codel_unsupported_here_or_ok_where_present(pair, tmp_path):
    from hkgpu_tune.backends.netlink import Tc
    tc = Tc()
    have, why = tc.supported("fq_codel")
    tc.close()
    sh("ip", "link", "set", pair.b, "mtu", "9000", ns=pair.B)
    p = profile(tmp_path, pair, qdisc="fq_codel")
    rc, doc = pair.hkjson("apply", "--profile", p, "--only", "qdisc", state=tmp_path / "st")
    s = statuses(doc)
    if have:
        assert s[("qdisc", pair.a, "queue 1")] == "ok"
        assert "fq_codel" in sh("tc", "qdisc", "show", "dev", pair.a, ns=pair.A).stdout
    else:
        assert s[("qdisc", pair.a, "queue 1")] == "unsupported"
        r = next(x for x in doc["results"] if x["key"] == "queue 1")
        assert "fq_codel is unsupported by this kernel" in r["reason"]
        assert "noqueue" in sh("tc", "qdisc", "show", "dev", pair.a, ns=pair.A).stdout  # untouched
        assert rc == 2


def test_qdisc_drift_on_one_queue(pair, tmp_path):
    p = profile(tmp_path, pair)
    pair.hk("apply", "--profile", p, "--only", "qdisc", state=tmp_path / "st")
    sh("tc", "qdisc", "replace", "dev", pair.a, "parent", "1:2", "pfifo", "limit", "100", ns=pair.A)
    rc, doc = pair.hkjson("verify", "--profile", p, "--only", "qdisc")
    assert failures(doc) == {(pair.a, "queue 2"): "drift"}
    pair.hk("apply", "--profile", p, "--only", "qdisc", state=tmp_path / "st")
    rc, doc = pair.hkjson("verify", "--profile", p, "--only", "qdisc")
    assert rc == 0 and not doc["failures"]
    pair.hk("rollback", state=tmp_path / "st")
    assert "noqueue" in sh("tc", "qdisc", "show", "dev", pair.a, ns=pair.A).stdout


def probe_pings(ns: str, addr: str) -> list[int]:
    """Pids of ping processes to addr running inside network namespace ns."""
    want = os.stat(f"/run/netns/{ns}").st_ino
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if os.path.basename(argv[0]) == b"ping" and addr.encode() in argv \
                    and os.stat(f"/proc/{pid}/ns/net").st_ino == want:
                pids.append(int(pid))
        except OSError:
            continue   # gone meanwhile
    return pids


def test_kill_9_during_apply_then_rollback(pair, tmp_path):
    """A peer that never answers keeps apply in its MTU probe, which runs only after every write;
    kill -9 it once its ping is running in the namespace, then roll back."""
    extra = "  probe: {count: 5, timeout_s: 5}\n"
    silent = f"198.18.{pair.net}.77"
    p2 = tmp_path / "k.yaml"
    p2.write_text(open(profile(tmp_path, pair, extra=extra)).read().replace(pair.ipb, silent))
    st = tmp_path / "st"
    argv = ["ip", "netns", "exec", pair.A, sys.executable, "-m", "hkgpu_tune", "apply", "--profile", str(p2),
            "--state-dir", str(st)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        end = time.monotonic() + 30
        while not probe_pings(pair.A, silent):
            assert time.monotonic() < end and proc.poll() is None, "apply never reached the probe"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (st / "state.json").exists()
    assert "mtu 9000" in sh("ip", "link", "show", pair.a, ns=pair.A).stdout
    assert "generic-receive-offload: on" in sh("ethtool", "-k", pair.a, ns=pair.A).stdout
    assert "qdisc mq 1: root" in sh("tc", "qdisc", "show", "dev", pair.a, ns=pair.A).stdout
    r = pair.hk("rollback", state=st)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mtu 1500" in sh("ip", "link", "show", pair.a, ns=pair.A).stdout
    assert "generic-receive-offload: off" in sh("ethtool", "-k", pair.a, ns=pair.A).stdout
    assert "noqueue" in sh("tc", "qdisc", "show", "dev", pair.a, ns=pair.A).stdout
    assert sh("sysctl", "-n", "net.ipv4.tcp_mtu_probing", ns=pair.A).stdout.strip() == "0"


def test_persist_writes_and_rollback_removes(pair, tmp_path):
    root = tmp_path / "root"
    (root / "etc/systemd/network").mkdir(parents=True)
    (root / "etc/systemd/network/10-data.network").write_text(f"[Match]\nName={pair.a}\n")
    sh("ip", "link", "set", pair.b, "mtu", "9000", ns=pair.B)
    p = profile(tmp_path, pair)
    st = tmp_path / "st"
    rc, doc = pair.hkjson("apply", "--profile", p, "--persist", "--root", str(root), state=st)
    assert doc["error"] == ""
    conf = (root / "etc/sysctl.d/60-hkgpu-tune.conf").read_text()
    assert "net.ipv4.tcp_mtu_probing = 1" in conf
    assert "MTUBytes=9000" in (root / "etc/systemd/network/10-data.network.d/60-hkgpu-tune.conf").read_text()
    unit = (root / "etc/systemd/system/hkgpu-tune.service").read_text()
    assert "--only ethtool,qdisc" in unit  # networkd owns the MTU, so the unit leaves it alone
    assert (root / "etc/systemd/system/multi-user.target.wants/hkgpu-tune.service").is_symlink()
    assert pair.hk("rollback", state=st).returncode == 0
    left = sorted(str(x.relative_to(root)) for x in root.rglob("*") if x.is_file())
    assert left == ["etc/systemd/network/10-data.network"]


def test_no_interface_touched_outside_the_namespace(pair, tmp_path):
    """The default profile matches by driver; in the namespace nothing matches and nothing changes."""
    rc, doc = pair.hkjson("plan", "--only", "link,ethtool,qdisc")
    assert doc["changes"] == []
