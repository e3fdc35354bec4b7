"""A test bed for baselines: a host namespace and a peer namespace joined by a veth pair, the peer
holding 2 fabric and 3 WAN addresses (198.18.0.0/15), an iperf3 server (`baseline serve`) in the
peer. Used by the tests and bench/baseline_bench.py; removed by close()."""
from __future__ import annotations

import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sh(*argv, ns=None, check=True):
    if ns:
        argv = ("ip", "netns", "exec", ns, *argv)
    p = subprocess.run(argv, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: rc {p.returncode}: {p.stderr.strip()}")
    return p


class Bed:
    def __init__(self, tag: str = "t", port: int = 5201):
        n = os.getpid() % 100000
        self.host, self.peer = f"hkbl-{tag}{n}h", f"hkbl-{tag}{n}p"
        self.net = f"198.18.{60 + os.getpid() % 100}"
        self.ip = f"{self.net}.1"
        self.fabric = [f"{self.net}.2", f"{self.net}.3"]
        self.wan = [f"{self.net}.4", f"{self.net}.5", f"{self.net}.6"]
        self.dead = f"{self.net}.99"          # nobody answers there
        self.port = port
        self.server = None
        sh("ip", "netns", "add", self.host)
        sh("ip", "netns", "add", self.peer)
        try:
            sh("ip", "link", "add", "hkbl0", "netns", self.host, "type", "veth", "peer", "name", "hkbl1",
               "netns", self.peer)
            sh("ip", "-n", self.host, "addr", "add", f"{self.ip}/24", "dev", "hkbl0")
            for a in self.fabric + self.wan:
                sh("ip", "-n", self.peer, "addr", "add", f"{a}/24", "dev", "hkbl1")
            for ns, dev in ((self.host, "hkbl0"), (self.peer, "hkbl1")):
                sh("ip", "-n", ns, "link", "set", dev, "up")
                sh("ip", "-n", ns, "link", "set", "lo", "up")
        except Exception:
            self.close()
            raise

    def profile(self, path, wan_rtt_ms=(40, 55, 30), extra: str = "", dead_wan: bool = False) -> str:
        names = ("sg", "tyo", "sh")
        lines = ["network:", f"  fabric_peers: [{', '.join(self.fabric)}]", "  wan_peers:"]
        for name, addr, rtt in zip(names, self.wan, wan_rtt_ms):
            lines.append(f"    - {{address: {self.dead if dead_wan and name == 'sh' else addr}, name: {name}, rtt_ms: {rtt}}}")
        lines += ["baseline:", f"  iperf3_port: {self.port}", "  iperf3_streams: 2"]
        text = "\n".join(lines) + "\n" + extra
        with open(path, "w") as f:
            f.write(text)
        return str(path)

    def serve(self, seconds: int = 300):
        """`baseline serve` in the peer with the bed's profile: it listens on the peer's fabric and WAN
        addresses, which that profile names."""
        import tempfile
        fd, path = tempfile.mkstemp(prefix="hkbl-serve-", suffix=".yaml")
        os.close(fd)
        self.profile(path)
        self.server = subprocess.Popen(
            ["ip", "netns", "exec", self.peer, sys.executable, "-m", "hkgpu_tune", "baseline", "serve",
             "--port", str(self.port), "--seconds", str(seconds), "--profile", path],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
        self._serve_profile = path
        want = {f"{a}:{self.port}" for a in self.fabric + self.wan}
        for _ in range(100):    # until the port listens on each address (and on no other)
            got = {line.split()[3] for line in sh("ss", "-ltnH", ns=self.peer).stdout.splitlines()}
            if want <= got:
                assert not {g for g in got if g.endswith(f":{self.port}")} - want, got
                return
            if self.server.poll() is not None:
                raise AssertionError(f"baseline serve exited: {self.server.stderr.read().decode()}")
            time.sleep(0.05)
        raise AssertionError("baseline serve did not listen within 5 s")

    def hk(self, *args, env=None):
        return subprocess.run(["ip", "netns", "exec", self.host, sys.executable, "-m", "hkgpu_tune", *args],
                              capture_output=True, text=True, cwd=REPO, env=env)

    def close(self):
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
        for ns in (self.host, self.peer):
            sh("ip", "netns", "del", ns, check=False)
        if getattr(self, "_serve_profile", None):
            os.unlink(self._serve_profile)
