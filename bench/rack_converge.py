#!/usr/bin/env python3
"""Converge a simulated rack with the hkgpu roles and with a naive role, side by side.

    sudo python bench/rack_converge.py --hosts 8 [--reruns 3]

One run builds the rack (tests/rack/simrack.py), then times with plain ansible-playbook:
  hkgpu  first converge (toolkit not yet installed), first converge (installed, settings at
         their originals), idempotent re-run (median of --reruns)
  naive  first converge and idempotent re-run of bench/naive_role.yml: the same settings with
         one Ansible task per setting (read, compare, write in a shell task)
and prints them with the ratios. Targets: hkgpu re-run of 8 hosts <= 10 s and >= 3x faster
than the naive re-run. The rack is removed at the end.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "rack"))
import simrack  # noqa: E402

RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def playbook(path, inv, extra=()) -> tuple[float, dict]:
    env = {**os.environ, "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg")}
    t0 = time.monotonic()
    r = subprocess.run(["ansible-playbook", "-i", inv, path, *extra], capture_output=True, text=True, env=env)
    dt = time.monotonic() - t0
    recap = {m[0]: {"changed": int(m[2]), "failed": int(m[4]) + int(m[3])} for m in RECAP.findall(r.stdout)}
    if r.returncode != 0 or any(v["failed"] for v in recap.values()):
        sys.exit(f"{path} failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
    return dt, recap


def changed(recap) -> int:
    return sum(v["changed"] for v in recap.values())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--reruns", type=int, default=3)
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces, sshd)")
    run = tempfile.mkdtemp(prefix="hkrack-bench-")
    wheels = tempfile.mkdtemp(prefix="hkrack-wheels-")
    os.environ["XDG_CACHE_HOME"] = wheels      # hkgpu_install's controller cache, this run's own
    extra = []
    site = os.path.join(REPO, "playbooks", "site.yml")
    rollback = os.path.join(REPO, "playbooks", "rollback.yml")
    naive = os.path.join(HERE, "naive_role.yml")
    load0 = os.getloadavg()[0]
    inv = simrack.up(a.hosts, run=run)
    try:
        # build the wheel once outside the timings (the controller's part of the install)
        subprocess.run([sys.executable, os.path.join(REPO, "roles", "hkgpu_install", "files", "hkgpu_ship.py")],
                       check=True, capture_output=True, env={**os.environ, "PYTHONPATH": REPO})
        rows = {}
        t_fresh, rc = playbook(site, inv, extra)
        assert changed(rc) > 0
        reruns = []
        for _ in range(a.reruns):
            t, rc = playbook(site, inv, extra)
            assert changed(rc) == 0, rc
            reruns.append(t)
        playbook(rollback, inv, extra)
        t_first, rc = playbook(site, inv, extra)
        assert changed(rc) > 0
        rows["hkgpu"] = (t_fresh, t_first, statistics.median(reruns))
        playbook(rollback, inv, extra)

        t_first, rc = playbook(naive, inv)
        assert changed(rc) > 0
        reruns = []
        for _ in range(a.reruns):
            t, rc = playbook(naive, inv)
            assert changed(rc) == 0, rc
            reruns.append(t)
        rows["naive"] = (None, t_first, statistics.median(reruns))
    finally:
        simrack.down(run, quiet=True)
        shutil.rmtree(wheels, ignore_errors=True)
    h, n = rows["hkgpu"], rows["naive"]
    print(f"simulated rack: {a.hosts} hosts, {os.cpu_count()} CPUs on the controller; re-run = median of {a.reruns}; "
          f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(f"{'':24}{'first (fresh node)':>20}{'first converge':>16}{'idempotent re-run':>20}")
    print(f"{'hkgpu roles (site.yml)':24}{h[0]:>19.1f}s{h[1]:>15.1f}s{h[2]:>19.1f}s")
    print(f"{'naive role (1 task/set)':24}{'-':>20}{n[1]:>15.1f}s{n[2]:>19.1f}s")
    print(f"{'naive / hkgpu':24}{'':>20}{n[1] / h[1]:>15.1f}x{n[2] / h[2]:>19.1f}x")
    ok = h[2] <= 10 and n[2] / h[2] >= 3
    print(f"targets (re-run <= 10 s, >= 3x): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
