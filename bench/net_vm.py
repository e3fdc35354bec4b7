#!/usr/bin/env python3
"""What the network tuning buys: the VM test node (tests/vm) stock (Debian's own settings) against
the same node after `hkgpu-tune apply` of the shipped hk-inference profile, in one run, on emulated
Hong Kong paths at a shaped rate (tests/vm/netpath.py says where each queue and delay sits).

Per path and node: single-flow and 4-flow TCP throughput both ways (Debian's iperf3 --json),
retransmits, RTT p50/p99 while each test runs (ping every 50 ms), the node's CPU seconds per GB
moved; `--runs` runs for a spread; tuned/stock ratios. Then `hkgpu-tune baseline capture` on both
nodes per path and `baseline compare` both ways (stock -> tuned: better; tuned -> stock: flagged).

    sudo HKGPU_VM_DIR=/var/cache/hkgpu-tune/vm-netproof python3 bench/net_vm.py --rate 250 \\
        --out docs/perf/network-vm-2026-12-06.json --png docs/perf/network-vm-2026-12-06.png
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tests.helpers import env_tools_on_path  # noqa: E402
from tests.vm import netpath  # noqa: E402
from tests.vm.vm import DATA_MAC, HERE, PEER_ADDR, VM, image_dir  # noqa: E402

CLI = "/opt/hkgpu-tune/bin/hkgpu-tune"
PROFILE_ON_NODE = "/etc/hkgpu-tune/netproof.yaml"
SETTINGS = ("net.core.rmem_max", "net.core.wmem_max", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
            "net.core.default_qdisc", "net.ipv4.tcp_mtu_probing", "net.ipv4.tcp_congestion_control",
            "net.ipv4.tcp_slow_start_after_idle")
# figure -> (higher is better?)
FIGURES = {"mbit": True, "rtt_p50_ms": False, "rtt_p99_ms": False, "cpu_s_per_gb": False}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def node_profile() -> dict:
    """The shipped profile for this node: its data NIC is virtio (matched by MAC, not mlx5) and
    its fabric peer is the test's namespace. No GPU in the VM: the gpu section is left out."""
    with open(os.path.join(REPO, "hkgpu_tune", "profiles", "hk-inference.yaml")) as f:
        prof = yaml.safe_load(f)
    prof["network"]["interfaces"][0]["match"] = {"mac": DATA_MAC}
    prof["network"]["fabric_peers"] = [PEER_ADDR]
    prof["affinity"]["nics"][0]["match"] = {"mac": DATA_MAC}
    prof.pop("gpu", None)
    return prof


def capture_profile(path: netpath.Path, seconds: int, omit: int) -> dict:
    """A profile for `baseline capture` on this path: the peer as fabric peer (iperf3, one flow each
    way: the figure the window decides) and as WAN peer (ping), no engine."""
    prof = {"name": f"netproof-{path.name}",
            "network": {"fabric_peers": [PEER_ADDR],
                        "wan_peers": [{"address": PEER_ADDR, "name": path.name, "rtt_ms": path.rtt_ms + 5}]},
            "baseline": {"iperf3_streams": 1, "iperf3_port": netpath.PORT,
                         "quick": {"ping_count": 60, "ping_interval_ms": 50, "iperf3_runs": 2,
                                   "iperf3_seconds": seconds, "iperf3_omit_s": omit}}}
    return prof


def put(vm, path: str, text: str) -> None:
    vm.ssh(f"mkdir -p {os.path.dirname(path)} && cat > {path} <<'EOF'\n{text}EOF", check=True)


def settings(vm, dev: str) -> dict:
    out = vm.ssh("sysctl " + " ".join(SETTINGS), check=True).stdout
    s = {k.strip(): " ".join(v.split()) for k, v in (ln.split("=", 1) for ln in out.splitlines() if "=" in ln)}
    s["mtu"] = vm.ssh(f"cat /sys/class/net/{dev}/mtu", check=True).stdout.strip()
    s["queue_qdisc"] = netpath.queue_qdisc(vm, dev)
    s["combined"] = vm.ssh(f"ethtool -l {dev} | awk '/^Current/{{c=1}} c && /^Combined/{{print $2; exit}}'",
                           check=True).stdout.strip()
    return s


def run_node(vm, dev: str, label: str, paths, rate: int, args, tests=netpath.TESTS) -> dict:
    res = {"settings": settings(vm, dev), "paths": {}}
    log(f"{label}: {res['settings']}")
    for p in paths:
        leaf = netpath.shape(vm, dev, p, rate)
        try:
            log(f"{label} {p.name}: upload queue {leaf}")
            r = {"upload_leaf_qdisc": leaf, "idle": netpath.idle_rtt(vm)}
            log(f"  idle rtt {r['idle']}")
            r.update(netpath.measure(vm, args.runs, args.seconds, args.omit, tests=tests, log=log))
            if p.name in args.capture and tests == netpath.TESTS:
                try:
                    r["capture"] = capture(vm, p, label, args)
                except (AssertionError, subprocess.TimeoutExpired) as e:   # say so, go on with the next path
                    log(f"  baseline capture {label} {p.name} failed: {str(e)[-300:]}")
                    vm.wait_ssh(300)
        finally:
            netpath.unshape(vm, dev)
        res["paths"][p.name] = r
    return res


def capture(vm, p: netpath.Path, label: str, args) -> str:
    prof = f"/tmp/np/capture-{p.name}.yaml"
    put(vm, prof, yaml.safe_dump(capture_profile(p, args.seconds, args.omit)))
    out = f"/tmp/np/{label}-{p.name}.json"
    c = vm.ssh(f"{CLI} baseline capture -p {prof} --quick --no-engine --out {out}", timeout=900)
    log(f"  baseline capture {label} {p.name}: rc {c.returncode} {c.stderr.strip()[-300:]}")
    return out


def compare(vm, before: str, after: str) -> dict:
    c = vm.ssh(f"{CLI} baseline compare {before} {after} --json --allow-other-host", timeout=300)
    try:
        doc = json.loads(c.stdout)
    except ValueError:
        return {"rc": c.returncode, "error": (c.stdout + c.stderr)[-500:]}
    keep = {}
    for m in doc.get("metrics", []):
        if m["key"].startswith(("throughput", "rtt", "retransmits")):
            keep[m["key"]] = {k: m.get(k) for k in ("before", "after", "change_pct", "verdict", "regressed")}
    return {"rc": c.returncode, "metrics": keep}


def site_qdisc(vm, dev: str, kind: str) -> None:
    """The node's default qdisc, and the NIC's queues given it (the kernel's own mq root again)."""
    vm.ssh(f"sysctl -qw net.core.default_qdisc={kind} && tc qdisc replace dev {dev} root pfifo_fast && "
           f"tc qdisc del dev {dev} root", check=True)


def ratios(stock: dict, tuned: dict) -> dict:
    out = {}
    for test in (t for t in stock if t in tuned and isinstance(stock[t], dict) and "mbit" in stock[t]):
        for fig in FIGURES:
            s, t = stock[test].get(fig), tuned[test].get(fig)
            if s and t is not None:
                out[f"{test} {fig}"] = round(t / s, 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=250, help="shaped rate, Mbit/s, both ways")
    ap.add_argument("--paths", default="rack,sg,usw")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=6, help="measured seconds per iperf3 test")
    ap.add_argument("--omit", type=int, default=3, help="seconds of slow start left out")
    ap.add_argument("--capture", default="rack,sg,usw", help="paths with baseline capture (empty: none)")
    ap.add_argument("--probe", action="store_true", help="also measure the node unshaped first (the emulated "
                    "guest soft-locked under an unshaped flood on 2026-12-07)")
    ap.add_argument("--tests", default=",".join(t[0] for t in netpath.TESTS),
                    help="which of up1,up4,down1,down4 (a faster rate: the single flows only)")
    ap.add_argument("--no-pfifo", dest="pfifo", action="store_false",
                    help="leave out the stock node with a site's pfifo_fast (upload tests only)")
    ap.add_argument("--out", help="the JSON record")
    ap.add_argument("--png", help="the chart")
    args = ap.parse_args()
    args.capture = [x for x in args.capture.split(",") if x]
    args.tests = tuple(t for t in netpath.TESTS if t[0] in args.tests.split(","))
    paths = [netpath.PATHS[n] for n in args.paths.split(",")]
    env_tools_on_path()
    cache = os.environ.get("HKGPU_VM_DIR", "/var/cache/hkgpu-tune/vm")
    img = image_dir(cache)
    t0 = time.monotonic()
    b = subprocess.run([os.path.join(HERE, "build.sh"), img], capture_output=True, text=True, timeout=1800)
    if b.returncode:
        sys.exit(f"image build failed:\n{b.stdout}\n{b.stderr}")
    work = tempfile.mkdtemp(prefix="netproof-")
    vm = VM(img, work)
    rec = {"date": datetime.date.today().isoformat(), "rate_mbit": args.rate, "runs": args.runs,
           "seconds": args.seconds, "omit_s": args.omit, "buffer_ms": netpath.BUFFER_MS}
    try:
        vm.start()
        log(f"booted in {vm.wait_ssh():.0f} s")
        from hkgpu_tune.fleet.rack import run_playbook
        inv = vm.inventory(os.path.join(work, "hosts.yml"))
        extra = {"hkgpu_install_cache_dir": os.path.join(work, "wheels"),
                 "hkgpu_install_wheelhouse": os.path.join(img, "wheelhouse")}
        run = run_playbook("apply", inv, extravars=extra, tags="install")
        if run.rc or run.hosts["hkvm"].is_failed:
            sys.exit(f"install failed: {run.to_dict()}")
        log("toolkit installed (hkgpu_install role)")
        dev = netpath.nic(vm)
        vm.ssh(f"ip link set {dev} up; mkdir -p /tmp/np", check=True)
        rec["kernel"] = vm.ssh("uname -r", check=True).stdout.strip()
        rec["iperf3"] = vm.ssh("iperf3 --version | head -1", check=True).stdout.strip()
        netpath.peer_up(vm)
        if args.probe:
            rec["unshaped"] = netpath.measure(vm, 1, args.seconds, args.omit, tests=netpath.TESTS, log=log)
        stock = run_node(vm, dev, "stock", paths, args.rate, args, tests=args.tests)
        pfifo = None
        if args.pfifo:
            # a site that sets pfifo_fast (as tests/vm/test_node.py does; Debian's own is fq_codel):
            # only the upload tests, where the node's qdisc holds the queue
            site_qdisc(vm, dev, "pfifo_fast")
            pfifo = run_node(vm, dev, "pfifo", paths, args.rate, args, tests=tuple(t for t in args.tests if not t[2]))
            site_qdisc(vm, dev, stock["settings"]["net.core.default_qdisc"])
        put(vm, PROFILE_ON_NODE, yaml.safe_dump(node_profile(), sort_keys=False))
        a = vm.ssh(f"{CLI} apply -p {PROFILE_ON_NODE}", timeout=900)
        v = vm.ssh(f"{CLI} verify -p {PROFILE_ON_NODE} --json", timeout=900)
        bad = [r for r in json.loads(v.stdout or "{}").get("results", []) if r["status"] != "ok"]
        log(f"apply rc {a.returncode}; verify rc {v.returncode}, not ok: "
            f"{[(r['subsystem'], r['key'], r['status']) for r in bad]}")
        rec["apply"] = {"rc": a.returncode, "verify_rc": v.returncode,
                        "verify_not_ok": [f"{r['subsystem']} {r['target']} {r['key']}: {r['status']}" for r in bad]}
        tuned = run_node(vm, dev, "tuned", paths, args.rate, args, tests=args.tests)
        rec["stock_settings"], rec["tuned_settings"] = stock["settings"], tuned["settings"]
        if pfifo:
            rec["stock_pfifo_settings"] = pfifo["settings"]
        rec["paths"] = {}
        for p in paths:
            s, t = stock["paths"][p.name], tuned["paths"][p.name]
            entry = {"label": p.label, "rtt_ms": p.rtt_ms, "jitter_ms": p.jitter_ms, "loss_pct": p.loss_pct,
                     "rate_mbit": args.rate, "stock": s, "tuned": t, "ratio": ratios(s, t)}
            if "capture" in s and "capture" in t:
                entry["compare"] = {"stock_to_tuned": compare(vm, s.pop("capture"), t.pop("capture")),
                                    "tuned_to_stock": compare(vm, f"/tmp/np/tuned-{p.name}.json",
                                                              f"/tmp/np/stock-{p.name}.json")}
            if pfifo:
                f = pfifo["paths"][p.name]
                entry["stock_pfifo"] = f
                entry["ratio_vs_pfifo"] = {k: v for k, v in ratios(f, t).items() if k.startswith("up")}
            rec["paths"][p.name] = entry
        rec["wall_s"] = round(time.monotonic() - t0)
    finally:
        netpath.peer_down(vm)
        vm.stop()
    if args.out:   # the record first: a table or chart that fails must not lose it
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")
    table(rec)
    if args.png:
        chart(rec, args.png)
    return 0


def table(rec: dict) -> None:
    print(f"\nrate {rec['rate_mbit']} Mbit/s, {rec['runs']} runs of {rec['seconds']} s; kernel {rec['kernel']}")
    print(f"{'path':5} {'test':6} {'figure':13} {'stock':>9} {'tuned':>9} {'tuned/stock':>11} {'pfifo':>9} "
          f"{'tuned/pfifo':>11}")

    def cell(v, w):
        return f"{v if v is not None else '-':>{w}}"
    for name, e in rec["paths"].items():
        for test in (t for t, _, _ in netpath.TESTS if t in e["stock"]):
            for fig in FIGURES:
                s, t = e["stock"][test].get(fig), e["tuned"][test].get(fig)
                f = e.get("stock_pfifo", {}).get(test, {}).get(fig)
                print(f"{name:5} {test:6} {fig:13} {cell(s, 9)} {cell(t, 9)} {cell(e['ratio'].get(f'{test} {fig}'), 11)} "
                      f"{cell(f, 9)} {cell(e.get('ratio_vs_pfifo', {}).get(f'{test} {fig}'), 11)}")
        for way, c in e.get("compare", {}).items():
            print(f"{name:5} compare {way}: rc {c.get('rc')} " +
                  ", ".join(f"{k}: {m['verdict']}" for k, m in (c.get("metrics") or {}).items()))


def chart(rec: dict, png: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(rec["paths"])
    tests = [t for t, _, _ in netpath.TESTS if any(t in rec["paths"][n]["stock"] for n in names)]
    fig, axes = plt.subplots(2, len(names), figsize=(4.2 * len(names), 7), squeeze=False)
    for i, name in enumerate(names):
        e = rec["paths"][name]
        x = range(len(tests))
        for j, (node, color) in enumerate((("stock", "tab:blue"), ("tuned", "tab:orange"))):
            axes[0][i].bar([k + j * 0.4 for k in x], [e[node].get(t, {}).get("mbit") or 0 for t in tests], 0.4,
                           color=color, label=node)
            axes[1][i].bar([k + j * 0.4 for k in x], [e[node].get(t, {}).get("rtt_p99_ms") or 0 for t in tests], 0.4,
                           color=color, label=f"{node} p99")
            axes[1][i].scatter([k + j * 0.4 for k in x], [e[node].get(t, {}).get("rtt_p50_ms") or 0 for t in tests],
                               color="black", marker="_", s=200, zorder=3, label="p50" if j == 0 else None)
        axes[0][i].axhline(rec["rate_mbit"], color="gray", ls="--", lw=1, label="shaped rate")
        axes[1][i].axhline(e["rtt_ms"] + 20, color="gray", ls="--", lw=1, label="base RTT + 20 ms")
        for ax in (axes[0][i], axes[1][i]):
            ax.set_xticks([k + 0.2 for k in x], tests)
        axes[0][i].set_title(e["label"], fontsize=9)
        axes[0][i].set_ylabel("TCP throughput, Mbit/s")
        axes[1][i].set_ylabel("RTT under that load, ms")
    axes[0][0].legend(fontsize=8)
    axes[1][0].legend(fontsize=8)
    fig.suptitle(f"VM test node, stock vs hk-inference, shaped {rec['rate_mbit']} Mbit/s ({rec['date']})")
    fig.tight_layout()
    fig.savefig(png, dpi=90)


if __name__ == "__main__":
    sys.exit(main())
