#!/usr/bin/env python3
"""Time one `hkgpu-tune export` run (verify + every collector, probes excluded), side by side:

- as a whole process on this machine (default profile, its own textfile directory): target <= 1 s;
- in-process for a replayed host of 2 mlx5 ports x 64 queues and 8 GPUs
  (tests/fixtures/monitor/replay_host.py): target <= 100 ms;
- the series in that host's textfile: target < 2,000, with the families that dominate.

    python3 bench/export_bench.py [runs]

Prints minimum and median of each, and each median's ratio to its target."""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
RUNS = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 20
TARGET_PROCESS_MS, TARGET_INPROC_MS, TARGET_SERIES = 1000, 100, 2000


def timeit(fn, runs):
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def main():
    from hkgpu_tune.observe import export as X
    from tests.fixtures.monitor import replay_host as R

    tmp = tempfile.mkdtemp(prefix="hkexport-")
    try:
        proc_dir, rep_dir = os.path.join(tmp, "process"), os.path.join(tmp, "replay")
        os.mkdir(proc_dir)
        os.mkdir(rep_dir)
        env = {**os.environ, "HKGPU_TUNE_STATE_DIR": os.path.join(tmp, "state")}
        argv = [sys.executable, "-m", "hkgpu_tune", "export", "--textfile-dir", proc_dir,
                "--state-dir", os.path.join(tmp, "state")]

        def process():
            p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)
            assert p.returncode in (0, 2), p.stderr

        def bare():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def replay():
            prof, eng, src = R.host(os.path.join(tmp, "state"))
            t = time.perf_counter()
            rep = X.export(prof, rep_dir, engine=eng, sources=src)
            replay.ms.append((time.perf_counter() - t) * 1000)
            replay.rep = rep
        replay.ms = []

        process()                      # warm the page cache and the bytecode
        for _ in range(2):
            replay()
        replay.ms = []
        rows = [("bare interpreter (python3 -c pass)", timeit(bare, RUNS), None),
                ("export, whole process, this host", timeit(process, RUNS), TARGET_PROCESS_MS)]
        for _ in range(RUNS):
            replay()
        rows.append(("export, in-process, replayed 2x64q + 8 GPU", replay.ms, TARGET_INPROC_MS))

        print(f"hkgpu-tune export bench: {RUNS} runs each, {os.cpu_count()} CPUs")
        print(f"{'':46s} {'min ms':>8s} {'median':>8s} {'target':>8s} {'median/target':>14s}")
        for name, ms, target in rows:
            med = statistics.median(ms)
            t = f"{target:8d}" if target else f"{'-':>8s}"
            ratio = f"{med / target:14.2f}" if target else f"{'-':>14s}"
            print(f"{name:46s} {min(ms):8.1f} {med:8.1f} {t} {ratio}")

        rep = replay.rep
        fams = Counter(ln.split("{")[0].split(" ")[0] for ln in rep.text.splitlines() if ln and ln[0] != "#")
        print(f"\nreplayed host textfile: {rep.series} series (target < {TARGET_SERIES}: "
              f"{rep.series / TARGET_SERIES:.2f} of it), {len(rep.text)} bytes")
        for name, n in fams.most_common(6):
            print(f"  {n:5d}  {name}")
        print("collector times of the last replayed run (ms):", ", ".join(
            f"{c.collector} {c.seconds * 1000:.1f}" for c in rep.collectors))
        ok = (statistics.median(rows[1][1]) <= TARGET_PROCESS_MS and statistics.median(replay.ms) <= TARGET_INPROC_MS
              and rep.series < TARGET_SERIES)
        print("\nall targets met" if ok else "\nTARGET MISSED")
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
