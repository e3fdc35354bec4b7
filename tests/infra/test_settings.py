"""One test per setting of the node profile per host (parametrised in conftest.py); each reads the
host with its own tools (tests/infra/infra_checks.py), never with hkgpu-tune's verify."""


def test_setting(infra_host, setting):
    setting()
