"""Servers the toolkit starts itself (the sweep's, the tests', the benches') get loopback ports outside
the kernel's ephemeral range (a port handed out by bind(0) can be taken by an outgoing connection
before tritonserver binds it), free now; the sweep's server a short exit timeout (a config that failed
to load keeps tritonserver waiting its whole exit timeout)."""
import socket

from hkgpu_tune.serve.running import client
from hkgpu_tune.serve.measuring import sweep


def test_ports_are_free_and_below_the_ephemeral_range():
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    for _ in range(20):
        ports = client.free_ports(3)
        assert len(set(ports)) == 3 and all(1024 <= p < low for p in ports), (ports, low)
        for p in ports:   # nothing listens there: a connection is refused
            s = socket.socket()
            try:
                assert s.connect_ex(("127.0.0.1", p)) != 0, p
            finally:
                s.close()


def test_a_range_that_starts_at_1024_gives_ports_above_it(monkeypatch):
    """ip_local_port_range "1024 40000" (a common tuning) leaves nothing below: ports above 40000."""
    import builtins
    real = builtins.open

    def fake_open(path, *a, **k):
        if path == "/proc/sys/net/ipv4/ip_local_port_range":
            import io
            return io.StringIO("1024\t40000\n")
        return real(path, *a, **k)
    monkeypatch.setattr(builtins, "open", fake_open)
    ports = client.free_ports(3)
    assert all(40000 < p < 52001 for p in ports), ports


def test_a_port_in_use_is_not_handed_out(monkeypatch):
    """A listener already on the first pick (a port below the range): the sweep takes the next."""
    import random
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    taken = socket.socket()
    for busy in range(low - 1, low - 200, -1):
        try:
            taken.bind(("127.0.0.1", busy))
            break
        except OSError:
            continue
    taken.listen(1)
    picks = iter([busy, busy, busy - 300])

    class Pick:
        def randrange(self, a, b):
            return next(picks)
    monkeypatch.setattr(random, "Random", Pick)
    try:
        assert client.free_ports(1) == [busy - 300]
    finally:
        taken.close()


def test_the_sweeps_server_has_a_short_exit_timeout(tmp_path):
    from hkgpu_tune.core.profile import parse_profile_text
    import os
    model = os.path.join(os.path.dirname(__file__), "..", "triton", "data", "doubler.py")
    text = (f"name: x\ntriton:\n  server: pytriton\n  model_repository: {tmp_path}/m\n  run_dir: {tmp_path}/r\n"
            f"  gpu: null\n  gate: {{stop_timeout_s: 45}}\n  models:\n  - name: doubler\n    backend: python\n"
            f"    model_file: {model}\n    max_batch_size: 4\n"
            f"    inputs: [{{name: INPUT0, data_type: FP32, dims: [4]}}]\n"
            f"    outputs: [{{name: OUTPUT0, data_type: FP32, dims: [4]}}]\n")
    t = parse_profile_text(text, str(tmp_path / "p.yaml")).section("triton")
    s = sweep.sweep_section(t, str(tmp_path), mps=False)
    assert t.gate.stop_timeout_s == 45 and s.gate.stop_timeout_s == sweep.SWEEP_EXIT_S < 45
    assert s.supervisor == "process" and s.http.address == "127.0.0.1"
