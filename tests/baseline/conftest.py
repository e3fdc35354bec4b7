import os
import shutil

import pytest

from .netns import Bed


def _why_not() -> str:
    if os.geteuid() != 0 or not shutil.which("ip"):
        return "needs root and iproute2 (network namespaces)"
    for tool in ("iperf3", "ping", "ss"):
        if not shutil.which(tool):
            return f"{tool} is not installed (scripts/apt-packages.txt)"
    return ""


@pytest.fixture(scope="module")
def bed():
    why = _why_not()
    if why:
        pytest.skip(why)
    b = Bed("c", port=5311)
    try:
        b.serve()
        yield b
    finally:
        b.close()
