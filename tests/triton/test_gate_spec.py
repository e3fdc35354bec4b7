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
    assert (g.protocol, g.live_min_req_s, g.live_window_s, g.canary) == ("http", 5.0, 5.0, 4)


def test_set_values(tmp_path):
    g = gate_of(tmp_path, load={"requests": 10, "concurrency": 2, "protocol": "grpc"},
                live={"min_req_s": 50, "window_s": 8, "canary": 2})
    assert (g.protocol, g.requests, g.live_min_req_s, g.live_window_s, g.canary) == ("grpc", 10, 50.0, 8.0, 2)


@pytest.mark.parametrize("gate, key, msg", [({"load": {"protocol": "udp"}}, "gate.load.protocol", "udp"),
                                            ({"live": {"canary": 0}}, "gate.live.canary", "1-64"),
                                            ({"live": {"window": 5}}, "gate.live.window", "window_s")])
def test_bad_values_name_the_key(tmp_path, gate, key, msg):
    with pytest.raises(ProfileError) as e:
        gate_of(tmp_path, **gate)
    assert str(e.value).startswith("t.yaml:") and key in str(e.value) and msg in str(e.value), str(e.value)
