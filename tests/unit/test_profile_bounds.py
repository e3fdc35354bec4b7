"""Integer settings of a profile at and just past their bounds, and a YAML boolean where an integer
belongs: refused in one line naming file, line and key (two mutants of the integer check got
through the other profile tests)."""
import pytest

from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.profile import parse_profile_text

MTU = "network:\n  interfaces:\n    - match: {{name: eth0}}\n      mtu: {}\n"


@pytest.mark.parametrize("value", [68, 65535])
def test_the_bounds_themselves_are_taken(value):
    assert parse_profile_text(MTU.format(value), "t.yaml").network.interfaces[0].mtu == value


@pytest.mark.parametrize("value, shown", [(67, "67"), (65536, "65536"), ("true", "'true'"), ("false", "'false'")])
def test_one_past_a_bound_or_a_boolean_is_refused(value, shown):
    with pytest.raises(ProfileError) as e:
        parse_profile_text(MTU.format(value), "t.yaml")
    assert str(e.value) == f"t.yaml:4: network.interfaces[0].mtu: expected an integer 68-65535, got {shown}"
