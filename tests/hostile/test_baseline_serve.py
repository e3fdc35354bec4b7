"""`baseline serve` starts iperf3 for a bounded time: it ends with the tool whatever ends the tool
(SIGHUP, SIGINT, SIGTERM, or SIGKILL, which no handler sees), never left listening."""
import shutil
import signal
import subprocess
import sys
import time

import pytest

from .conftest import sh

pytestmark = pytest.mark.skipif(not shutil.which("iperf3"), reason="needs iperf3 (Debian's iperf3)")


def listening(net, port):
    return f":{port} " in sh("ss", "-ltnH", ns=net.A).stdout


def start(net, port):
    p = subprocess.Popen(["ip", "netns", "exec", net.A, sys.executable, "-m", "hkgpu_tune", "baseline", "serve",
                          "--port", str(port), "--seconds", "300", "--bind", net.ipa],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(200):
        if listening(net, port):
            got = [x.split()[3] for x in sh("ss", "-ltnH", ns=net.A).stdout.splitlines() if f":{port} " in x + " "]
            assert got == [f"{net.ipa}:{port}"], got     # the address named, never every address
            return p
        time.sleep(0.05)
    p.kill()
    raise AssertionError(f"serve did not listen: {p.stderr.read().decode()}")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
def test_iperf3_ends_with_the_tool(net, sig):
    port = 5330 + int(sig)
    p = start(net, port)
    p.send_signal(sig)
    p.wait(timeout=10)
    for _ in range(100):
        if not listening(net, port):
            break
        time.sleep(0.05)
    assert not listening(net, port), f"iperf3 still listens on {port} after {sig.name} to the tool"
    assert "Traceback" not in p.stderr.read().decode()
