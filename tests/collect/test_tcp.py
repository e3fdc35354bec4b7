"""tcp: /proc/net/snmp and /proc/net/netstat, checked against nstat (iproute2)."""
import os
import shutil

import pytest

from hkgpu_tune.observe.collect import tcp

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "monitor")


def recorded():
    out = {}
    for k in ("snmp", "netstat"):
        with open(os.path.join(FIX, f"proc-net-{k}.txt")) as f:
            out[k] = f.read()
    return out


def test_recorded_proc_files():
    t = tcp.read(recorded())
    for k in ("retrans_segs", "out_segs", "in_segs", "in_errs", "out_rsts", "curr_estab",   # Tcp:
              "tcp_lost_retransmit", "listen_drops", "tcp_timeouts", "tcp_syn_retrans"):       # TcpExt:
        assert isinstance(t[k], int), k
    assert "rto_algorithm" in t and "ip_ext" not in str(t.keys())


def test_snake_case_names():
    assert [tcp.snake(x) for x in ("RetransSegs", "TCPLostRetransmit", "ListenDrops", "InCsumErrors")] == \
        ["retrans_segs", "tcp_lost_retransmit", "listen_drops", "in_csum_errors"]


def test_missing_tcp_section_is_an_error():
    with pytest.raises(ValueError, match="RetransSegs"):
        tcp.read({"snmp": "Ip: Forwarding\nIp: 1\n", "netstat": ""})


@pytest.mark.skipif(not shutil.which("nstat"), reason="needs nstat (iproute2)")
def test_live_counters_match_nstat():
    import subprocess
    before = tcp.read()
    out = subprocess.run(["nstat", "-az", "TcpOutSegs", "TcpRetransSegs"], capture_output=True, text=True).stdout
    n = {ln.split()[0]: int(ln.split()[1]) for ln in out.splitlines() if ln.startswith("Tcp")}
    after = tcp.read()
    assert before["out_segs"] <= n["TcpOutSegs"] <= after["out_segs"]
    assert before["retrans_segs"] <= n["TcpRetransSegs"] <= after["retrans_segs"]
