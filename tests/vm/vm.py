"""The test node: a Debian VM under QEMU (software emulation), 2 vCPUs on 2 NUMA nodes.

- management NIC: QEMU's user network, SSH forwarded from 127.0.0.1 only (restrict=on);
- data NIC: virtio-net with 4 queue pairs on a multi-queue tap whose host end sits in a network
  namespace of the test's own (a bridge, the "switch"), behind a PCI expander bridge on NUMA
  node 1; the fabric peer 198.18.201.2 is a second namespace on that bridge.
"""
from __future__ import annotations

import fcntl
import hashlib
import itertools
import os
import shutil
import struct
import subprocess
import time

from ..helpers import REPO, sh

HERE = os.path.dirname(os.path.abspath(__file__))

MGMT_MAC = "52:54:00:00:02:0f"   # build.sh matches the NICs by these
DATA_MAC = "52:54:00:12:c9:01"
PEER_ADDR = "198.18.201.2"        # the guest's data NIC is 198.18.201.1 (build.sh)
QUEUES = 4                        # > vCPUs: the guest starts with 2 combined channels, max 4
DATA_NUMA = 1

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR, IFF_MULTI_QUEUE = 0x0002, 0x1000, 0x4000, 0x0100


def image_key() -> str:
    """The cache key: the build script and the toolkit's dependencies (the wheelhouse)."""
    h = hashlib.sha256()
    for f in (os.path.join(HERE, "build.sh"), os.path.join(REPO, "pyproject.toml")):
        with open(f, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()[:12]


KEEP_S = 24 * 3600      # an image of another key no run holds is removed once unused this long
_HELD: dict[str, int] = {}


def image_dir(cache: str) -> str:
    """OUT dir for this key under the cache, locked for this process: exclusively until share() (the
    build), shared after (the boot), released when the process ends; another run's clean-up and
    build wait for it. Images of other keys are removed only when no run holds them and none used
    them for KEEP_S (two runs of two commits at once each keep theirs)."""
    key = image_key()
    if key in _HELD:           # a second node of this run (test_dayone_vm.py): locked and built already
        return os.path.join(cache, key)
    os.makedirs(cache, exist_ok=True)
    fd = os.open(os.path.join(cache, key + ".lock"), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _HELD[key] = fd
    for old in os.listdir(cache):
        path = os.path.join(cache, old)
        if old.endswith(".lock") or old == key or not os.path.isdir(path):
            continue
        lk = os.open(path + ".lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lk, fcntl.LOCK_EX | fcntl.LOCK_NB)   # held by a run: not ours to remove
            if time.time() - os.stat(path).st_mtime > KEEP_S:
                shutil.rmtree(path, ignore_errors=True)
                os.unlink(path + ".lock")
        except OSError:
            pass
        finally:
            os.close(lk)
    out = os.path.join(cache, key)
    if os.path.isdir(out):
        os.utime(out)          # used now (the age the clean-up reads)
    return out


def share(img: str) -> None:
    """The image is built: other runs of the same key may boot it too (the lock turns shared)."""
    fcntl.flock(_HELD[os.path.basename(img)], fcntl.LOCK_SH)


def free_port() -> int:
    from hkgpu_tune.serve.running import client
    return client.free_ports(1)[0]


def tap_fds(ns: str, name: str, queues: int) -> list[int]:
    """Open a multi-queue tap inside namespace ns (one fd per queue) for QEMU's fds=."""
    from pyroute2.netns import popns, pushns
    fds = []
    pushns(ns)
    try:
        for _ in range(queues):
            fds.append(os.open("/dev/net/tun", os.O_RDWR))
            fcntl.ioctl(fds[-1], TUNSETIFF, struct.pack("16sH", name.encode(),
                                                        IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE))
        return fds
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        popns()


_SERIAL = itertools.count()


class VM:
    def __init__(self, img_dir: str, workdir: str):
        self.dir, self.work = img_dir, workdir
        self.log = os.path.join(workdir, "console.log")
        self.key = os.path.join(img_dir, "id_ed25519")
        self.port = free_port()
        tag = f"{os.getpid()}x{next(_SERIAL)}"   # the pid (a dead run's are removed) and this VM's number
        self.sw, self.peer = f"hkvm-sw-{tag}", f"hkvm-peer-{tag}"
        self.proc = None

    # ------------------------------------------------------------------ the test's network
    def net_up(self) -> None:
        # namespaces a killed earlier run left behind (the tag is its pid; a live one is another run's)
        for ns in os.listdir("/run/netns") if os.path.isdir("/run/netns") else []:
            if ns.startswith(("hkvm-sw-", "hkvm-peer-")) and not os.path.exists(
                    f"/proc/{ns.rsplit('-', 1)[1].split('x')[0]}"):
                sh("ip", "netns", "del", ns, check=False)
        sh("ip", "netns", "add", self.sw)
        sh("ip", "netns", "add", self.peer)
        sh("ip", "link", "add", "br0", "mtu", "9000", "type", "bridge", ns=self.sw)
        sh("ip", "link", "add", "p0", "mtu", "9000", "type", "veth", "peer", "name", "fab0", "mtu", "9000",
           "netns", self.peer, ns=self.sw)
        sh("ip", "link", "set", "p0", "master", "br0", "up", ns=self.sw)
        sh("ip", "link", "set", "br0", "up", ns=self.sw)
        sh("ip", "addr", "add", f"{PEER_ADDR}/24", "dev", "fab0", ns=self.peer)
        sh("ip", "link", "set", "fab0", "up", ns=self.peer)
        sh("ip", "link", "set", "lo", "up", ns=self.peer)

    def tap_up(self) -> None:
        sh("ip", "link", "set", "tap0", "mtu", "9000", "master", "br0", "up", ns=self.sw)

    def peer_mtu(self, mtu: int) -> None:
        """The path to the fabric peer passes frames up to mtu bytes (the bridge drops larger)."""
        sh("ip", "link", "set", "p0", "mtu", str(mtu), ns=self.sw)
        sh("ip", "link", "set", "fab0", "mtu", str(mtu), ns=self.peer)

    def net_down(self) -> None:
        for ns in (self.sw, self.peer):
            sh("ip", "netns", "del", ns, check=False)

    # ------------------------------------------------------------------ the machine
    def start(self) -> None:
        # a copy-on-write overlay: the cached image never changes
        self.disk = os.path.join(self.work, "overlay.qcow2")
        sh("qemu-img", "create", "-q", "-f", "qcow2", "-b", f"{self.dir}/disk.img", "-F", "raw", self.disk)
        self.net_up()
        fds = tap_fds(self.sw, "tap0", QUEUES)
        self.tap_up()
        kvm = os.environ.get("HKGPU_VM_KVM") == "1"  # KVM guests hang on this test bed: TCG by default
        argv = [shutil.which("qemu-system-x86_64"), "-accel", "kvm" if kvm else "tcg", "-m", "1024", "-smp", "2",
                "-object", "memory-backend-ram,id=m0,size=512M", "-object", "memory-backend-ram,id=m1,size=512M",
                "-numa", "node,nodeid=0,cpus=0,memdev=m0", "-numa", "node,nodeid=1,cpus=1,memdev=m1",
                "-kernel", f"{self.dir}/vmlinuz", "-initrd", f"{self.dir}/initrd.img",
                "-append", "root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet",
                "-drive", f"file={self.disk},if=none,id=d0,format=qcow2",
                "-device", "virtio-blk-pci,drive=d0,bus=pci.0",
                "-netdev", f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{self.port}-:22",
                "-device", f"virtio-net-pci,netdev=n0,mac={MGMT_MAC},bus=pci.0",
                # the data NIC sits behind a PCI expander bridge on NUMA node 1 (a bridge below it:
                # QEMU plugs only bridges into a pxb)
                "-device", f"pxb,id=pxb1,bus_nr=8,numa_node={DATA_NUMA},bus=pci.0",
                "-device", "pci-bridge,id=br1,bus=pxb1,chassis_nr=1",
                "-netdev", f"tap,id=n1,fds={':'.join(map(str, fds))},vhost=off",
                "-device", f"virtio-net-pci,netdev=n1,mac={DATA_MAC},mq=on,vectors={2 * QUEUES + 2},"
                           "bus=br1,addr=0x1",
                "-display", "none", "-serial", f"file:{self.log}", "-monitor", "none"]
        try:
            with open(os.path.join(self.work, "qemu.err"), "w") as err:
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                             pass_fds=fds, start_new_session=True)
        finally:
            for fd in fds:
                os.close(fd)

    def ssh_argv(self) -> list[str]:
        return ["ssh", "-i", self.key, "-p", str(self.port), "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=6", "-o", "BatchMode=yes",
                "root@127.0.0.1"]

    def ssh(self, cmd: str, timeout=300, check=False) -> subprocess.CompletedProcess:
        p = subprocess.run(self.ssh_argv() + [cmd], capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"vm: {cmd}: rc={p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def reachable(self) -> bool:
        try:
            return self.ssh("true", timeout=20).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def inventory(self, path: str) -> str:
        """An Ansible inventory (YAML) naming this VM as host hkvm."""
        import yaml
        host = {"ansible_host": "127.0.0.1", "ansible_port": self.port, "ansible_user": "root",
                "ansible_ssh_private_key_file": self.key, "ansible_python_interpreter": "/usr/bin/python3",
                # Ansible: its control masters in the work dir (close_masters ends them before a
                # reboot); testinfra: none at all
                "ansible_ssh_args": f"-o ControlMaster=auto -o ControlPersist=120s -o ControlPath={self.work}/cm-%C "
                                    "-o PreferredAuthentications=publickey",
                "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                                           "-o ControlMaster=no"}
        with open(path, "w") as f:
            yaml.safe_dump({"all": {"hosts": {"hkvm": host}}}, f)
        return path

    def wait_ssh(self, timeout=600, not_boot=None) -> float:
        """Until the guest is up and answers SSH (and, with not_boot, runs another boot than that)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise AssertionError(f"qemu exited ({self.proc.returncode}); console in {self.log}")
            try:
                p = self.ssh("systemctl is-system-running --wait >/dev/null 2>&1; cat /proc/sys/kernel/random/boot_id",
                             timeout=180)
                if p.returncode == 0 and p.stdout and p.stdout != not_boot:
                    return time.monotonic() - t0
            except subprocess.TimeoutExpired:
                pass
            time.sleep(1)
        raise AssertionError(f"no SSH{' from a new boot' if not_boot else ''} after {timeout} s; console in {self.log}; "
                             f"its last lines (a soft lockup shows here):\n{self.console_tail()}")

    def console_tail(self, lines: int = 40) -> str:
        """The guest console's last lines: the log goes with pytest's temporary directories."""
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError as e:
            return f"(console log unreadable: {e})"

    def close_masters(self) -> None:
        """End the SSH control masters Ansible left (they would outlive a reboot)."""
        for f in os.listdir(self.work):
            if f.startswith("cm-"):
                try:
                    subprocess.run(["ssh", "-o", f"ControlPath={os.path.join(self.work, f)}", "-O", "exit", "hkvm"],
                                   capture_output=True, timeout=10)
                except subprocess.TimeoutExpired:
                    pass

    def reboot(self) -> float:
        self.close_masters()
        boot_id = self.ssh("cat /proc/sys/kernel/random/boot_id", check=True).stdout
        t0 = time.monotonic()
        try:
            self.ssh("systemctl reboot", timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self.wait_ssh(900, not_boot=boot_id)
        return time.monotonic() - t0

    def stop(self) -> None:
        """Power off (a clean shutdown), then remove the overlay and the namespaces."""
        try:
            self.close_masters()
            if self.proc and self.proc.poll() is None:
                try:
                    self.ssh("systemctl poweroff", timeout=20)
                    self.proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            if self.proc and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.net_down()
            if getattr(self, "disk", None) and os.path.exists(self.disk):
                os.unlink(self.disk)
