"""One journal and one lock per host, whatever state directory a run names: a second state
directory never saves the first one's write as its "original", and two runs with different state
directories never work at once. The host is read with `ip`, never with hkgpu-tune's verify."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from .conftest import sh, write_profile
from .test_kills import argv, kill_profile, run, settings

pytestmark = pytest.mark.root


def mtu_profile(tmp_path, net, mtu, name):
    sh("ip", "-n", net.B, "link", "set", net.b, "mtu", "9000")
    return write_profile(tmp_path, f"""\
network:
  interfaces:
    - match: {{name: {net.a}}}
      mtu: {mtu}
  fabric_peers: [{net.ipb}]
  probe: {{count: 1, timeout_s: 1}}
""", name=name)


def registry(host_dir) -> list:
    f = host_dir / "journals.json"
    return json.loads(f.read_text())["journals"] if f.exists() else []


@pytest.mark.slow
def test_a_setting_in_one_journal_is_never_saved_as_an_original_in_another(net, tmp_path, host_dir):
    a, b = tmp_path / "a", tmp_path / "b"
    p9000, p8000 = mtu_profile(tmp_path, net, 9000, "9000.yaml"), mtu_profile(tmp_path, net, 8000, "8000.yaml")
    assert net.link()["mtu"] == 1500
    r = run(net, "apply", "--profile", p9000, "--state-dir", str(a))
    assert r.returncode == 0, r.stdout + r.stderr
    assert net.link()["mtu"] == 9000
    assert registry(host_dir) == [str(a)]

    r = run(net, "apply", "--profile", p8000, "--state-dir", str(b))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert (f"link {net.a} mtu is recorded in the journal at {a} (original 1500): "
            f"apply with --state-dir {a} or roll it back there first") in lines[0]
    assert net.link()["mtu"] == 9000                    # nothing changed
    assert not (b / "state.json").exists() and registry(host_dir) == [str(a)]

    r = run(net, "rollback", "--state-dir", str(b))     # b holds nothing: touches nothing
    assert r.returncode == 0 and net.link()["mtu"] == 9000, r.stdout + r.stderr
    r = run(net, "rollback", "--state-dir", str(a))
    assert r.returncode == 0, r.stdout + r.stderr
    assert net.link()["mtu"] == 1500                    # the true original
    assert registry(host_dir) == []

    # a's journal is empty now: b may take the setting, and its original is the true one too
    r = run(net, "apply", "--profile", p8000, "--state-dir", str(b))
    assert r.returncode == 0 and net.link()["mtu"] == 8000, r.stdout + r.stderr
    assert registry(host_dir) == [str(b)]
    r = run(net, "rollback", "--state-dir", str(b))
    assert r.returncode == 0 and net.link()["mtu"] == 1500, r.stdout + r.stderr
    assert registry(host_dir) == []


def test_the_same_setting_in_another_namespace_is_another_setting(net, tmp_path, host_dir):
    """Identity covers the namespace: a link of the same name and MAC in B is not A's, so a second
    journal may hold it."""
    dev, mac = "hktwin0", "02:00:c6:13:16:01"
    net.veth(dev, dev, 22)
    for ns in (net.A, net.B):
        sh("ip", "-n", ns, "link", "set", dev, "address", mac)
    a, b = tmp_path / "a", tmp_path / "b"
    for d, ns, mtu in ((a, net.A, 1400), (b, net.B, 1300)):
        p = write_profile(tmp_path, f"network:\n  interfaces:\n    - match: {{name: {dev}}}\n      mtu: {mtu}\n",
                          f"{mtu}.yaml")
        r = net.hk("apply", "--profile", p, state=d, ns=ns)
        assert r.returncode == 0, r.stdout + r.stderr
    assert net.link(dev, net.A)["mtu"] == 1400 and net.link(dev, net.B)["mtu"] == 1300
    assert sorted(registry(host_dir)) == sorted([str(a), str(b)])
    for d, ns in ((a, net.A), (b, net.B)):
        r = net.hk("rollback", state=d, ns=ns)
        assert r.returncode == 0, r.stdout + r.stderr
    assert net.link(dev, net.A)["mtu"] == 1500 and net.link(dev, net.B)["mtu"] == 1500
    assert registry(host_dir) == []


def test_a_run_with_another_state_dir_fails_fast_on_the_host_lock(net, tmp_path):
    # the first apply is held still with the lock (SIGSTOP, as in test_concurrent)
    p, first_dir, other = kill_profile(tmp_path, net, count=20), tmp_path / "first", tmp_path / "other"
    start = settings(net)
    first = subprocess.Popen(argv(net, "apply", "--profile", p, "--state-dir", str(first_dir)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 60
        while not (first_dir / "state.json").exists():
            assert first.poll() is None and time.monotonic() < end, first.communicate()
            time.sleep(0.02)
        os.kill(first.pid, signal.SIGSTOP)   # held still with the lock: however slow the machine,
        try:                                  # the second and the rollback run while it holds it
            t = time.monotonic()
            second = run(net, "apply", "--profile", p, "--state-dir", str(other), "--lock-wait", "0")
            took = time.monotonic() - t
            roll = run(net, "rollback", "--state-dir", str(first_dir), "--lock-wait", "0")   # its own dir's rollback waits too
            assert first.poll() is None, "the first apply ended before the second ran: nothing was tested"
        finally:
            os.kill(first.pid, signal.SIGCONT)
    finally:
        out, err = first.communicate(timeout=60)
    want = f"holds the lock (pid {first.pid}) with the state directory {first_dir}"
    assert second.returncode == 1 and want in second.stderr and "Traceback" not in second.stderr, second.stderr
    # not waited for the lock: it ended while the first still held it (asserted above)
    assert len(second.stderr.strip().splitlines()) == 1, (took, second.stderr)
    assert not other.exists()                       # refused before anything, its directory included
    assert roll.returncode == 1 and want in roll.stderr, roll.stderr
    assert first.returncode == 0, out + err
    r = run(net, "rollback", "--state-dir", str(first_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    assert settings(net) == start


HOLD = "import sys, time; from hkgpu_tune.tune.state import State\n" \
       "with State(sys.argv[1]).lock():\n    print('held', flush=True); time.sleep(60)\n"


def test_health_and_persist_take_the_host_lock_too(net, tmp_path):
    held, mine = tmp_path / "held", tmp_path / "mine"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(held)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        p = mtu_profile(tmp_path, net, 9000, "p.yaml")
        for args in (("health", "--profile", p, "--state-dir", str(mine)),
                     ("apply", "--persist", "--profile", p, "--state-dir", str(mine), "--lock-wait", "0")):
            r = run(net, *args)
            assert r.returncode == 1 and f"holds the lock (pid {holder.pid}) with the state directory {held}" \
                in r.stderr, (args, r.stdout, r.stderr)
        assert net.link()["mtu"] == 1500
    finally:
        holder.kill()
        holder.wait()


DEFAULT_RUN = r"""
set -u
mount -t tmpfs -o mode=0755 hkgpu-test /var/lib          # this mount namespace only: the real one is untouched
hk() { ip netns exec "$NS" "$PY" -m hkgpu_tune "$@"; }
hk apply --profile "$P9000" --state-dir "$A" >/dev/null 2>&1; echo "first=$?"
hk apply --profile "$P8000" --state-dir "$B" >/dev/null 2>"$ERR"; echo "second=$?"
echo "mtu=$(ip -n "$NS" -o link show "$DEV" | sed -n 's/.* mtu \([0-9]*\) .*/\1/p')"
echo "registry=$(cat /var/lib/hkgpu-tune/journals.json | tr -d '\n ')"
echo "lock=$(stat -c %a:%u /var/lib/hkgpu-tune/host.lock)"
hk rollback --state-dir "$A" >/dev/null 2>&1; echo "rollback=$?"
echo "mtu_after=$(ip -n "$NS" -o link show "$DEV" | sed -n 's/.* mtu \([0-9]*\) .*/\1/p')"
"""


def test_the_product_default_is_one_place_for_the_whole_host(net, tmp_path):
    """Without HKGPU_TUNE_HOST_DIR (as installed): the lock and the registry are /var/lib/hkgpu-tune's
    whatever --state-dir names. Run in a mount namespace of its own with a tmpfs over /var/lib."""
    a, b, err = tmp_path / "a", tmp_path / "b", tmp_path / "err"
    env = {k: v for k, v in os.environ.items() if k != "HKGPU_TUNE_HOST_DIR"}
    env.update(NS=net.A, PY=sys.executable, DEV=net.a, A=str(a), B=str(b), ERR=str(err),
               P9000=mtu_profile(tmp_path, net, 9000, "9000.yaml"), P8000=mtu_profile(tmp_path, net, 8000, "8000.yaml"))
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", DEFAULT_RUN], env=env,
                       capture_output=True, text=True, timeout=120)
    got = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
    assert got.get("first") == "0" and got.get("second") == "1", p.stdout + p.stderr
    assert f"is recorded in the journal at {a} (original 1500)" in err.read_text()
    assert got["mtu"] == "9000" and json.loads(got["registry"])["journals"] == [str(a)]
    assert got["lock"] == "600:0"
    assert got["rollback"] == "0" and got["mtu_after"] == "1500", p.stdout + p.stderr
    assert not os.path.exists("/var/lib/hkgpu-tune/journals.json") or \
        str(a) not in open("/var/lib/hkgpu-tune/journals.json").read()   # the real host's was never written
