"""The VM test node (tests/vm/vm.py): built once per cache key, booted once per test session and
shared by the modules here in file order (test_node.py, then test_triton_vm.py); test_dayone_vm.py
boots a node of its own from the same image."""
from __future__ import annotations

import contextlib
import os
import subprocess
import time

import pytest

from ..helpers import env_tools_on_path, missing_tool
from .vm import HERE, VM, image_dir, share

CACHE = os.environ.get("HKGPU_VM_DIR", "/var/cache/hkgpu-tune/vm")
STAGES: list[tuple[str, float]] = []   # (stage, seconds), printed at the end of the run


class Stage:
    """with stage("name"): ... records how long the stage took."""
    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.t0 = time.monotonic()

    def __exit__(self, *exc):
        STAGES.append((self.name + ("" if exc[0] is None else " (failed)"), time.monotonic() - self.t0))


@pytest.fixture(scope="session")
def stage():
    return Stage


def pytest_terminal_summary(terminalreporter):
    if STAGES:
        terminalreporter.section("VM test node: time per stage")
        for name, s in STAGES:
            terminalreporter.write_line(f"{s:8.1f} s  {name}")


@contextlib.contextmanager
def booted(tmp_path_factory):
    """A VM test node from the cached image, booted on an overlay of its own; shut down after."""
    # root: the tests are marked root (tests/conftest.py skips them otherwise)
    env_tools_on_path()
    why = missing_tool(("qemu-system-x86_64", "qemu-img", "debootstrap", "mkfs.ext4", "ssh", "ip", "ansible-playbook"))
    if not why and not os.path.exists("/dev/net/tun"):
        why = "/dev/net/tun is missing (the data NIC is a tap)"
    if why:
        pytest.skip(why)
    img = image_dir(CACHE)
    with Stage("image (build, or the cached one)"):
        b = subprocess.run([os.path.join(HERE, "build.sh"), img], capture_output=True, text=True, timeout=1200)
    assert b.returncode == 0, f"image build failed:\n{b.stdout}\n{b.stderr}"
    share(img)     # built: another run of the same key may boot it too (each boots an overlay of its own)
    m = VM(img, str(tmp_path_factory.mktemp("vm")))
    try:
        with Stage("boot to SSH"):
            m.start()
            m.wait_ssh(900)   # a loaded 2-core host: another TCG guest may share it
        yield m
    finally:
        with Stage("shutdown and clean-up"):
            m.stop()


@pytest.fixture(scope="session")
def vm(tmp_path_factory):
    with booted(tmp_path_factory) as m:
        yield m


@pytest.fixture(scope="session")
def wheel_dir(tmp_path_factory):
    """The hkgpu_install role's controller cache (hkgpu_install_cache_dir): one per session, so that a later
    module finds the node's install stamp (the wheel's checksum) and does not reinstall."""
    return str(tmp_path_factory.mktemp("wheels"))
