#!/usr/bin/env python3
"""Time `hkgpu-tune verify` (default profile, pointed at a veth NIC in a namespace of its own)
in-process and as a whole command, side by side with the same checks done by running sysctl,
ip, ethtool and tc. Prints medians and ratios. Run as root: sudo python3 bench/verify_bench.py [runs]"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

NS, DEV, PEER = "hkbench-a", "hkbench0", "hkbench1"
RUNS = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 20


def sh(*a):
    subprocess.run(a, check=True, capture_output=True)


def setup():
    sh("ip", "netns", "add", NS)
    sh("ip", "link", "add", DEV, "netns", NS, "numtxqueues", "2", "type", "veth", "peer", "name", PEER, "netns", NS)
    sh("ip", "-n", NS, "link", "set", DEV, "up")


def profile_file():
    from hkgpu_tune.profile import default_profile_path
    text = open(default_profile_path()).read().replace("{driver: mlx5_core}", "{name: %s}" % DEV)
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(text)
    f.close()
    return f.name


def timeit(fn, runs):
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def inner(prof):
    """Runs inside the namespace."""
    from hkgpu_tune.engine import Engine
    from hkgpu_tune.profile import load_profile

    keys = ["net.core.rmem_max", "net.core.wmem_max", "net.core.netdev_max_backlog", "net.core.default_qdisc",
            "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.tcp_mtu_probing"]

    def in_process():
        eng = Engine(load_profile(prof), only=["sysctl", "link", "ethtool", "qdisc"])
        res = eng.verify()
        eng.b.close()
        assert len(res) > 10

    def command():
        subprocess.run([sys.executable, "-m", "hkgpu_tune", "verify", "--json", "--profile", prof,
                        "--only", "sysctl,link,ethtool,qdisc"], capture_output=True)

    def programs():
        for k in keys:
            subprocess.run(["sysctl", "-n", k], capture_output=True)
        for argv in (["ip", "-d", "link", "show", "dev", DEV], ["ethtool", "-l", DEV], ["ethtool", "-g", DEV],
                     ["ethtool", "-k", DEV], ["tc", "qdisc", "show", "dev", DEV]):
            subprocess.run(argv, capture_output=True)

    def interpreter():
        subprocess.run([sys.executable, "-c", "pass"], capture_output=True)

    in_process()  # warm the page cache and imports once
    rows = [("in-process verify", timeit(in_process, RUNS)),
            ("hkgpu-tune verify (whole command)", timeit(command, RUNS)),
            ("sysctl+ip+ethtool+tc programs", timeit(programs, RUNS)),
            ("python3 -c pass (interpreter start-up)", timeit(interpreter, RUNS))]
    base = statistics.median(rows[2][1])
    print(f"{'what':40} {'min ms':>8} {'median ms':>10} {'vs programs':>12}")
    for name, t in rows:
        print(f"{name:40} {min(t):8.1f} {statistics.median(t):10.1f} {statistics.median(t) / base:11.2f}x")
    print(f"targets: in-process <= 50 ms, whole command <= 300 ms, both faster than the programs ({RUNS} runs each)")


def main():
    if len(sys.argv) > 2 and sys.argv[2] == "--inner":
        inner(sys.argv[3])
        return
    if os.geteuid() != 0:
        sys.exit("bench: run as root (it builds a network namespace)")
    prof = profile_file()
    try:
        setup()
        subprocess.run(["ip", "netns", "exec", NS, sys.executable, os.path.abspath(__file__), str(RUNS), "--inner",
                        prof], check=True)
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)
        os.unlink(prof)


if __name__ == "__main__":
    main()
