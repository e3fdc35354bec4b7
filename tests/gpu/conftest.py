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
        if "gpu" in item.keywords and not OK:
            item.add_marker(pytest.mark.skip(reason=f"no NVIDIA driver here: {WHY}"))
