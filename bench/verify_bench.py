#!/usr/bin/env python3
"""Time `hkgpu-tune verify` (default profile, pointed at a veth NIC in a namespace of its own)
in-process and as a whole command, side by side with the bare interpreter's start and with the
same checks done by running sysctl, ip, ethtool and tc. Prints minimum, median and ratios.

    sudo python3 bench/verify_bench.py [runs] [--before REV] [--no-bytecode]

--before REV: also time the whole command of git revision REV (exported to a temporary directory),
before and after side by side. Bytecode is cached as an installed package has it (pip compiles it);
--no-bytecode keeps PYTHONDONTWRITEBYTECODE from the environment, so every run compiles from source."""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

NS, DEV, PEER = "hkbench-a", "hkbench0", "hkbench1"
RUNS = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 20
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_MS = 250


def sh(*a):
    subprocess.run(a, check=True, capture_output=True)


def setup():
    sh("ip", "netns", "add", NS)
    sh("ip", "link", "add", DEV, "netns", NS, "numtxqueues", "2", "type", "veth", "peer", "name", PEER, "netns", NS)
    sh("ip", "-n", NS, "link", "set", DEV, "up")


def profile_file():
    from hkgpu_tune.core.profile import default_profile_path
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


def inner(prof, before, bytecode):
    """Runs inside the namespace."""
    from hkgpu_tune.tune.engine import Engine
    from hkgpu_tune.core.profile import load_profile

    keys = ["net.core.rmem_max", "net.core.wmem_max", "net.core.netdev_max_backlog", "net.core.default_qdisc",
            "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.tcp_mtu_probing"]
    env = dict(os.environ)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    verify = [sys.executable, "-m", "hkgpu_tune", "verify", "--json", "--profile", prof,
              "--only", "sysctl,link,ethtool,qdisc"]

    def in_process():
        eng = Engine(load_profile(prof), only=["sysctl", "link", "ethtool", "qdisc"])
        res = eng.verify()
        eng.b.close()
        assert len(res) > 10

    def command(cwd):
        def run():
            p = subprocess.run(verify, capture_output=True, cwd=cwd, env=env)
            assert p.returncode in (0, 2), p.stderr[-2000:]
        return run

    def programs():
        for k in keys:
            subprocess.run(["sysctl", "-n", k], capture_output=True)
        for argv in (["ip", "-d", "link", "show", "dev", DEV], ["ethtool", "-l", DEV], ["ethtool", "-g", DEV],
                     ["ethtool", "-k", DEV], ["tc", "qdisc", "show", "dev", DEV]):
            subprocess.run(argv, capture_output=True)

    def interpreter():
        subprocess.run([sys.executable, "-c", "pass"], capture_output=True, env=env)

    in_process()  # warm the page cache and imports once
    after = command(REPO)
    after()  # and write the bytecode, as pip does at install time
    fns = [("in-process verify", in_process)]
    if before:
        old = command(before)
        old()
        fns.append(("whole command, before", old))
    fns += [("whole command, after (this tree)", after), ("python3 -c pass (interpreter start-up)", interpreter),
            ("sysctl+ip+ethtool+tc programs", programs)]
    # interleaved, one run of each in turn: load from elsewhere on the machine hits all rows alike
    times = {name: [] for name, _ in fns}
    for _ in range(RUNS):
        for name, fn in fns:
            times[name] += timeit(fn, 1)
    rows = list(times.items())
    med = {name: statistics.median(t) for name, t in rows}
    bare = med["python3 -c pass (interpreter start-up)"]
    base = med["sysctl+ip+ethtool+tc programs"]
    print(f"{'what':44} {'min ms':>8} {'median ms':>10} {'vs interpreter':>15} {'vs programs':>12}")
    for name, t in rows:
        print(f"{name:44} {min(t):8.1f} {med[name]:10.1f} {med[name] / bare:14.2f}x {med[name] / base:11.2f}x")
    now = med["whole command, after (this tree)"]
    if before:
        was = rows[1][1]
        print(f"before -> after (median): {statistics.median(was):.0f} ms -> {now:.0f} ms "
              f"({statistics.median(was) / now:.2f}x faster); above the interpreter's start: "
              f"{statistics.median(was) - bare:.0f} ms -> {now - bare:.0f} ms")
    print(f"targets: in-process <= 50 ms, whole command <= {TARGET_MS} ms: "
          f"{'met' if now <= TARGET_MS else 'MISSED'} ({now:.0f} ms median, {RUNS} runs each, "
          f"bytecode {'cached' if bytecode else 'compiled every run'})")


def export(rev: str) -> str:
    """The tree of git revision rev, in a temporary directory (for --before)."""
    d = tempfile.mkdtemp(prefix="hkbench-before-")
    tar = subprocess.run(["git", "-C", REPO, "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", d], input=tar, check=True)
    os.chmod(d, 0o755)
    return d


def main():
    args = sys.argv[1:]
    if "--inner" in args:
        i = args.index("--inner")
        inner(args[i + 1], args[i + 2] if args[i + 2] != "-" else None, args[i + 3] == "1")
        return
    if os.geteuid() != 0:
        sys.exit("bench: run as root (it builds a network namespace)")
    before = export(args[args.index("--before") + 1]) if "--before" in args else None
    bytecode = "--no-bytecode" not in args
    prof = profile_file()
    try:
        setup()
        subprocess.run(["ip", "netns", "exec", NS, sys.executable, os.path.abspath(__file__), str(RUNS), "--inner",
                        prof, before or "-", "1" if bytecode else "0"], check=True)
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)
        os.unlink(prof)
        if before:
            shutil.rmtree(before, ignore_errors=True)


if __name__ == "__main__":
    main()
