#!/usr/bin/env python3
"""A simulated rack: N hosts, each a network namespace with its own eth0, /etc, state dir and sshd.

    python tests/rack/simrack.py up --hosts 4      # prints the inventory path
    python tests/rack/simrack.py down

Layout (all addresses in 198.18.0.0/15, the benchmark range); K is this run's rack number (claimed
under a lock in /run/hkrack, so two runs on one machine each get their own):
  root namespace: bridge hrKbr, 198.19.K.1/24, MTU 9000 (the rack's leaf switch)
  hksim-K-fab:    an unmanaged fabric peer at 198.19.K.250, MTU 9000 (storage / other rack)
  hksim-K-nN:     a host; veth eth0 198.19.K.(10+N)/24, MTU 1500 at start, sshd on eth0:22
Each host's /etc/hkgpu-tune, /etc/sysctl.d and /etc/systemd are its own (/etc/netns/NAME/...,
bind-mounted by `ip netns exec`); its state dir and venv live under the run directory.
`ip netns exec` skips a bind it cannot make (its target /etc/X absent) and carries on, and removing
/etc/X detaches the binds over it in every namespace: either way a host writes the machine's own /etc.
So the targets are made once and never removed (another run's hosts may be bound over them), each
host's sshd is started with its whole /etc/netns/NAME tree in place, and every host is checked to see
its own /etc (the sshd's, and each nsexec's) before it is used: a host that does not fails loudly.
No default route: the hosts reach only the bridge and each other.
(The names differ from the old hkrack-* ones, which an older copy of this file removes wholesale.)
Clean-up removes only this run's rack, and racks whose owning process is gone (its pid and start
time are in the claim).
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time

CLAIMS = "/run/hkrack"             # one claim per rack on this machine: K.json {pid, start, run}
FIRST, RACKS = 100, 100            # rack numbers K: subnets 198.19.100.0/24 .. 198.19.199.0/24
# this process's rack (set by up(), cleared by down())
RACK = None
PREFIX = BRIDGE = NET = GATEWAY = FABRIC_PEER = None


def _use(k: int | None) -> None:
    global RACK, PREFIX, BRIDGE, NET, GATEWAY, FABRIC_PEER
    RACK = k
    if k is None:
        PREFIX = BRIDGE = NET = GATEWAY = FABRIC_PEER = None
        return
    PREFIX, BRIDGE, NET = f"hksim-{k}-", f"hr{k}br", f"198.19.{k}"
    GATEWAY, FABRIC_PEER = f"{NET}.1", f"{NET}.250"


RUN_DIR = os.environ.get("HKRACK_DIR", "/var/tmp/hkrack")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))   # run as a script too
from tests.helpers import REPO, sh  # noqa: E402
# /etc entries each host gets its own copy of; `ip netns exec` binds only over existing /etc/X
PRIVATE_ETC = ("hkgpu-tune", "sysctl.d", "systemd")


def host_names(n: int) -> list[str]:
    return [f"{PREFIX}n{i}" for i in range(1, n + 1)]


def _link(name: str) -> str:
    """The root namespace's end of a host's veth (interface names have 15 characters at most)."""
    return f"hr{name[len('hksim-'):].replace('-', '')}"


def _start_ticks(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except OSError:
        return ""


def _locked():
    os.makedirs(CLAIMS, exist_ok=True)
    f = open(os.path.join(CLAIMS, "lock"), "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def _claims() -> dict:
    out = {}
    for e in os.listdir(CLAIMS):
        if e.endswith(".json"):
            try:
                with open(os.path.join(CLAIMS, e)) as f:
                    out[int(e[:-5])] = json.load(f)
            except (OSError, ValueError):
                out[int(e[:-5])] = {}
    return out


def _alive(claim: dict) -> bool:
    return bool(claim) and _start_ticks(claim.get("pid", 0)) == claim.get("start")


def _remove(k: int, run: str | None = None) -> None:
    """Take down rack k: its hosts' sshds (and whatever runs in its namespaces), namespaces, links,
    /etc/netns entries and bridge; its own only (names hksim-K-*, links hrK*, K three digits)."""
    prefix = f"hksim-{k}-"
    names = [n for n in _all_namespaces() if n.startswith(prefix)]
    pids = set()
    for name in names:
        pids.update(sh("ip", "netns", "pids", name, check=False).stdout.split())
    if run and os.path.isdir(run):       # a namespace already gone keeps running while its sshd does
        for e in os.listdir(run):
            try:
                with open(os.path.join(run, e, "sshd.pid")) as f:
                    pids.add(f.read().split()[0])
            except (OSError, IndexError):
                pass
    for pid in pids:
        try:
            os.kill(int(pid), 15)
        except (ProcessLookupError, ValueError):
            pass
    end = time.time() + 5     # gone before their /etc/netns trees are: none writes through a removed bind
    while any(_start_ticks(int(p)) for p in pids if p.isdigit()) and time.time() < end:
        time.sleep(0.05)
    for name in names:
        sh("ip", "netns", "del", name, check=False)
        shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
    links = sh("ip", "-o", "link", "show", check=False).stdout.splitlines()
    for ln in links:
        dev = ln.split(":")[1].strip().split("@")[0] if ln.count(":") > 1 else ""
        if dev.startswith(f"hr{k}"):
            sh("ip", "link", "del", dev, check=False)


def _claim(run: str, owner: int) -> int:
    """A free rack number for this process, claimed under the lock; racks of dead owners are removed."""
    with _locked():
        claims = _claims()
        for k, c in claims.items():
            if c.get("run") == run or not _alive(c):
                _remove(k, c.get("run"))
                os.unlink(os.path.join(CLAIMS, f"{k}.json"))
        claims = _claims()
        free = [k for k in range(FIRST, FIRST + RACKS) if k not in claims]
        if not free:
            raise RuntimeError(f"no free simulated rack number: {sorted(claims)} are claimed")
        k = free[0]
        with open(os.path.join(CLAIMS, f"{k}.json"), "w") as f:
            json.dump({"pid": owner, "start": _start_ticks(owner), "run": run}, f)
        return k





def address(i: int) -> str:
    return f"{NET}.{10 + i}"


def _netns_add(name: str, addr: str, mtu: int) -> None:
    sh("ip", "netns", "add", name)
    peer = _link(name) + "p"                 # temporary name of the host end before the move
    sh("ip", "link", "add", _link(name), "type", "veth", "peer", "name", peer)
    sh("ip", "link", "set", _link(name), "mtu", "9000", "master", BRIDGE, "up")
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
    """The host's whole /etc/netns/NAME tree, and the /etc/X targets its binds need (made here, never
    removed: other runs' hosts may be bound over them)."""
    for e in PRIVATE_ETC:
        os.makedirs(f"/etc/{e}", exist_ok=True)
        os.makedirs(f"/etc/netns/{name}/{e}", exist_ok=True)
    # as on a real host: the unit directory and its wants directory exist
    os.makedirs(f"/etc/netns/{name}/systemd/system/multi-user.target.wants", exist_ok=True)


def _etc_not_own(name: str, root: str) -> list[str]:
    """The private /etc entries that a process whose root is `root` (/proc/PID/root) does not see as
    this host's own (bound from /etc/netns/NAME): [] when it sees them all."""
    bad = []
    for e in PRIVATE_ETC:
        try:
            mine, seen = os.stat(f"/etc/netns/{name}/{e}"), os.stat(f"{root}/etc/{e}")
        except OSError as err:
            bad.append(f"/etc/{e} ({err.strerror})")
            continue
        if (mine.st_dev, mine.st_ino) != (seen.st_dev, seen.st_ino):
            bad.append(f"/etc/{e} is the machine's own")
    return bad


def _sshd_pid(name: str, run: str, timeout: float = 10.0) -> int:
    path = os.path.join(run, name, "sshd.pid")
    end = time.time() + timeout
    while True:
        try:
            with open(path) as f:
                return int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            if time.time() > end:
                raise RuntimeError(f"simrack: {name}: sshd wrote no pid file ({path})") from None
            time.sleep(0.05)


def check_private_etc(name: str, run: str) -> None:
    """Fail loudly unless the host's sshd (and so every SSH session on it) sees its own /etc."""
    pid = _sshd_pid(name, run)
    bad = _etc_not_own(name, f"/proc/{pid}/root")
    if bad:
        raise RuntimeError(f"simrack: {name}: its sshd (pid {pid}) does not see its own /etc: {', '.join(bad)}; "
                           "what it wrote there went to this machine's /etc")


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
            # the hosts share this machine's packages and /etc/default: node_exporter is the site's own
            # here (the VM test node runs the role; tests/rack/test_node_exporter_role.py its flags)
            "hkgpu_node_exporter_manage": False,
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
        shutil.rmtree(gv) if not os.path.islink(gv) else os.unlink(gv)
    os.makedirs(gv)
    for e in sorted(os.listdir(os.path.join(HERE, "group_vars"))):   # written with this rack's addresses
        with open(os.path.join(HERE, "group_vars", e)) as src, open(os.path.join(gv, e), "w") as dst:
            dst.write(src.read().replace("198.18.10.", f"{NET}."))
    return os.path.join(inv, "hosts.yml")


def up(n: int = 4, run: str = RUN_DIR, python: str | None = sys.executable, owner: int | None = None) -> str:
    """Build this run's rack (removing a stale one of the same run directory, or of a dead owner,
    first); returns the inventory file. owner: the process the rack belongs to (this one)."""
    if RACK is not None:
        down(quiet=True)
    k = _claim(os.path.abspath(run), owner or os.getpid())
    _use(k)
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(run, exist_ok=True)
    with open(os.path.join(run, "rack.json"), "w") as f:
        json.dump({"rack": k}, f)
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
        os.makedirs(os.path.join(run, name, "var/lib/hkgpu-tune"), exist_ok=True)
        os.makedirs(os.path.join(run, name, "textfile"), exist_ok=True)
        with _locked():   # the binds' targets in place while its sshd's namespace is made
            _private_etc(name)
            _sshd(name, address(i), run)
    for i, name in enumerate(names, 1):
        _wait_ssh(address(i), key)
        check_private_etc(name, run)
    return inventory(n, run, python)


def _all_namespaces() -> list[str]:
    out = sh("ip", "netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in out if line.startswith("hksim-")]


def namespaces() -> list[str]:
    """This run's rack's namespaces (another run's are not ours to see or remove)."""
    return [n for n in _all_namespaces() if PREFIX and n.startswith(PREFIX)]


def down(run: str | None = None, quiet=False) -> None:
    """Remove this run's rack (the one built in run, or this process's) and its claim."""
    k = RACK
    if run and os.path.exists(os.path.join(run, "rack.json")):
        with open(os.path.join(run, "rack.json")) as f:
            k = json.load(f)["rack"]
    if k is None:
        return
    with _locked():
        _remove(k, run)
        try:
            os.unlink(os.path.join(CLAIMS, f"{k}.json"))
        except FileNotFoundError:
            pass
    if run:
        shutil.rmtree(run, ignore_errors=True)
    if k == RACK:
        _use(None)
    if not quiet:
        print("rack removed")


# run inside a host before its command: exit NOT_OWN unless each private /etc entry is its own
NOT_OWN = 125
_OWN_ETC = ('for e in ' + " ".join(PRIVATE_ETC) + '; do [ /etc/$e -ef "/etc/netns/$0/$e" ] || '
            '{ echo "simrack: $0: /etc/$e is the machine\'s own, not the host\'s" >&2; exit ' + str(NOT_OWN) + '; }; '
            'done; exec "$@"')


def nsexec(name: str, *argv, check=True):
    """Run a command inside a simulated host (with its /etc: checked before the command runs)."""
    r = sh("sh", "-c", _OWN_ETC, name, *argv, ns=name, check=False)
    if r.returncode == NOT_OWN and r.stderr.startswith("simrack: "):
        raise RuntimeError(r.stderr.strip())
    if check and r.returncode:
        raise subprocess.CalledProcessError(r.returncode, argv, r.stdout, r.stderr)
    return r


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
    if a.cmd == "up":     # the rack belongs to the shell that ran this (its claim goes stale with it)
        print(up(a.hosts, a.dir, owner=os.getppid()))
    else:
        down(a.dir)


if __name__ == "__main__":
    main()
