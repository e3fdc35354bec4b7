#!/usr/bin/env python3
"""What a fleet costs: push converge, idempotent re-run and verify of N simulated hosts at several
fork counts, and pull mode on a few of them, with wall time and CPU-seconds per host.

    sudo python bench/fleet_converge.py --hosts 64 --forks 16,64 --pull-nodes 4 --json OUT.json

The rack is tests/rack/simrack.py (a network namespace and a real sshd per host) and the playbooks
come from a site repository (tests/rack/pullsite.py), so one push also installs the pull units.
CPU is read, not guessed: the controller's is what ansible-playbook and its children used
(getrusage of the reaped children, plus the ssh ControlMaster processes adopted by this process as
a child subreaper, read from /proc); the nodes' is the process tree of each host's sshd (reaped
children in cutime/cstime, live ones from /proc/PID/stat). A pull's CPU is all on the node.
Prints per phase: wall, controller CPU-s per host, nodes' CPU-s per host, tasks per host; the
targets (re-run <= 0.5 s controller CPU a host, N hosts re-run <= 30 s) and the hosts one
controller core keeps converged every 15 minutes (900 s / re-run CPU per host).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "rack"))
sys.path.insert(0, REPO)
import pullsite  # noqa: E402
import simrack  # noqa: E402

RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
TICK = os.sysconf("SC_CLK_TCK")


def procs() -> dict[int, tuple[int, float]]:
    """pid -> (ppid, CPU-s of itself and its reaped children)."""
    out = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                rest = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(p)] = (int(rest[1]), sum(int(x) for x in rest[11:15]) / TICK)
    return out


def tree(roots, table) -> float:
    """CPU-s of the live descendants of roots (and of the roots themselves, unless this process)."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    total, todo = 0.0, list(roots)
    while todo:
        pid = todo.pop()
        if pid != os.getpid() and pid in table:
            total += table[pid][1]
        todo.extend(kids.get(pid, []))
    return total


def reap():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def snapshot(sshd_pids) -> tuple[float, float]:
    reap()
    t = procs()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime + tree([os.getpid()], t), tree(sshd_pids, t)


def measure(name, n, sshd_pids, fn) -> dict:
    c0, h0 = snapshot(sshd_pids)
    t0 = time.monotonic()
    extra = fn()
    wall = time.monotonic() - t0
    c1, h1 = snapshot(sshd_pids)
    row = {"phase": name, "hosts": n, "wall_s": round(wall, 1), "controller_cpu_s_per_host": round((c1 - c0) / n, 3),
           "node_cpu_s_per_host": round((h1 - h0) / n, 3), **(extra or {}),
           # the machine's load at the end of the phase: CPU-s are the measure where it was high
           "load_average_end": [round(x, 1) for x in os.getloadavg()]}
    print(json.dumps(row), flush=True)
    return row


def seed(run: str, hosts: list[str]) -> None:
    """Copy the first host's installed toolkit (its venv under hkgpu_prefix) to the other hosts,
    their own paths written into the venv's scripts and configuration (--seed-toolkit)."""
    src = os.path.join(run, hosts[0], "opt", "hkgpu-tune")
    for h in hosts[1:]:
        dst = os.path.join(run, h, "opt", "hkgpu-tune")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, symlinks=True)
        for d, _, files in os.walk(dst):
            if d != dst and not d.startswith(os.path.join(dst, "bin")) and not d.endswith("site-packages"):
                continue
            for f in files:
                path = os.path.join(d, f)
                if os.path.islink(path):
                    if src in os.readlink(path):
                        t = os.readlink(path).replace(src, dst)
                        os.unlink(path)
                        os.symlink(t, path)
                    continue
                with open(path, "rb") as fh:
                    data = fh.read()
                if src.encode() in data:
                    with open(path, "wb") as fh:
                        fh.write(data.replace(src.encode(), dst.encode()))


def playbook(site, name, forks, expect_changed=None, limit=None) -> dict:
    env = {**os.environ, "ANSIBLE_CONFIG": os.path.join(site["work"], "ansible.cfg")}
    r = subprocess.run(["ansible-playbook", "-i", site["inventory"], "-f", str(forks), "--skip-tags",
                        ",".join(pullsite.SKIP_TAGS), *(["--limit", limit] if limit else []),
                        os.path.join(site["work"], "playbooks", name)], capture_output=True, text=True, env=env)
    recap = RECAP.findall(r.stdout)
    if r.returncode != 0 or any(int(m[3]) or int(m[4]) for m in recap):
        fatal = "\n".join(ln[:600] for ln in r.stdout.splitlines() if ln.startswith(("fatal:", "failed:")))
        sys.exit(f"{name} failed (rc {r.returncode}):\n{fatal[:6000]}\n{r.stdout[-1500:]}\n{r.stderr[-2000:]}")
    changed = sum(int(m[2]) for m in recap)
    if expect_changed is not None and (changed > 0) != expect_changed:
        sys.exit(f"{name}: {changed} changed, expected {'some' if expect_changed else 'none'}")
    return {"forks": forks, "tasks_per_host": round(sum(int(m[1]) for m in recap) / len(recap), 1), "changed": changed}


def pull_all(nodes) -> dict:
    for h in nodes:
        r = pullsite.pull(h)
        if r.returncode:
            sys.exit(f"pull on {h} failed:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
    return {"mode": "pull", "nodes_in_sequence": len(nodes)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--forks", default="16,64", help="comma-separated fork counts")
    ap.add_argument("--pull-nodes", type=int, default=4, help="nodes that converge by pull (n1 is the canary)")
    ap.add_argument("--subnet", type=int, default=14, help="the rack's 198.18.N.0/24 (and its names)")
    ap.add_argument("--converge-each", action="store_true", help="roll back and converge again at each fork count")
    ap.add_argument("--pull-only", action="store_true", help="after the first push, only the pull phases")
    ap.add_argument("--json", help="write the rows and the sums here")
    ap.add_argument("--seed-toolkit", action="store_true",
                    help="install the toolkit on the first host only, copy its venv to the others, then the "
                         "first converge of all (on 2 shared cores, 64 pip installs do not fit in an hour)")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces, sshd)")
    forks = [int(f) for f in a.forks.split(",")]
    run = tempfile.mkdtemp(prefix="hkrack-fleet-")
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="hkrack-wheels-")
    load0 = os.getloadavg()
    # a rack of its own (names, subnet): other racks on this machine are left alone
    net = f"198.18.{a.subnet}"
    simrack.PREFIX, simrack.BRIDGE, simrack.NET = f"hkf{a.subnet}-", f"hkf{a.subnet}-br", net
    simrack.GATEWAY, simrack.FABRIC_PEER = f"{net}.1", f"{net}.250"
    inv = simrack.up(a.hosts, run=run)
    rows = []
    try:
        site = pullsite.make(run, inv, canaries=simrack.host_names(1))
        sshd = [int(open(os.path.join(run, h, "sshd.pid")).read().split()[0]) for h in simrack.host_names(a.hosts)]
        # adopt the ssh ControlMaster processes ansible leaves behind, so their CPU is counted
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)      # PR_SET_CHILD_SUBREAPER
        subprocess.run([sys.executable, os.path.join(REPO, "roles", "hkgpu_install", "files", "hkgpu_ship.py")],
                       check=True, capture_output=True, env={**os.environ, "PYTHONPATH": REPO})
        n = a.hosts
        if a.seed_toolkit:
            hosts = simrack.host_names(n)
            rows.append(measure("push first converge, one fresh node (install)", 1, sshd,
                                lambda: playbook(site, "site.yml", forks[0], True, limit=hosts[0])))
            t0 = time.monotonic()
            seed(run, hosts)
            print(json.dumps({"seeded_hosts": n - 1, "wall_s": round(time.monotonic() - t0, 1)}), flush=True)
            rows.append(measure(f"push first converge, toolkit copied to {n - 1} nodes (settings, units)", n, sshd,
                                lambda: playbook(site, "site.yml", forks[0], True)))
        else:
            rows.append(measure("push first converge, fresh nodes (install)", n, sshd,
                                lambda: playbook(site, "site.yml", forks[0], True)))
        for i, f in enumerate([] if a.pull_only else forks):
            if i and a.converge_each:   # settings back at the originals, converge again at this fork count
                playbook(site, "rollback.yml", f)
                rows.append(measure("push first converge", n, sshd, lambda: playbook(site, "site.yml", f, True)))
            rows.append(measure("push idempotent re-run", n, sshd, lambda: playbook(site, "site.yml", f, False)))
            rows.append(measure("push verify", n, sshd, lambda: playbook(site, "verify.yml", f, False)))
        nodes = simrack.host_names(a.pull_nodes)
        rows.append(measure("pull first run (clone, converge v1, verify)", len(nodes), sshd, lambda: pull_all(nodes)))
        pullsite.publish(site, fin_timeout=23, message="fin_timeout 23")
        rows.append(measure("pull converge of a new version", len(nodes), sshd, lambda: pull_all(nodes)))
        rows.append(measure("pull idempotent re-run", len(nodes), sshd, lambda: pull_all(nodes)))
    finally:
        simrack.down(run, quiet=True)
    # a pull's CPU was counted in this process's children (the controller column): it is the node's
    for r in rows:
        if r.get("mode") == "pull":
            r["node_cpu_s_per_host"], r["controller_cpu_s_per_host"] = r["controller_cpu_s_per_host"], 0.0
    reruns = [r for r in rows if r["phase"] == "push idempotent re-run"]
    rerun = min(reruns, key=lambda r: r["wall_s"]) if reruns else None
    pull_rerun = next(r for r in rows if r["phase"] == "pull idempotent re-run")
    sums = {"pull_rerun_node_cpu_s": pull_rerun["node_cpu_s_per_host"], "targets": {}}
    if rerun:
        sums.update({
            "rerun_controller_cpu_s_per_host": rerun["controller_cpu_s_per_host"],
            "hosts_per_controller_core_every_15min": int(900 / rerun["controller_cpu_s_per_host"]),
            f"hosts_per_{os.cpu_count()}_core_controller_every_15min":
                int(900 * os.cpu_count() / rerun["controller_cpu_s_per_host"]),
            "rerun_wall_s": rerun["wall_s"], "rerun_forks": rerun["forks"],
            "targets": {"rerun_cpu_le_0.5": rerun["controller_cpu_s_per_host"] <= 0.5,
                        f"{a.hosts}_hosts_rerun_le_30s": rerun["wall_s"] <= 30}})
    meta = {"cpus": os.cpu_count(), "load_average_start": [round(x, 1) for x in load0],
            "load_average_end": [round(x, 1) for x in os.getloadavg()],
            "note": "controller and every node share this machine's CPUs with other work"}
    print(json.dumps(sums, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"hosts": a.hosts, "forks": forks, "machine": meta, "rows": rows, "sums": sums}, f, indent=1)
            f.write("\n")
    return 0 if all(sums["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
