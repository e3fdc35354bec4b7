"""triton.gate's load protocol and busy-node (live) settings: parsed with the project's input rules."""
import pytest

from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.profile import parse_profile_text

from .conftest import dump, profile_dict


def gate_of(tmp_path, **gate):
    doc = profile_dict(tmp_path, (18000, 18001, 18002))
    doc["triton"]["gate"].update(gate)
    return parse_profile_text(dump(doc), "t.yaml").section("triton").gate


def test_defaults(tmp_path):
    g = gate_of(tmp_path)
    assert (g.protocol, g.live_min_req_s, g.live_window_s, g.canary, g.live_no_worse) == ("http", 5.0, 5.0, 4, 1.2)


def test_set_values(tmp_path):
    g = gate_of(tmp_path, load={"requests": 10, "concurrency": 2, "protocol": "grpc"},
                live={"min_req_s": 50, "window_s": 8, "canary": 2, "no_worse": 1.5})
    assert (g.protocol, g.requests, g.live_min_req_s, g.live_window_s, g.canary, g.live_no_worse) == \
        ("grpc", 10, 50.0, 8.0, 2, 1.5)


@pytest.mark.parametrize("gate, key, msg", [({"load": {"protocol": "udp"}}, "gate.load.protocol", "udp"),
                                            ({"live": {"canary": 0}}, "gate.live.canary", "1-64"),
                                            ({"live": {"window": 5}}, "gate.live.window", "window_s"),
                                            ({"live": {"no_worse": 0.5}}, "gate.live.no_worse", "from 1 to 10"),
                                            ({"live": {"no_worse": True}}, "gate.live.no_worse", "from 1 to 10"),
                                            ({"live": {"no_worse": "2x"}}, "gate.live.no_worse", "from 1 to 10")])
def test_bad_values_name_the_key(tmp_path, gate, key, msg):
    with pytest.raises(ProfileError) as e:
        gate_of(tmp_path, **gate)
    assert str(e.value).startswith("t.yaml:") and key in str(e.value) and msg in str(e.value), str(e.value)
