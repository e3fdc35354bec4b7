"""apply and rollback wait a bounded time for the host lock (--lock-wait, default 30 s): a short
holder (another run, a health check) delays them, never fails them; --lock-wait 0 refuses at once."""
import os
import subprocess
import sys
import time

import pytest

HOLD = "import sys, time; from hkgpu_tune.tune.state import State\n" \
       "with State(sys.argv[1]).lock():\n    print('held', flush=True); time.sleep(float(sys.argv[2]))\n"


ENV = {}   # a host lock of the test's own (HKGPU_TUNE_HOST_DIR): other runs on this machine never hold it


def hk(*args):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **ENV})


def hold(st, seconds):
    return subprocess.Popen([sys.executable, "-c", HOLD, str(st), str(seconds)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **ENV})


@pytest.mark.slow
def test_rollback_waits_for_a_short_holder_and_refuses_past_its_wait(tmp_path):
    st = tmp_path / "st"
    ENV["HKGPU_TUNE_HOST_DIR"] = str(tmp_path / "host")
    holder = hold(st, 2)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = hk("rollback", "--state-dir", str(st), "--lock-wait", "0")
        assert r.returncode == 1 and f"holds the lock (pid {holder.pid})" in r.stderr, r.stderr
        t = time.monotonic()
        r = hk("rollback", "--state-dir", str(st))            # the default wait outlasts the holder
        assert r.returncode == 0 and "nothing to roll back" in r.stdout, r.stdout + r.stderr
        assert holder.poll() is not None and time.monotonic() - t < 30
    finally:
        holder.kill()
        holder.wait()
    holder = hold(st, 30)
    try:
        assert holder.stdout.readline().strip() == "held"
        t = time.monotonic()
        r = hk("rollback", "--state-dir", str(st), "--lock-wait", "1.5")
        took = time.monotonic() - t
        assert r.returncode == 1 and "holds the lock" in r.stderr and 1.5 <= took < 10, (took, r.stderr)
    finally:
        holder.kill()
        holder.wait()
