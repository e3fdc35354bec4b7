import os
import shutil
import tempfile

import pytest

from tests import host_guard, skip_report, slow_check


def pytest_configure(config):
    skip_report.register(config)     # every skip listed with its reason; one without fails the run
    slow_check.register(config)      # an unmarked test over 5 s is listed; far over, it fails the run
    host_guard.register(config)      # no file written to the host's own /etc or state directory
    # the host lock and registry of journals (hkgpu_tune/tune/host.py) are host-wide in the product;
    # a test run must not share them with another run on the machine (nor use the real ones): its
    # own, and each test its own below (fixtures of a wider scope get this one)
    if "HKGPU_TUNE_HOST_DIR" not in os.environ:
        os.environ["HKGPU_TUNE_HOST_DIR"] = config._hkgpu_host_dir = tempfile.mkdtemp(prefix="hkgpu-host-")


def pytest_sessionfinish(session, exitstatus):
    leaked = host_guard.check(session)
    if leaked:
        print("\nhost_guard: the run wrote to the host itself: " + ", ".join(leaked[:20]))
        session.exitstatus = 1


def pytest_unconfigure(config):
    d = getattr(config, "_hkgpu_host_dir", None)
    if d:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def module_host_dir(tmp_path_factory):
    """The host directory of a module's wider fixtures (a server one module's tests share): autouse
    fixtures of a scope are set up before the others of that scope, so what a module fixture applies
    is registered here, and a journal it leaves cannot refuse another module's apply (the test's own,
    below, takes over inside each test)."""
    d = tmp_path_factory.mktemp("modhost")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HKGPU_TUNE_HOST_DIR", str(d))
        yield d


@pytest.fixture(autouse=True)
def host_dir(tmp_path_factory, monkeypatch):
    """This test's host directory (HKGPU_TUNE_HOST_DIR): tests with temporary state directories
    never see each other's journals."""
    d = tmp_path_factory.mktemp("host")
    monkeypatch.setenv("HKGPU_TUNE_HOST_DIR", str(d))
    return d


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "root" in item.keywords and (os.geteuid() != 0 or not shutil.which("ip")):
            item.add_marker(pytest.mark.skip(reason="needs root and iproute2 (network namespaces)"))
