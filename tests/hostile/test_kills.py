"""kill -9 at random points of apply, of rollback, and of apply --persist; then rollback: the
namespace's settings and the persisted files end exactly as they started. A handful of kills,
bounded in time; the seed is printed so a failure can be replayed (HKGPU_KILL_SEED)."""
import hashlib
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from .conftest import sh, write_profile

pytestmark = pytest.mark.root
SYSCTLS = ("net.ipv4.tcp_mtu_probing", "net.ipv4.tcp_ecn")


def kill_profile(tmp_path, net, count=2):
    sh("ip", "-n", net.B, "link", "set", net.b, "mtu", "9000")
    return write_profile(tmp_path, f"""\
network:
  interfaces:
    - match: {{name: {net.a}}}
      mtu: 9000
      offloads: {{gro: true, tso: false}}
      qdisc: pfifo_fast
  fabric_peers: [{net.ipb}]
  probe: {{count: {count}, timeout_s: 1}}
sysctl:
  net.ipv4.tcp_mtu_probing: 1
  net.ipv4.tcp_ecn: 1
""", name="kill.yaml")


def settings(net) -> dict:
    """What apply may change in namespace A, read with the system's own tools."""
    return {"mtu": net.link()["mtu"],
            "features": sh("ethtool", "-k", net.a, ns=net.A).stdout,
            "qdisc": sh("tc", "qdisc", "show", "dev", net.a, ns=net.A).stdout,
            "sysctl": {k: sh("sysctl", "-n", k, ns=net.A).stdout.strip() for k in SYSCTLS}}


def tree(root) -> dict:
    """Every path under root: kind, content hash or link target, mode."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = ("dir", st.st_mode & 0o7777)
            else:
                out[rel] = ("file", hashlib.sha256(open(p, "rb").read()).hexdigest(), st.st_mode & 0o7777)
    return out


def make_root(tmp_path, net):
    """A host's /etc: networkd owns the link (persist adds a drop-in), and an older profile copy
    that persist backs up and replaces."""
    root = tmp_path / "root"
    (root / "etc/systemd/network").mkdir(parents=True)
    (root / "etc/systemd/network/10-data.network").write_text(f"[Match]\nName={net.a}\n")
    (root / "etc/hkgpu-tune").mkdir()
    (root / "etc/hkgpu-tune/profile.yaml").write_text("name: older\n")
    return root


def argv(net, *args):
    return ["ip", "netns", "exec", net.A, sys.executable, "-m", "hkgpu_tune", *args]


def run(net, *args):
    p = subprocess.run(argv(net, *args), capture_output=True, text=True, timeout=60)
    return p


FINISHED = {"s": None}   # how long the last run that ended before its kill took


def run_killed(net, delay, *args) -> bool:
    """Start the CLI, kill -9 it after `delay` seconds; True when it was still running."""
    t = time.monotonic()
    p = subprocess.Popen(argv(net, *args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        p.wait(delay)
        FINISHED["s"] = time.monotonic() - t
        return False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return True


def timed(net, *args) -> float:
    t = time.monotonic()
    p = run(net, *args)
    assert p.returncode == 0, p.stdout + p.stderr
    return time.monotonic() - t


def rng():
    seed = int(os.environ.get("HKGPU_KILL_SEED") or random.randrange(1 << 30))
    print(f"HKGPU_KILL_SEED={seed}")
    return random.Random(seed)


def check_back(net, st, start, root=None, start_tree=None, what=""):
    p = run(net, "rollback", "--state-dir", str(st))
    assert p.returncode == 0, f"{what}: {p.stdout}{p.stderr}"
    assert settings(net) == start, what
    assert not (st / "state.json").exists(), what
    if root is not None:
        assert tree(root) == start_tree, what


@pytest.mark.slow
def test_kill_9_at_random_points_of_apply_then_rollback(net, tmp_path):
    p, st = kill_profile(tmp_path, net), tmp_path / "st"
    start = settings(net)
    t_apply = timed(net, "apply", "--profile", p, "--state-dir", str(st))
    assert settings(net) != start
    check_back(net, st, start, what="full apply")
    r, killed, tries = rng(), 0, 0
    while (killed < 3 or tries < 4) and tries < 10:   # bounded; a late kill tests nothing, so go on
        tries += 1
        delay = r.uniform(0.2, t_apply)
        if not run_killed(net, delay, "apply", "--profile", p, "--state-dir", str(st)):
            t_apply = max(0.25, min(t_apply, FINISHED["s"]))   # the machine got faster: a shorter window
        else:
            killed += 1
        check_back(net, st, start, what=f"apply killed after {delay:.2f}s")
    print(f"apply {t_apply:.2f}s, {killed} of {tries} killed")
    assert killed >= 2, "apply finished before most kills: nothing was tested"


@pytest.mark.slow
def test_kill_9_at_random_points_of_rollback_then_rollback_again(net, tmp_path):
    p, st = kill_profile(tmp_path, net), tmp_path / "st"
    start = settings(net)
    r, killed, tries = rng(), 0, 0
    # a kill that lands after the rollback ended tests nothing: go on (bounded) until two landed,
    # so a loaded machine, whose rollback takes longer or shorter than the first one, cannot fail it
    while killed < 2 and tries < 10:
        assert run(net, "apply", "--profile", p, "--state-dir", str(st)).returncode == 0
        t = time.monotonic()
        if tries == 0:
            check_back(net, st, start, what="full rollback")
            t_rb = time.monotonic() - t
            tries += 1
            continue
        tries += 1
        delay = r.uniform(0.3, 0.95) * t_rb
        killed += run_killed(net, delay, "rollback", "--state-dir", str(st))
        check_back(net, st, start, what=f"rollback killed after {delay:.2f}s")
    print(f"rollback {t_rb:.2f}s, {killed} of {tries - 1} killed")
    assert killed >= 1, "rollback finished before every kill: nothing was tested"


@pytest.mark.slow
def test_kill_9_at_random_points_of_apply_persist_then_rollback(net, tmp_path):
    p, st = kill_profile(tmp_path, net, count=1), tmp_path / "st"
    root = make_root(tmp_path, net)
    start, start_tree = settings(net), tree(root)
    args = ("apply", "--persist", "--root", str(root), "--profile", p, "--state-dir", str(st))
    t_apply = timed(net, *args)
    assert (root / "etc/sysctl.d/60-hkgpu-tune.conf").exists() and tree(root) != start_tree
    check_back(net, st, start, root, start_tree, what="full apply --persist")
    r, killed, tries = rng(), 0, 0
    while (killed < 2 or tries < 6) and tries < 12:   # bounded; a late kill tests nothing, so go on
        tries += 1
        # the later part of the run is where the files are written
        delay = r.uniform(0.5 * t_apply, t_apply)
        if not run_killed(net, delay, *args):
            # faster than the first run (the machine's load changed): draw within this run's time
            t_apply = min(t_apply, FINISHED["s"])
        else:
            killed += 1
        check_back(net, st, start, root, start_tree, what=f"apply --persist killed after {delay:.2f}s")
    print(f"apply --persist {t_apply:.2f}s, {killed} of {tries} killed")
    assert killed >= 1, "apply --persist finished before every kill: nothing was tested"


# kill -9 at each file write of the run in turn (state file, persisted files, their directories and
# the boot unit's link), just before it and just after it: a random kill seldom lands in the few
# milliseconds that --persist takes
DRIVER = r"""
import os, signal, sys
at, seen = int(os.environ["HK_KILL_AT"]), [0]
def point():
    seen[0] += 1
    if seen[0] == at:
        os.kill(os.getpid(), signal.SIGKILL)
def wrap(f):
    def g(*a, **k):
        point()
        r = f(*a, **k)
        point()
        return r
    return g
import atexit
import hkgpu_tune.tune.persist as pe, hkgpu_tune.tune.state as st
st.atomic_write, pe.atomic_write = wrap(st.atomic_write), wrap(pe.atomic_write)
for name in ("replace",):   # (os.replace: what writes files without atomic_write)
    setattr(os, name, wrap(getattr(os, name)))
atexit.register(lambda: print(f"write points: {seen[0]}", file=sys.stderr))
for name in ("mkdir", "symlink", "unlink", "rmdir"):
    setattr(os, name, wrap(getattr(os, name)))
from hkgpu_tune.cli import main
sys.argv[0] = "hkgpu-tune"
main()
"""


def run_killed_at(net, n, *args):
    """rc, and the number of write points the run passed (when it was not killed)."""
    env = {**os.environ, "HK_KILL_AT": str(n)}
    p = subprocess.run(["ip", "netns", "exec", net.A, sys.executable, "-c", DRIVER, *args], env=env,
                       capture_output=True, text=True, timeout=60)
    seen = [int(x.split()[-1]) for x in p.stderr.splitlines() if x.startswith("write points: ")]
    return p.returncode, (seen[0] if seen else 0), p.stderr


@pytest.mark.slow
def test_kill_9_at_write_points_of_apply_persist_and_of_its_rollback(net, tmp_path):
    """Every run kills at one write point drawn from all of them (8 per verb)."""
    p, st = kill_profile(tmp_path, net, count=1), tmp_path / "st"
    root = make_root(tmp_path, net)
    start, start_tree = settings(net), tree(root)
    args = ("apply", "--persist", "--root", str(root), "--profile", p, "--state-dir", str(st))
    rc, total, err = run_killed_at(net, 0, *args)
    assert rc == 0 and total >= 10, err
    rc, rtotal, err = run_killed_at(net, 0, "rollback", "--state-dir", str(st))
    assert rc == 0 and rtotal >= 10 and settings(net) == start and tree(root) == start_tree, err
    r, killed = rng(), 0
    # (a first run also makes the state directory: a few more points than later runs)
    for n in sorted(r.sample(range(1, total + 1), 8)):
        rc, _, err = run_killed_at(net, n, *args)
        assert rc in (0, -signal.SIGKILL), err
        killed += rc == -signal.SIGKILL
        check_back(net, st, start, root, start_tree, what=f"apply --persist killed at write point {n} of {total}")
    for n in sorted(r.sample(range(1, rtotal + 1), 8)):
        assert run(net, *args).returncode == 0
        rc, _, err = run_killed_at(net, n, "rollback", "--state-dir", str(st))
        assert rc in (0, -signal.SIGKILL), err
        killed += rc == -signal.SIGKILL
        check_back(net, st, start, root, start_tree, what=f"rollback killed at write point {n} of {rtotal}")
    print(f"write points: {killed} of 16 runs killed")
    assert killed >= 12, f"only {killed} of 16 runs were killed"
