import os
import shutil

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "root" in item.keywords and (os.geteuid() != 0 or not shutil.which("ip")):
            item.add_marker(pytest.mark.skip(reason="needs root and iproute2 (network namespaces)"))
