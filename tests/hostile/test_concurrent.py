"""Two applies (or an apply and a rollback) at once: the second fails fast on the state
directory's lock, naming the holder's pid; nothing it would have written is written, and the
first run's originals stay whole."""
import os
import signal
import subprocess
import sys
import time

import pytest

from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.errors import LockError
from hkgpu_tune.core.profile import parse_profile_text

from ..unit.test_engine import PROFILE, host
from .test_kills import argv, kill_profile, run, settings

HOLD = "import sys, time; from hkgpu_tune.tune.state import State\n" \
       "with State(sys.argv[1]).lock():\n    print('held', flush=True); time.sleep(60)\n"


def test_a_held_lock_makes_apply_and_rollback_fail_fast(tmp_path):
    d = tmp_path / "st"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(d)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        b = host()
        for verb in ("apply", "rollback"):
            (d / "state.json").write_text('{"format": 2, "entries": []}') if verb == "rollback" else None
            eng = Engine(parse_profile_text(PROFILE, "t.yaml"), state_dir=str(d), backends=b)
            t = time.monotonic()
            with pytest.raises(LockError, match=rf"holds the lock \(pid {holder.pid}\)"):
                getattr(eng, verb)()
            assert time.monotonic() - t < 1
        assert b.sysctl.writes == [] and b.net.links()[0]["mtu"] == 1500
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.root
def test_two_applies_at_once_one_fails_fast_and_no_original_is_lost(net, tmp_path):
    # the first is stopped (SIGSTOP) once it holds the lock and saved its originals: the second apply
    # and the rollback run inside it on a machine of any load (a 5 s probe window was too short at a
    # load of 20 on 2 CPUs)
    p, st = kill_profile(tmp_path, net, count=20), tmp_path / "st"
    start = settings(net)
    first = subprocess.Popen(argv(net, "apply", "--profile", p, "--state-dir", str(st)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 60
        while not (st / "state.json").exists():   # the first holds the lock and has saved originals
            assert first.poll() is None and time.monotonic() < end, first.communicate()
            time.sleep(0.02)
        os.kill(first.pid, signal.SIGSTOP)   # held still with the lock: however slow the machine,
        try:                                  # the second and the rollback run while it holds it
            t = time.monotonic()
            second = run(net, "apply", "--profile", p, "--state-dir", str(st), "--lock-wait", "0")
            took = time.monotonic() - t
            roll = run(net, "rollback", "--state-dir", str(st), "--lock-wait", "0")
            assert first.poll() is None, "the first apply ended before the second ran: nothing was tested"
        finally:
            os.kill(first.pid, signal.SIGCONT)
    finally:
        out, err = first.communicate(timeout=60)
    assert second.returncode == 1 and f"holds the lock (pid {first.pid})" in second.stderr, second.stderr
    assert roll.returncode == 1 and "holds the lock" in roll.stderr, roll.stderr
    # it did not wait for the lock: it ended while the first still held it (asserted above), whatever
    # the machine's speed (`took` only for the message)
    assert "Traceback" not in second.stderr, (took, second.stderr)
    assert first.returncode == 0, out + err
    assert settings(net) != start
    r = run(net, "rollback", "--state-dir", str(st))
    assert r.returncode == 0, r.stdout + r.stderr
    assert settings(net) == start
