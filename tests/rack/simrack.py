#!/usr/bin/env python3
"""A simulated rack: N hosts, each a network namespace with its own eth0, /etc, state dir and sshd.

    python tests/rack/simrack.py up --hosts 4      # prints the inventory path
    python tests/rack/simrack.py down

Layout (all addresses in 198.18.0.0/15, the benchmark range):
  root namespace: bridge hkrack-br, 198.18.10.1/24, MTU 9000 (the rack's leaf switch)
  hkrack-fab:     an unmanaged fabric peer at 198.18.10.250, MTU 9000 (storage / other rack)
  hkrack-nN:      a host; veth eth0 198.18.10.(10+N)/24, MTU 1500 at start, sshd on eth0:22
Each host's /etc/hkgpu-tune, /etc/sysctl.d and /etc/systemd are its own (/etc/netns/NAME/...,
bind-mounted by `ip netns exec`); its state dir and venv live under the run directory.
No default route: the hosts reach only the bridge and each other.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

PREFIX = "hkrack-"
BRIDGE = "hkrack-br"
NET = "198.18.10"
GATEWAY = f"{NET}.1"
FABRIC_PEER = f"{NET}.250"
RUN_DIR = os.environ.get("HKRACK_DIR", "/var/tmp/hkrack")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))   # run as a script too
from tests.helpers import REPO, sh  # noqa: E402
# /etc entries each host gets its own copy of; `ip netns exec` binds only over existing /etc/X
PRIVATE_ETC = ("hkgpu-tune", "sysctl.d", "systemd")
MARK = "/etc/netns/.hkrack-created-etc.json"  # /etc dirs made for the bind mounts


def host_names(n: int) -> list[str]:
    return [f"{PREFIX}n{i}" for i in range(1, n + 1)]


def address(i: int) -> str:
    return f"{NET}.{10 + i}"


def _netns_add(name: str, addr: str, mtu: int) -> None:
    sh("ip", "netns", "add", name)
    peer = "hkr" + name[len(PREFIX):]          # temporary name of the host end before the move
    sh("ip", "link", "add", name, "type", "veth", "peer", "name", peer)
    sh("ip", "link", "set", name, "mtu", "9000", "master", BRIDGE, "up")
    sh("ip", "link", "set", peer, "netns", name)
    sh("ip", "link", "set", peer, "name", "eth0", ns=name)
    sh("ip", "link", "set", "eth0", "mtu", str(mtu), ns=name)
    sh("ip", "addr", "add", f"{addr}/24", "dev", "eth0", ns=name)
    sh("ip", "link", "set", "eth0", "up", ns=name)
    sh("ip", "link", "set", "lo", "up", ns=name)


def _keys(run: str) -> str:
    key = os.path.join(run, "id_ed25519")
    if not os.path.exists(key):
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hkrack-controller", "-f", key)
    return key


def _sshd(name: str, addr: str, run: str) -> None:
    d = os.path.join(run, name)
    os.makedirs(d, exist_ok=True)
    hostkey = os.path.join(d, "ssh_host_ed25519_key")
    if not os.path.exists(hostkey):
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostkey)
    conf = os.path.join(d, "sshd_config")
    with open(conf, "w") as f:
        f.write(f"""ListenAddress {addr}
HostKey {hostkey}
PidFile {d}/sshd.pid
AuthorizedKeysFile {run}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 200
MaxSessions 200
Subsystem sftp internal-sftp
""")
    os.makedirs("/run/sshd", exist_ok=True)
    sh("/usr/sbin/sshd", "-f", conf, ns=name)


def _private_etc(name: str) -> None:
    created = json.load(open(MARK)) if os.path.exists(MARK) else []
    for e in PRIVATE_ETC:
        if not os.path.exists(f"/etc/{e}"):
            os.makedirs(f"/etc/{e}")          # the bind mount needs a target
            created.append(f"/etc/{e}")
        os.makedirs(f"/etc/netns/{name}/{e}", exist_ok=True)
    # as on a real host: the unit directory and its wants directory exist
    os.makedirs(f"/etc/netns/{name}/systemd/system/multi-user.target.wants", exist_ok=True)
    with open(MARK, "w") as f:
        json.dump(created, f)


def _wait_ssh(addr: str, key: str, timeout=10.0) -> None:
    end = time.time() + timeout
    while True:
        r = sh("ssh", "-i", key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
               "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=2", f"root@{addr}", "true", check=False)
        if r.returncode == 0:
            return
        if time.time() > end:
            raise RuntimeError(f"sshd on {addr} did not answer: {r.stderr.strip()}")
        time.sleep(0.2)


def site_dirs(python: str) -> list[str]:
    out = sh(python, "-c", "import sys, sysconfig; print(sys.prefix != sys.base_prefix); "
             "print(sysconfig.get_path('purelib')); print(sysconfig.get_path('platlib'))").stdout.split()
    return sorted(set(out[1:])) if out[0] == "True" else []


def inventory(n: int, run: str, python: str | None) -> str:
    """An inventory directory: hosts.yml (connection, per-host paths) + group_vars of the simulated
    rack. python: the Python the node venv is made from (None: the role's default, the system's)."""
    inv = os.path.join(run, "inventory")
    os.makedirs(inv, exist_ok=True)
    key = os.path.join(run, "id_ed25519")
    hosts = {}
    for i, name in enumerate(host_names(n), 1):
        hosts[name] = {"ansible_host": address(i)}
    doc = {"all": {
        "vars": {
            "ansible_connection": "ssh",
            "ansible_user": "root",
            "ansible_ssh_private_key_file": key,
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
            "ansible_python_interpreter": "/usr/bin/python3",
            "simrack_dir": run,
            "hkgpu_prefix": run + "/{{ inventory_hostname }}/opt/hkgpu-tune",
            "hkgpu_state_dir": run + "/{{ inventory_hostname }}/var/lib/hkgpu-tune",
            # the host lock and registry of journals: each simulated host its own (they share a kernel)
            "hkgpu_host_dir": run + "/{{ inventory_hostname }}/var/lib/hkgpu-tune",
            # node_exporter's textfile directory, per host (only /etc is private to a simulated host)
            "hkgpu_verify_textfile_dir": run + "/{{ inventory_hostname }}/textfile",
            "hkgpu_install_man_dir": run + "/{{ inventory_hostname }}/man/man8",
            # the PATH link: /usr/local/bin is shared by every simulated host
            "hkgpu_install_bin_dir": run + "/{{ inventory_hostname }}/bin",
        },
        "children": {"hk_sim": {"children": {"rack_sim1": {"hosts": hosts}}}},
    }}
    if python:
        doc["all"]["vars"].update({
            "hkgpu_install_base_python": python,
            # the node venv is made from `python`; if that is itself a venv, its packages (the
            # dependencies) are not the base's system site-packages: add them with a .pth file
            "hkgpu_install_site_dirs": site_dirs(python)})
    import yaml
    with open(os.path.join(inv, "hosts.yml"), "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    gv = os.path.join(inv, "group_vars")
    if os.path.lexists(gv):
        os.unlink(gv)
    os.symlink(os.path.join(HERE, "group_vars"), gv)
    return os.path.join(inv, "hosts.yml")


def up(n: int = 4, run: str = RUN_DIR, python: str | None = sys.executable) -> str:
    """Build the rack (removing a stale one first); returns the inventory file."""
    down(run, quiet=True)
    os.makedirs(run, exist_ok=True)
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "link", "set", BRIDGE, "mtu", "9000")
    sh("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    _netns_add(f"{PREFIX}fab", FABRIC_PEER, 9000)
    key = _keys(run)
    shutil.copy(key + ".pub", os.path.join(run, "authorized_keys"))
    names = host_names(n)
    for i, name in enumerate(names, 1):
        _netns_add(name, address(i), 1500)
        _private_etc(name)
        os.makedirs(os.path.join(run, name, "var/lib/hkgpu-tune"), exist_ok=True)
        os.makedirs(os.path.join(run, name, "textfile"), exist_ok=True)
        _sshd(name, address(i), run)
    for i, _ in enumerate(names, 1):
        _wait_ssh(address(i), key)
    return inventory(n, run, python)


def namespaces() -> list[str]:
    out = sh("ip", "netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in out if line.startswith(PREFIX)]


def down(run: str = RUN_DIR, quiet=False) -> None:
    for name in namespaces():
        pid = os.path.join(run, name, "sshd.pid")
        if os.path.exists(pid):
            try:
                os.kill(int(open(pid).read().split()[0]), 15)
            except (ProcessLookupError, ValueError):
                pass
        sh("ip", "netns", "del", name, check=False)
        shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
        sh("ip", "link", "del", name, check=False)
    sh("ip", "link", "del", BRIDGE, check=False)
    if os.path.exists(MARK):
        for e in json.load(open(MARK)):
            try:
                os.rmdir(e)                   # only if still empty
            except OSError:
                pass
        os.unlink(MARK)
    shutil.rmtree(run, ignore_errors=True)
    if not quiet:
        print("rack removed")


def nsexec(name: str, *argv, check=True):
    """Run a command inside a simulated host (with its /etc)."""
    return sh(*argv, ns=name, check=check)


def snapshot(name: str) -> dict:
    """What the rack profile touches on one host, read with the system's own tools."""
    keys = ["net.ipv4.tcp_mtu_probing", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
            "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_no_metrics_save", "net.ipv4.tcp_fin_timeout",
            "net.ipv4.ip_local_port_range"]
    out = {k: " ".join(nsexec(name, "sysctl", "-n", k).stdout.split()) for k in keys}
    out["link"] = nsexec(name, "ip", "-o", "link", "show", "eth0").stdout.split("link/")[0].split(">")[1]
    out["qdisc"] = [line.split(":")[0] + line.split()[1] for line in
                    nsexec(name, "tc", "qdisc", "show", "dev", "eth0").stdout.splitlines()]
    out["channels"] = nsexec(name, "ethtool", "-l", "eth0").stdout.split("Current hardware settings:")[1]
    out["features"] = [line for line in nsexec(name, "ethtool", "-k", "eth0").stdout.splitlines()
                       if line.split(":")[0].strip() in ("generic-receive-offload", "generic-segmentation-offload",
                                                        "tcp-segmentation-offload")]
    out["etc"] = sorted(nsexec(name, "sh", "-c", "ls /etc/hkgpu-tune /etc/sysctl.d "
                                       "/etc/systemd/system").stdout.split())
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up")
    u.add_argument("--hosts", type=int, default=4)
    u.add_argument("--dir", default=RUN_DIR)
    d = sub.add_parser("down")
    d.add_argument("--dir", default=RUN_DIR)
    a = ap.parse_args(argv)
    if a.cmd == "up":
        print(up(a.hosts, a.dir))
    else:
        down(a.dir)


if __name__ == "__main__":
    main()
