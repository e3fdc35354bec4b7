#!/usr/bin/env python3
"""A small mutation check of the core: one-line bugs planted, one at a time, in a copy of the tree;
the fast tests that own the behaviour must fail on each. Prints each mutant and the score.

    python3 scripts/mutate.py              # all mutants (about 6 minutes on 2 busy cores)
    python3 scripts/mutate.py -k sysctl    # those whose name contains "sysctl"
    python3 scripts/mutate.py --list

A mutant is (name, file, the exact text, its replacement, the tests that own it). The text must
occur exactly once in the file: a mutant whose line moved fails loudly instead of testing nothing.
Survivors are listed with why they are equivalent (EQUIVALENT below) or fail the run (exit 1).
docs/testing.md has the last score and how to read it.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NORM, SYS, LINK, QD = ("hkgpu_tune/core/normalize.py", "hkgpu_tune/subsystems/sysctl.py",
                       "hkgpu_tune/subsystems/link.py", "hkgpu_tune/subsystems/qdisc.py")
ENG, JOUR, STATE, NODE, PROF = ("hkgpu_tune/tune/engine.py", "hkgpu_tune/tune/journal.py", "hkgpu_tune/tune/state.py",
                                "hkgpu_tune/core/yamlnode.py", "hkgpu_tune/core/profile.py")
CLIENT = "hkgpu_tune/serve/running/client.py"
UNIT = ["tests/unit/test_normalize.py", "tests/unit/test_sysctl_compare.py", "tests/unit/test_qdisc_compare.py",
        "tests/unit/test_engine.py"]
JOURNAL = ["tests/unit/test_engine.py", "tests/hostile/test_journal.py", "tests/hostile/test_kills.py"]
PROFILE = ["tests/unit/test_profile.py", "tests/unit/test_profile_bounds.py", "tests/hostile/test_profile.py"]

MUTANTS = [
    # sysctl: compare and normalise
    ("normalize: numbers compared as not-equal flipped", NORM, "            if nx != ny:", "            if nx == ny:", UNIT),
    ("normalize: field count ignored", NORM, "    if len(a) != len(b):\n        return False\n    for x, y in zip(a, b):\n        nx, ny = _num(x), _num(y)\n        if nx is not None and ny is not None:",
     "    for x, y in zip(a, b):\n        nx, ny = _num(x), _num(y)\n        if nx is not None and ny is not None:", UNIT),
    ("normalize: hex not parsed", NORM, 'return int(t, 0) if t.lower().startswith("0x") else int(t)', "return int(t)", UNIT),
    ("normalize: strings compared equal", NORM, "        elif x != y:\n            return False\n    return True",
     "        elif x == y:\n            return False\n    return True", UNIT),
    ("normalize: at_least takes less", NORM, "if nx is None or ny is None or nx < ny:", "if nx is None or ny is None or nx > ny:", UNIT),
    ("normalize: as_bool drops 'on'", "hkgpu_tune/core/normalize.py", 'if s in ("1", "on", "true", "yes", "enabled"):',
     'if s in ("1", "true", "yes", "enabled"):', UNIT + ["tests/unit/test_profile.py"]),
    ("sysctl: every key compared as at-least (tcp_mtu_probing 2 ok for 1)", SYS,
     '            elif s.compare == "at_least" and at_least(cur, s.value):', "            elif at_least(cur, s.value):", UNIT),
    ("sysctl: read-back ignores what the kernel shows", SYS, "        if got is None or not same(got, value):",
     "        if got is None:", UNIT),
    ("sysctl: missing key not unsupported", SYS, "            elif cur is None:\n                res.append(self.result(\"host\", s.key, None, s.value, UNSUPPORTED,",
     "            elif cur is None and False:\n                res.append(self.result(\"host\", s.key, None, s.value, UNSUPPORTED,", UNIT),
    ("sysctl: drift raises the wrong fields (min)", SYS, "want = \" \".join(str(max(int(c), int(d)))", "want = \" \".join(str(min(int(c), int(d)))", UNIT),
    # link
    ("link: MTU compare inverted", LINK, '            if ln["mtu"] == rule.mtu:', '            if ln["mtu"] != rule.mtu:', UNIT),
    ("link: IPv4 probe header 20 not 28", LINK, "HEADER = {4: 28, 6: 48}", "HEADER = {4: 20, 6: 48}", UNIT),
    ("link: WAN probe MTU 9000", LINK, "WAN_MTU = 1500", "WAN_MTU = 9000", UNIT),
    ("link: a down link is not a failure", LINK, '            if not ln.get("up", True):\n                fails.append(',
     '            if False:\n                fails.append(', UNIT + ["tests/hostile/test_mtu_probe.py"]),
    # qdisc
    ("qdisc: single queue compare inverted", QD, 'st = OK if q["root"] == kind else (DRIFT if supported else UNSUPPORTED)',
     'st = OK if q["root"] != kind else (DRIFT if supported else UNSUPPORTED)', UNIT + ["tests/hostile/test_qdisc_cache.py"]),
    ("qdisc: unsupported kind called drift", QD, 'st = OK if q["root"] == kind else (DRIFT if supported else UNSUPPORTED)',
     'st = OK if q["root"] == kind else DRIFT', UNIT + ["tests/hostile/test_qdisc_cache.py"]),
    ("qdisc: the kernel's own mq taken as in place", QD, '            root_ok = q["root"] == "mq" and not own', '            root_ok = q["root"] == "mq"',
     UNIT + ["tests/hostile/test_qdisc_cache.py"]),
    ("qdisc: queue count ignored", QD, 'in_place = (q["root"] == "mq" and len(q["children"]) == ln["tx_queues"]',
     'in_place = (q["root"] == "mq"', UNIT + ["tests/hostile/test_qdisc_cache.py"]),
    # journal and rollback
    ("rollback: oldest first", ENG, "            for c in reversed(list(entries)):", "            for c in list(entries):", JOURNAL),
    ("rollback: entries kept after restore", ENG, "                entries.remove(c)\n                self.state.save(entries, register=False)",
     "                self.state.save(entries, register=False)", JOURNAL),
    ("undo of a failed apply: oldest first", JOUR, "        for c in reversed(self.written):", "        for c in self.written:", JOURNAL),
    ("journal: the newest original wins", JOUR, "            if self._entry(c) is None:\n                self.entries.append(",
     "            if True:\n                self.entries.append(", JOURNAL),
    ("journal: originals not saved before the write", JOUR, "        if changes:\n            self.save()\n", "        pass\n", JOURNAL),
    ("apply: a failure is not rolled back", ENG, "            errs = j.undo_run(self._restore)", "            errs = []", JOURNAL),
    ("apply: a refused write left written", ENG, "                    self.by_name[c.subsystem].restore(c)\n                    put_back = True",
     "                    put_back = True", JOURNAL),
    ("state: empty journal file kept", STATE, "        if not changes:\n            self.clear()\n            return",
     "        if False:\n            self.clear()\n            return", JOURNAL),
    # profile parsing
    ("profile: integer bounds not checked", NODE, "        if (lo is not None and v < lo) or (hi is not None and v > hi):",
     "        if False:", PROFILE),
    ("profile: upper bound off by one", NODE, "(hi is not None and v > hi)", "(hi is not None and v > hi + 1)", PROFILE),
    ("profile: a boolean taken as an integer", NODE, "        if isinstance(v, bool) or not isinstance(v, int):",
     "        if not isinstance(v, int):", PROFILE),
    ("profile: MTU minimum 0", PROF, 'mtu=f["mtu"].integer(68, 65535)', 'mtu=f["mtu"].integer(0, 65535)', PROFILE),
    # triton model control: the gRPC path answered, the HTTP fallback must still load
    ("triton: the HTTP fallback skips the load", CLIENT,
     '        status, _, data = self.request("POST", f"/v2/repository/models/{name}/load", json.dumps(body).encode(),\n'
     '                                       {"Content-Type": "application/json"})\n        if status != 200:',
     '        status, data = 200, b""\n        if status != 200:', ["tests/triton/test_load_stall.py::test_model_control_falls_back_to_http_where_grpc_is_not_reachable"]),
]

# survivors shown to be equivalent (same behaviour for every input the code can get), with why
EQUIVALENT: dict[str, str] = {}


def run_one(tree: str, name: str, path: str, old: str, new: str, tests: list[str], timeout: int) -> tuple[str, float]:
    full = os.path.join(tree, path)
    with open(full) as f:
        text = f.read()
    if text.count(old) != 1:
        return f"STALE (the text occurs {text.count(old)} times in {path})", 0.0
    with open(full, "w") as f:
        f.write(text.replace(old, new))
    t = time.monotonic()
    try:
        env = {**os.environ, "PYTHONPATH": tree, "HKGPU_SLOW_CHECK": "0", "PYTHONDONTWRITEBYTECODE": "1"}
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly",
                            *tests], cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        verdict = "killed" if p.returncode == 1 else "survived" if p.returncode == 0 else f"error (pytest exit {p.returncode})"
    except subprocess.TimeoutExpired:
        verdict = "killed (timeout)"
    finally:
        with open(full, "w") as f:
            f.write(text)
    return verdict, time.monotonic() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-k", default="", help="only mutants whose name contains this")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per mutant's test run")
    a = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if a.k in m[0]]
    if a.list:
        for m in chosen:
            print(f"{m[0]}  ({m[1]}; {' '.join(m[4])})")
        return 0
    tree = tempfile.mkdtemp(prefix="hkgpu-mutate-")
    try:
        for d in ("hkgpu_tune", "tests", "profiles", "roles", "collections", "bench", "monitoring", "inventory"):
            if os.path.exists(os.path.join(ROOT, d)):
                shutil.copytree(os.path.join(ROOT, d), os.path.join(tree, d), symlinks=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for f in ("pyproject.toml", "ansible.cfg"):
            shutil.copy(os.path.join(ROOT, f), tree)
        rows = []
        for name, path, old, new, tests in chosen:
            verdict, took = run_one(tree, name, path, old, new, tests, a.timeout)
            rows.append((name, verdict))
            print(f"{verdict:<24} {took:6.1f} s  {name}", flush=True)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    killed = sum(v.startswith("killed") for _, v in rows)
    equiv = [n for n, v in rows if v == "survived" and n in EQUIVALENT]
    bad = [n for n, v in rows if not v.startswith("killed") and n not in equiv]
    print(f"\nscore: {killed}/{len(rows)} killed, {len(equiv)} equivalent, {len(bad)} left"
          + (f" ({killed / max(1, len(rows) - len(equiv)):.0%} of the non-equivalent)" if rows else ""))
    for n in equiv:
        print(f"  equivalent: {n}: {EQUIVALENT[n]}")
    for n in bad:
        print(f"  LEFT: {n}: {dict(rows)[n]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
