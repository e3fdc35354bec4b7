"""A failed, rolled-back converge leaves the node profile as it was: the failed sections are never
left in node.yaml (the boot unit and the next verify read it as what the host should have)."""
import os

import pytest
import yaml

from hkgpu_tune.core.errors import ApplyError
from hkgpu_tune.fleet.converge import ConvergeFailed, converge

from ..unit.test_engine import host


def failing_host():
    b = host()
    real = b.sysctl.write

    def write(key, value, *a, **k):
        if key == "net.ipv4.tcp_mtu_probing":
            raise ApplyError(f"{key}: the kernel refused the write (test)")
        return real(key, value, *a, **k)
    b.sysctl.write = write
    return b


@pytest.mark.parametrize("before", [None, "name: node\nsysctl:\n  net.core.rmem_max: 4194304\n"])
def test_a_rolled_back_converge_puts_node_yaml_back(tmp_path, before):
    node = tmp_path / "node.yaml"
    if before is not None:
        node.write_text(before)
        ino = node.stat().st_ino
    b = failing_host()
    start = dict(b.sysctl.values)
    sections = {"sysctl": {"net.core.rmem_max": 268435456, "net.ipv4.tcp_mtu_probing": 1}}
    with pytest.raises(ConvergeFailed) as e:
        converge(sections, False, profile_path=str(node), state_dir=str(tmp_path / "st"),
                 host_dir=str(tmp_path / "host"), backends=b)
    assert e.value.result.get("rolled_back")
    assert b.sysctl.values == start
    # never written (the node profile is written only once the apply went through): a kill at any
    # point of the failed run cannot leave the failed sections there (tests/hostile/test_kills_converge.py)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    if before is None:
        assert not node.exists()
    else:
        assert node.read_text() == before and node.stat().st_ino == ino


def test_sections_another_converge_wrote_during_this_apply_are_kept(tmp_path):
    """Two converges at once (the pull timer's and a pushed play, each with its role's sections):
    the node profile is written after the apply, so it is merged again then; the sections the other
    run wrote meanwhile stay (before, this run's text, merged before its apply, dropped them)."""
    node = tmp_path / "node.yaml"
    node.write_text("name: node\n")
    b = host()
    real = b.sysctl.write
    other = "name: node\nnetwork:\n  fabric_peers: [198.18.0.2]\n"

    def write(key, value, *a, **k):
        node.write_text(other)   # the other run finished while this one applied
        return real(key, value, *a, **k)
    b.sysctl.write = write
    converge({"sysctl": {"net.core.rmem_max": 268435456}}, False, profile_path=str(node),
             state_dir=str(tmp_path / "st"), host_dir=str(tmp_path / "host"), backends=b)
    doc = yaml.safe_load(node.read_text())
    assert doc["network"] == {"fabric_peers": ["198.18.0.2"]}, node.read_text()
    assert doc["sysctl"] == {"net.core.rmem_max": 268435456}, node.read_text()
