"""The registry of journals follows what each journal holds: a partial rollback keeps its state
directory listed, the last restore drops it; a refused apply leaves it as it was."""
import json
import re

import pytest

from hkgpu_tune.core.errors import StateError

from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.tune.engine import Engine

from .test_engine import PROFILE, host


def listed(host_dir):
    f = host_dir / "journals.json"
    return json.loads(f.read_text())["journals"] if f.exists() else []


def test_rollback_keeps_the_registry_right(tmp_path, host_dir):
    b = host()
    eng = Engine(parse_profile_text(PROFILE, "t.yaml"), state_dir=str(tmp_path / "a"), backends=b)
    assert not eng.apply().error
    assert listed(host_dir) == [str(tmp_path / "a")]
    restored, errs = eng.rollback(only=["sysctl"])
    assert restored and not errs and listed(host_dir) == [str(tmp_path / "a")]   # link, ethtool, qdisc left
    restored, errs = eng.rollback()
    assert restored and not errs and listed(host_dir) == []
    assert b.net.links()[0]["mtu"] == 1500 and b.sysctl.values["net.core.rmem_max"] == "212992"


def test_a_refused_apply_is_never_listed(tmp_path, host_dir):
    b = host()
    assert not Engine(parse_profile_text(PROFILE, "t.yaml"), state_dir=str(tmp_path / "a"), backends=b).apply().error
    other = Engine(parse_profile_text(PROFILE.replace("mtu: 9000", "mtu: 4000"), "t.yaml"),
                   state_dir=str(tmp_path / "b"), backends=b)
    with pytest.raises(StateError, match=re.escape(f"link ens1f0 mtu is recorded in the journal at {tmp_path / 'a'} "
                                                   "(original 1500)")):
        other.apply()
    assert listed(host_dir) == [str(tmp_path / "a")] and not (tmp_path / "b" / "state.json").exists()
    assert b.net.links()[0]["mtu"] == 9000
