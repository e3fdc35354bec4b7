import os
import shutil

import pytest

from tests import skip_report


def pytest_configure(config):
    skip_report.register(config)     # every skip listed with its reason; one without fails the run


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "root" in item.keywords and (os.geteuid() != 0 or not shutil.which("ip")):
            item.add_marker(pytest.mark.skip(reason="needs root and iproute2 (network namespaces)"))
