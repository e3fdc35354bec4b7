"""Boot the test VM under QEMU (software emulation), reach it over SSH on loopback."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VM:
    def __init__(self, img_dir: str, log: str):
        self.dir, self.log = img_dir, log
        self.port = free_port()
        self.proc = None

    def start(self):
        # a copy-on-write overlay: the cached image never changes
        self.disk = os.path.join(os.path.dirname(self.log), "overlay.qcow2")
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", f"{self.dir}/disk.img", "-F", "raw",
                        self.disk], check=True)
        kvm = os.environ.get("HKGPU_VM_KVM") == "1"  # KVM guests hang on this test bed: TCG by default
        argv = [shutil.which("qemu-system-x86_64"), "-accel", "kvm" if kvm else "tcg", "-m", "1024", "-smp", "2",
                "-object", "memory-backend-ram,id=m0,size=512M", "-object", "memory-backend-ram,id=m1,size=512M",
                "-numa", "node,nodeid=0,cpus=0,memdev=m0", "-numa", "node,nodeid=1,cpus=1,memdev=m1",
                "-kernel", f"{self.dir}/vmlinuz", "-initrd", f"{self.dir}/initrd.img",
                "-append", "root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet",
                "-drive", f"file={self.disk},if=virtio,format=qcow2",
                "-netdev", f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{self.port}-:22",
                "-device", "virtio-net-pci,netdev=n0",
                "-netdev", "user,id=n1,restrict=on,net=198.18.200.0/24,host=198.18.200.2",
                "-device", "virtio-net-pci,netdev=n1",
                "-display", "none", "-serial", f"file:{self.log}", "-monitor", "none"]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)

    def ssh(self, cmd: str, timeout=300, check=False) -> subprocess.CompletedProcess:
        argv = ["ssh", "-i", f"{self.dir}/id_ed25519", "-p", str(self.port), "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
                "-o", "BatchMode=yes", "root@127.0.0.1", cmd]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"vm: {cmd}: rc={p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def put(self, local: str, remote: str) -> None:
        with open(local, "rb") as f:
            argv = ["ssh", "-i", f"{self.dir}/id_ed25519", "-p", str(self.port), "-o", "StrictHostKeyChecking=no",
                    "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
                    "root@127.0.0.1", f"cat > {remote}"]
            subprocess.run(argv, stdin=f, check=True, timeout=120)

    def wait_ssh(self, timeout=240) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise AssertionError(f"qemu exited ({self.proc.returncode}); console in {self.log}")
            try:
                if self.ssh("systemctl is-system-running --wait >/dev/null 2>&1; true", timeout=120).returncode == 0:
                    return time.monotonic() - t0
            except subprocess.TimeoutExpired:
                pass
            time.sleep(1)
        raise AssertionError(f"no SSH after {timeout} s; console in {self.log}")

    def reboot(self) -> float:
        self.ssh("systemctl reboot", timeout=30)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:  # wait until sshd is gone
            try:
                if self.ssh("true", timeout=5).returncode != 0:
                    break
            except subprocess.TimeoutExpired:
                break
            time.sleep(0.5)
        return self.wait_ssh()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
