"""kill -9 at random points and at every write point of converge (the one entry point of the Ansible
module): converge apply, with and without persist, converge rollback, and a converge that fails
and rolls itself back. After each kill a rollback (converge state=rolled_back), or a re-run of the
converge, brings the namespace's settings and the files back exactly; the node profile is the old
text or the new one, never a partial one, never the sections of a failed run, and no temporary
file of it is left. The seed is printed (HKGPU_KILL_SEED)."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from .conftest import sh
from .test_kills import FINISHED, make_root, rng, settings, tree

pytestmark = pytest.mark.root
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE = os.path.join(ROOT, "collections", "ansible_collections", "hkgpu", "tune", "plugins", "modules", "hkgpu.py")
NODE = "etc/hkgpu-tune/node.yaml"
OLD = "name: node\ndescription: the node before this run\n"


def applied_settings(net) -> dict:
    """settings(), but a child qdisc's handle, which the kernel numbers anew at each apply, left out
    (and the children in any order)."""
    out = settings(net)
    out["qdisc"] = sorted(re.sub(r"(qdisc \S+) [0-9a-f]+: parent", r"\1 parent", out["qdisc"]).splitlines())
    return out


def sections(net, count=1):
    return {"network": {"interfaces": [{"match": {"name": net.a}, "mtu": 9000,
                                        "offloads": {"gro": True, "tso": False}, "qdisc": "pfifo_fast"}],
                        "fabric_peers": [net.ipb], "probe": {"count": count, "timeout_s": 1}},
            "sysctl": {"net.ipv4.tcp_mtu_probing": 1, "net.ipv4.tcp_ecn": 1}}


# converge() in a process of its own, as the module runs it; HK_KILL_AT=n: kill -9 at the n-th write
# point (before and after each file write, rename, mkdir, link, unlink); HK_FAIL=qdisc: the qdisc
# write fails (ApplyError), so the run rolls itself back
DRIVER = r"""
import atexit, json, os, signal, sys
at, seen = int(os.environ.get("HK_KILL_AT") or 0), [0]
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
import hkgpu_tune.fleet.converge as cv, hkgpu_tune.tune.persist as pe, hkgpu_tune.tune.state as st
st.atomic_write, pe.atomic_write = wrap(st.atomic_write), wrap(pe.atomic_write)
def node_write(f):
    g = wrap(f)
    def h(*a, **k):
        first = seen[0] + 1
        r = g(*a, **k)
        print(f"node profile points: {first} {seen[0]}", file=sys.stderr)
        return r
    return h
cv.atomic_write = node_write(cv.atomic_write)
for name in ("replace", "mkdir", "symlink", "unlink", "rmdir"):
    setattr(os, name, wrap(getattr(os, name)))
atexit.register(lambda: print(f"write points: {seen[0]}", file=sys.stderr))
if os.environ.get("HK_FAIL") == "qdisc":
    from hkgpu_tune.core.errors import ApplyError
    from hkgpu_tune.subsystems import qdisc
    def refuse(self, target, key, value, data):
        raise ApplyError(f"{target}: qdisc {key}: refused (test)")
    qdisc.Plugin.apply = lambda self, c: refuse(self, c.target, c.key, c.desired, c.data)
args = json.loads(sys.argv[1])
try:
    out, rc = cv.converge(args.pop("sections"), False, **args), 0
except cv.ConvergeFailed as e:
    out, rc = {"failed": True, "msg": str(e), **e.result}, 1
except cv.HkError as e:
    out, rc = {"failed": True, "msg": str(e)}, 1
print(json.dumps({k: out.get(k) for k in ("failed", "msg", "changed", "rolled_back")}))
sys.exit(rc)
"""


class Node:
    """One simulated node: namespace A, a root with /etc (node profile inside), state and host dirs."""

    def __init__(self, net, tmp_path, persist=False, count=1):
        sh("ip", "-n", net.B, "link", "set", net.b, "mtu", "9000")
        self.net, self.persist = net, persist
        self.root = make_root(tmp_path, net)
        self.node = self.root / NODE
        self.node.write_text(OLD)
        self.st, self.host = tmp_path / "st", tmp_path / "host"
        self.sections = sections(net, count)
        self.start, self.start_tree = settings(net), tree(self.root)
        self.new = None       # the node profile's text after a converge that went through
        self.applied = self.applied_tree = None

    def args(self, state="applied"):
        a = {"sections": self.sections if state == "applied" else None, "state": state,
             "profile_path": str(self.node), "state_dir": str(self.st), "host_dir": str(self.host)}
        if self.persist:
            a.update(persist=True, root=str(self.root))
        return a

    def argv(self, state="applied"):
        return ["ip", "netns", "exec", self.net.A, sys.executable, "-c", DRIVER, json.dumps(self.args(state))]

    def run(self, state="applied", at=0, fail=""):
        """rc, the number of write points it passed, stderr."""
        env = {**os.environ, "PYTHONPATH": ROOT, "HK_KILL_AT": str(at), "HK_FAIL": fail}
        p = subprocess.run(self.argv(state), env=env, capture_output=True, text=True, timeout=60)
        seen = [int(x.split()[-1]) for x in p.stderr.splitlines() if x.startswith("write points: ")]
        return p.returncode, (seen[0] if seen else 0), p.stdout + p.stderr

    def files(self):
        """The tree without the node profile, and the node profile's text (None: missing)."""
        t = tree(self.root)
        t.pop(NODE, None)
        return t, (self.node.read_text() if self.node.exists() else None)

    def baseline(self):
        """A whole converge and a whole rollback: what the host looks like after each."""
        rc, total, out = self.run()
        assert rc == 0, out
        self.applied, self.new = applied_settings(self.net), self.node.read_text()
        self.applied_tree = self.files()[0]
        assert self.applied != self.start and self.new != OLD and "tcp_mtu_probing" in self.new
        rc, rtotal, out = self.run("rolled_back")
        assert rc == 0, out
        self.check_back("whole converge, whole rollback", rolled=True)
        # the write points of a run like the ones the tests kill (the first made the directories)
        rc, total, out = self.run()
        assert rc == 0 and applied_settings(self.net) == self.applied and self.files() == (self.applied_tree, self.new), out
        rc, rtotal, out = self.run("rolled_back")
        assert rc == 0, out
        self.check_back("second converge, second rollback", rolled=True)
        return total, rtotal

    def check_back(self, what, rolled=False, failed=False):
        """After a kill: roll back (unless done) and compare with the start, read with ip/ethtool/tc/sysctl."""
        if not rolled:
            rc, _, out = self.run("rolled_back")
            assert rc == 0, f"{what}: {out}"
        assert settings(self.net) == self.start, what
        assert not (self.st / "state.json").exists(), what
        rest, text = self.files()
        start_rest = {k: v for k, v in self.start_tree.items() if k != NODE}
        assert rest == start_rest, f"{what}: files differ: {set(rest.items()) ^ set(start_rest.items())}"
        # the old or the new text; after a failed run only the old one
        assert text == OLD or (text == self.new and not failed), f"{what}: node profile:\n{text}"
        self.node.write_text(OLD)   # the next run starts from the same node profile

    def check_rerun(self, what):
        """After a kill: the converge run again ends where a whole run ends."""
        rc, _, out = self.run()
        assert rc == 0, f"{what}: re-run: {out}"
        assert applied_settings(self.net) == self.applied, what
        rest, text = self.files()
        assert text == self.new, what
        assert rest == self.applied_tree, f"{what}: files differ: {set(rest.items()) ^ set(self.applied_tree.items())}"


def run_killed(node, delay, state="applied", module=False) -> bool:
    """Start converge (the driver, or the Ansible module file), kill -9 it after `delay` s;
    True when it was still running."""
    t = time.monotonic()
    argv = node.argv(state)
    if module:
        argv = ["ip", "netns", "exec", node.net.A, sys.executable, MODULE, node.module_args(state)]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    try:
        p.wait(delay)
        FINISHED["s"] = time.monotonic() - t
        return False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return True


def timed(node, state="applied") -> float:
    t = time.monotonic()
    rc, _, out = node.run(state)
    assert rc == 0, out
    return time.monotonic() - t


@pytest.mark.slow
def test_kill_9_at_random_points_of_the_module_converge_then_rollback(net, tmp_path):
    """The Ansible module's own process (its file, arguments in a JSON file), as a play runs it."""
    pytest.importorskip("ansible", reason="the module needs ansible-core")
    node = Node(net, tmp_path, count=2)

    def module_args(state):
        a = node.args(state)
        if a["sections"] is None:
            del a["sections"]
        else:
            a["profile"] = a.pop("sections")
        f = tmp_path / f"args-{state}.json"
        f.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": a}))
        return str(f)
    node.module_args = module_args
    node.baseline()
    t_apply = timed(node)
    node.check_back("whole converge")
    r, killed, tries = rng(), 0, 0
    while (killed < 3 or tries < 4) and tries < 10:   # bounded; a late kill tests nothing, so go on
        tries += 1
        delay = r.uniform(0.2, t_apply)
        if not run_killed(node, delay, module=True):
            t_apply = max(0.25, min(t_apply, FINISHED["s"]))
        else:
            killed += 1
        node.check_back(f"module converge killed after {delay:.2f}s")
    print(f"module converge {t_apply:.2f}s, {killed} of {tries} killed")
    assert killed >= 2, "the converge finished before most kills: nothing was tested"


@pytest.mark.slow
def test_kill_9_at_random_points_of_converge_persist_then_rerun_and_rollback(net, tmp_path):
    node = Node(net, tmp_path, persist=True)
    node.baseline()
    t_apply = timed(node)
    node.check_back("whole converge --persist")
    r, killed, tries = rng(), 0, 0
    while (killed < 2 or tries < 5) and tries < 10:
        tries += 1
        delay = r.uniform(0.3 * t_apply, t_apply)   # the files come at the end
        if not run_killed(node, delay):
            t_apply = min(t_apply, FINISHED["s"])
        else:
            killed += 1
        what = f"converge persist killed after {delay:.2f}s"
        if tries % 2:
            node.check_rerun(what)
        node.check_back(what)
    print(f"converge persist {t_apply:.2f}s, {killed} of {tries} killed")
    assert killed >= 1, "the converge finished before every kill: nothing was tested"


@pytest.mark.slow
def test_kill_9_at_random_points_of_converge_rollback_then_rollback_again(net, tmp_path):
    node = Node(net, tmp_path, persist=True)
    node.baseline()
    r, killed, tries, t_rb = rng(), 0, 0, None
    while killed < 2 and tries < 10:
        rc, _, out = node.run()
        assert rc == 0, out
        if t_rb is None:
            t_rb = timed(node, "rolled_back")
            node.check_back("whole rollback", rolled=True)
            continue
        tries += 1
        delay = r.uniform(0.3, 0.95) * t_rb
        killed += run_killed(node, delay, "rolled_back")
        node.check_back(f"converge rollback killed after {delay:.2f}s")
    print(f"converge rollback {t_rb:.2f}s, {killed} of {tries} killed")
    assert killed >= 1, "the rollback finished before every kill: nothing was tested"


def kill_at_every_point(node, total, state="applied", fail="", then=("rollback",)):
    killed = 0
    for n in range(1, total + 1):
        if state == "rolled_back":
            rc, _, out = node.run()
            assert rc == 0, out
        rc, _, out = node.run(state, at=n, fail=fail)
        assert rc in (0, 1, -signal.SIGKILL) and "Traceback" not in out, out
        killed += rc == -signal.SIGKILL
        what = f"converge {state}{' (failing)' if fail else ''} killed at write point {n} of {total}"
        if "rerun" in then:
            node.check_rerun(what)
        node.check_back(what, failed=bool(fail))
    return killed


@pytest.mark.slow
def test_kill_9_at_every_write_point_of_converge_persist_then_rerun_then_rollback(net, tmp_path):
    """Each write point of a converge with persist in turn (the node profile, the state file, the
    persisted files, their directories, the boot unit's link): a re-run ends where a whole run
    ends, and the rollback after it where the host started."""
    node = Node(net, tmp_path, persist=True)
    total, _ = node.baseline()
    assert total >= 12
    killed = kill_at_every_point(node, total, then=("rerun", "rollback"))
    print(f"converge persist: {killed} of {total} write points killed")
    assert killed >= total - 2


@pytest.mark.slow
def test_kill_9_at_every_write_point_of_converge_without_persist_then_rollback(net, tmp_path):
    node = Node(net, tmp_path)
    total, _ = node.baseline()
    killed = kill_at_every_point(node, total)
    print(f"converge: {killed} of {total} write points killed")
    assert killed >= total - 2


@pytest.mark.slow
def test_kill_9_at_every_write_point_of_converge_rollback_then_rollback_again(net, tmp_path):
    node = Node(net, tmp_path, persist=True)
    _, rtotal = node.baseline()
    assert rtotal >= 8
    killed = kill_at_every_point(node, rtotal, state="rolled_back")
    print(f"converge rollback: {killed} of {rtotal} write points killed")
    assert killed >= rtotal - 2


@pytest.mark.slow
def test_kill_9_at_every_write_point_of_a_failing_converge_leaves_the_old_node_profile(net, tmp_path):
    """The qdisc write fails, so the run undoes the others: killed anywhere in it (its undo
    included), the node profile after the rollback is the old text, never the failed sections."""
    node = Node(net, tmp_path, persist=True)
    node.baseline()
    rc, total, out = node.run(fail="qdisc")
    assert rc == 1 and "(rolled back)" in out, out
    node.check_back("whole failing converge", failed=True)
    killed = kill_at_every_point(node, total, fail="qdisc")
    print(f"failing converge: {killed} of {total} write points killed")
    assert killed >= total - 2


@pytest.mark.slow
def test_kill_9_while_the_node_profile_is_written_then_rerun_or_rollback(net, tmp_path):
    """The node profile's write interrupted at each of its points (before it, with its temporary
    file made but not renamed, after the rename, after it), then a re-run of the converge, or a
    rollback: no temporary file is left, the text is the old or the new one."""
    node = Node(net, tmp_path)
    node.baseline()
    rc, _, out = node.run()
    assert rc == 0, out
    first, last = next(map(int, x.split()[-2:]) for x in out.splitlines() if x.startswith("node profile points: "))
    node.check_back("whole converge")
    temps_seen = 0
    for n in range(first, last + 1):
        for then in ("rerun", "rollback"):
            rc, _, out = node.run(at=n)
            assert rc == -signal.SIGKILL, out
            temps_seen += any(p.startswith(".node.yaml.") for p in os.listdir(node.node.parent))
            what = f"killed at node profile write point {n} ({first}-{last}), then {then}"
            if then == "rerun":
                node.check_rerun(what)
            node.check_back(what)
    print(f"node profile write: {2 * (last - first + 1)} kills, {temps_seen} left a temporary file")
    assert temps_seen >= 2, "no kill landed while the node profile's temporary file existed"
