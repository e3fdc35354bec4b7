"""Two services never share a run directory (or a repository) by spelling it differently: every
path is normalised ('/x', '/x/', '//x', '/y/../x' are one) before the services are compared."""
import pytest

from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.profile import parse_profile_text

from ..unit.test_triton_services import model, text  # noqa: F401  (model: a fixture)

PORTS = "http: {port: 8010}, grpc: {port: 8011}, metrics: {port: 8012}"


@pytest.mark.parametrize("a,b", [("/srv/run/x", "/srv/run/x/"), ("/srv/run/x", "//srv/run/x"),
                                 ("/srv/run/x", "/srv/run/y/../x"), ("/srv/run/x", "/srv/./run//x")])
def test_one_run_directory_spelt_two_ways_is_refused(model, a, b):   # noqa: F811
    y = f"    - {{unit: hk-a, run_dir: '{a}'}}\n    - {{unit: hk-b, run_dir: '{b}', {PORTS}}}\n"
    with pytest.raises(ProfileError, match=r"node.yaml:10: .*run_dir /srv/run/x is also that of service hk-a"):
        parse_profile_text(text(model, y), "node.yaml")


def test_a_repository_spelt_with_a_trailing_slash_is_refused_too(model):   # noqa: F811
    y = (f"    - {{unit: hk-a, model_repository: /srv/a/models}}\n"
         f"    - {{unit: hk-b, model_repository: /srv/a/models/, {PORTS}}}\n")
    with pytest.raises(ProfileError, match=r"node.yaml:10: .*/srv/a/models is also that of service hk-a"):
        parse_profile_text(text(model, y), "node.yaml")
