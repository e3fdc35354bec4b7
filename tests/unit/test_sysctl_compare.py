"""The sysctl compare and its read-back, through the engine with swapped backends: an exact key above
its wanted value is drift (only buffer sizes take "at least"), and a value the kernel changed after
the write (clamped, rounded, refused in silence) fails the apply instead of being journalled as done.
Both were mutants that every other sysctl test let through."""
import pytest

from hkgpu_tune.core.report import DRIFT, OK, UNSUPPORTED

from .fakes import FakeSysctl
from .test_engine import by_key, engine, host

ONLY_SYSCTL = """\
sysctl:
  net.ipv4.tcp_mtu_probing: 1
  net.ipv4.tcp_rmem: 4096 87380 268435456
  net.core.rmem_max: 268435456
"""


@pytest.mark.parametrize("key, current, status", [
    ("net.ipv4.tcp_mtu_probing", "2", DRIFT),      # exact: 2 is not 1, above or not
    ("net.ipv4.tcp_mtu_probing", "0", DRIFT),
    ("net.ipv4.tcp_mtu_probing", "1", OK),
    ("net.ipv4.tcp_mtu_probing", "0x1", OK),       # the same number, as tuned compares
    ("net.core.rmem_max", "536870912", OK),         # a buffer size: more is fine
    ("net.core.rmem_max", "268435455", DRIFT),
    ("net.ipv4.tcp_rmem", "8192 87380 268435456", OK),
    ("net.ipv4.tcp_rmem", "4096 87380", DRIFT),     # a field missing is not "at least"
])
def test_exact_keys_differ_above_and_below_and_buffers_may_be_more(tmp_path, key, current, status):
    b = host(sysctl=FakeSysctl({"net.ipv4.tcp_mtu_probing": "1", "net.ipv4.tcp_rmem": "4096 87380 268435456",
                                "net.core.rmem_max": "268435456", key: current}))
    r = by_key(engine(tmp_path, b, text=ONLY_SYSCTL, only=["sysctl"]).verify())[("sysctl", "host", key)]
    assert r.status == status, (r.current, r.desired, r.reason)
    if status == DRIFT and key == "net.ipv4.tcp_mtu_probing":
        assert r.reason == "differs" and r.current == current


class ClampingSysctl(FakeSysctl):
    """A kernel that takes a write and shows another value (a clamp, as rmem_max past a limit)."""
    def __init__(self, values, shows):
        super().__init__(values)
        self.shows = shows          # {(key, value written): value shown}

    def write(self, key, value):
        super().write(key, value)
        self.values[key] = self.shows.get((key, str(value)), self.values[key])


def test_a_value_the_kernel_changed_after_the_write_is_unsupported_and_not_kept(tmp_path):
    b = host(sysctl=ClampingSysctl({"net.ipv4.tcp_mtu_probing": "0", "net.ipv4.tcp_rmem": "4096 87380 6291456",
                                    "net.core.rmem_max": "212992"}, shows={("net.ipv4.tcp_mtu_probing", "1"): "2"}))
    rep = engine(tmp_path, b, text=ONLY_SYSCTL, only=["sysctl"]).apply()
    r = by_key(rep.results)[("sysctl", "host", "net.ipv4.tcp_mtu_probing")]
    assert r.status == UNSUPPORTED and r.reason == "sysctl net.ipv4.tcp_mtu_probing: wrote '1', the kernel shows '2'"
    change = next(c for c in rep.changes if c.key == "net.ipv4.tcp_mtu_probing")
    assert not change.applied                               # not journalled as done
    assert b.sysctl.values["net.ipv4.tcp_mtu_probing"] == "0"   # and the original is back
    assert b.sysctl.values["net.core.rmem_max"] == "268435456"  # the others applied
