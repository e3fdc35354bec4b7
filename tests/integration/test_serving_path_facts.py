"""facts --only firewall,rdma in a namespace: nftables rules that name a serving port (read back
against `nft` itself), conntrack use against its limit (against /proc), and SR-IOV, RDMA and PFC
on veth: unsupported, each with its reason."""
import json
import shutil

import pytest

from .conftest import sh

pytestmark = pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables' nft (scripts/install.sh)")

PROFILE = "network:\n  interfaces: []\n"     # no triton section: Triton's own ports, 8000-8002


def facts(pair, tmp_path, text=PROFILE):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    p = pair.hk("facts", "--profile", str(f), "--only", "firewall,rdma", "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["facts"]


def nft(pair, *rule):
    sh("nft", *rule, ns=pair.A)


def test_rules_on_the_serving_ports(pair, tmp_path):
    nft(pair, "add table inet hk")
    nft(pair, "add chain inet hk input { type filter hook input priority 0; policy accept; }")
    nft(pair, "add set inet hk serving { type inet_service; elements = { 8001, 9999 }; }")
    nft(pair, "add rule inet hk input tcp dport 8000 drop")                 # a serving port
    nft(pair, "add rule inet hk input tcp dport @serving accept")            # through a named set
    nft(pair, "add rule inet hk input tcp dport 7990-8010 counter")        # a range over all three
    nft(pair, "add rule inet hk input tcp dport 22 accept")                  # not the serving path
    f = facts(pair, tmp_path)["firewall"]
    assert f["serving_ports"] == [8000, 8001, 8002]
    got = {(r["handle"], tuple(r["ports"]), r["verdict"]) for r in f["nftables"]["rules"]}
    # the rule handles as nft itself numbers them
    listing = sh("nft", "-a", "list", "chain", "inet", "hk", "input", ns=pair.A).stdout
    handles = {line.split("dport ")[1].split()[0]: int(line.rsplit("handle ", 1)[1])
               for line in listing.splitlines() if "dport" in line}
    assert got == {(handles["8000"], (8000,), "drop"), (handles["@serving"], (8001,), "accept"),
                   (handles["7990-8010"], (8000, 8001, 8002), None)}
    assert f["nftables"]["chains"] == [{"family": "inet", "table": "hk", "name": "input", "hook": "input",
                                        "prio": 0, "policy": "accept"}]


def test_conntrack_use_and_limit(pair, tmp_path):
    nft(pair, "add table inet hk")
    nft(pair, "add chain inet hk input { type filter hook input priority 0; }")
    nft(pair, "add rule inet hk input ct state established,related accept")   # conntrack in use
    # a connection inside the namespace (lo): tracked
    sh("python3", "-c", "import socket;s=socket.socket();s.bind(('127.0.0.1',8000));s.listen();"
       "c=socket.create_connection(('127.0.0.1',8000));a,_=s.accept();c.send(b'x');a.recv(1)", ns=pair.A)
    f = facts(pair, tmp_path)["firewall"]["conntrack"]
    proc_max = int(sh("cat", "/proc/sys/net/netfilter/nf_conntrack_max", ns=pair.A).stdout)
    assert f["max"] == proc_max and f["count"] >= 1 and 0 < f["used"] < 1


def test_sriov_rdma_pfc_on_veth_are_unsupported(pair, tmp_path):
    f = facts(pair, tmp_path)["rdma"]
    assert f["sriov"][pair.a] == {"unsupported": "a virtual interface: no PCI device behind it"}
    assert "no RDMA" in f["rdma"]["unsupported"]
    assert "Operation not supported" in f["dcb"][pair.a]["pfc"]["unsupported"]
    assert "no RoCE ECN" in f["dcb"][pair.a]["ecn"]["unsupported"]
