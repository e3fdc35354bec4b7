"""triton.connections on the real CPU tritonserver: the gRPC keepalive settings the profile writes are
read back from the running server (its command line in /proc, read by hand) and shown to be in force
by a client that holds one gRPC connection through an idle period while pinging it. Where the profile
lets a client ping every 0.5 s, the connection lives through the idle period and the next inference
uses it; where the profile allows one ping in 5 s and two strikes, the server closes the same client's
connection (too many pings), so the settings are the server's, not defaults."""
from __future__ import annotations

import os
import time

import pytest

from hkgpu_tune.core.profile import load_profile
from hkgpu_tune.serve.running import launch

from .conftest import dump, free_ports, needs_server, profile_dict
from .test_reload_under_load import cli, server_pids

pytestmark = [needs_server, pytest.mark.slow]

IDLE_S = 4.0


def start(tmp_path, name: str, **conn):
    root = tmp_path / name
    root.mkdir()
    ports = free_ports(3)
    doc = profile_dict(root, ports)
    doc["triton"]["connections"] = conn
    path = root / "p.yaml"
    path.write_text(dump(doc))
    p = cli("triton", "start", "-p", str(path), "--no-gate", timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return load_profile(str(path)).section("triton")


def cmdline(port: int) -> list[str]:
    (pid,) = server_pids(port)
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


def my_connections(port: int) -> set[int]:
    """Local ports of this process's established TCP connections to `port` (from /proc/net/tcp and the
    process's socket inodes, not from any client library)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                cols = line.split()
                local, remote, state, inode = cols[1], cols[2], cols[3], cols[9]
                if state == "01" and inode in inodes and int(remote.rsplit(":", 1)[1], 16) == port:
                    out.add(int(local.rsplit(":", 1)[1], 16))
    return out


def hold_through_idle(t) -> tuple[set, set, str]:
    """One tritonclient gRPC client, keepalive pings every 0.5 s even without calls: an inference,
    IDLE_S of nothing, another inference. Returns the connections before and after, and the error."""
    import numpy as np
    import tritonclient.grpc as tg
    c = tg.InferenceServerClient(f"127.0.0.1:{t.grpc.port}", keepalive_options=tg.KeepAliveOptions(
        keepalive_time_ms=500, keepalive_timeout_ms=2000, keepalive_permit_without_calls=True,
        http2_max_pings_without_data=0))
    x = tg.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    try:
        assert (c.infer("doubler", [x]).as_numpy("OUTPUT0") == 2).all()
        before = my_connections(t.grpc.port)
        time.sleep(IDLE_S)
        err = ""
        try:
            c.infer("doubler", [x])
        except Exception as e:   # the server closed the connection under the call
            err = str(e)
        if err:   # the channel reconnects: the next call answers on a new connection
            c.infer("doubler", [x])
        after = my_connections(t.grpc.port)
    finally:
        c.close()
    return before, after, err


def test_keepalive_settings_are_the_servers(tmp_path):
    kind = start(tmp_path, "kind", grpc_keepalive_time_ms=2000, grpc_keepalive_timeout_ms=20000,
                 grpc_keepalive_permit_without_calls=True, grpc_http2_max_pings_without_data=0,
                 grpc_http2_min_recv_ping_interval_without_data_ms=200, grpc_http2_max_ping_strikes=2)
    strict = start(tmp_path, "strict", grpc_keepalive_time_ms=60000, grpc_keepalive_timeout_ms=20000,
                   grpc_keepalive_permit_without_calls=True, grpc_http2_max_pings_without_data=0,
                   grpc_http2_min_recv_ping_interval_without_data_ms=5000, grpc_http2_max_ping_strikes=2)
    try:
        args = cmdline(kind.http.port)
        for opt in ("--grpc-keepalive-time=2000", "--grpc-keepalive-timeout=20000",
                    "--grpc-keepalive-permit-without-calls=1", "--grpc-http2-max-pings-without-data=0",
                    "--grpc-http2-min-recv-ping-interval-without-data=200", "--grpc-http2-max-ping-strikes=2"):
            assert opt in args, (opt, args)
        assert "--grpc-http2-min-recv-ping-interval-without-data=5000" in cmdline(strict.http.port)

        before, after, err = hold_through_idle(kind)
        assert len(before) == 1 and after == before and not err, (before, after, err)

        before, after, err = hold_through_idle(strict)
        assert len(before) == 1 and after and not (after & before), (before, after, err)
    finally:
        launch.stop(kind)
        launch.stop(strict)
