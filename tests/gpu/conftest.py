import pytest

from hkgpu_tune.backends.nvml import Nvml


def _driver():
    nv = Nvml()
    ok, why = nv.available()
    nv.close()
    return ok, why


OK, WHY = _driver()


def pytest_collection_modifyitems(config, items):
    for item in items:
        # the marker, not the keyword: every item under tests/gpu has the keyword "gpu" (its package)
        if item.get_closest_marker("gpu") and not OK:
            item.add_marker(pytest.mark.skip(reason=f"no NVIDIA driver here: {WHY}"))
