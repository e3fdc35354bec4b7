"""testinfra checks of tuned hosts: one test per setting per host, independent of hkgpu-tune.

    pytest tests/infra --hosts=ansible://all --ansible-inventory=inventory/hk
    ip netns exec NODE pytest tests/infra --hosts=local:// --hkgpu-profile=/etc/hkgpu-tune/node.yaml

Each host's node profile (hkgpu_profile_path, or --hkgpu-profile) is read from the host and
parsed as input; every setting in it becomes a test (tests/infra/checks.py) that reads the host
with its own tools. hkgpu-tune's verify is never run: a compare() bug that says "ok" still fails
here. Test ids: host::subsystem::target::key.
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import infra_checks as checks  # noqa: E402

DEFAULTS = {"hkgpu_prefix": "/opt/hkgpu-tune", "hkgpu_profile_path": "/etc/hkgpu-tune/node.yaml",
            "hkgpu_state_dir": "/var/lib/hkgpu-tune"}


def pytest_addoption(parser):
    parser.addoption("--hkgpu-profile", default=None,
                     help="the node profile on each host (default: the inventory's hkgpu_profile_path, "
                          "else /etc/hkgpu-tune/node.yaml)")


def _var(hostvars: dict, name: str) -> str:
    """An inventory variable, rendered the way Ansible would (simple Jinja over the host's vars)."""
    import jinja2
    v = str(hostvars.get(name, DEFAULTS.get(name, "")))
    for _ in range(3):
        if "{{" not in v:
            break
        v = jinja2.Template(v).render(**{**DEFAULTS, **hostvars})
    return v


def host_checks(host, path: str | None) -> list:
    """The host's node profile (read from the host, parsed as input) as checks."""
    from hkgpu_tune.core.errors import HkError
    from hkgpu_tune.core.profile import parse_profile_text
    if not path:
        hv = host.ansible.get_variables() if host.backend.NAME == "ansible" else {}
        path = _var(hv, "hkgpu_profile_path")
    f = host.file(path)
    if not f.exists:
        def missing(host):
            raise AssertionError(f"{path}: no node profile on this host")
        return [checks.Check("profile", path, "present", True, missing)]
    try:
        prof = parse_profile_text(f.content_string, path)
    except HkError as e:
        def bad(host, e=str(e)):
            raise AssertionError(e)
        return [checks.Check("profile", path, "valid", True, bad)]
    return checks.plan(host, prof)


def pytest_generate_tests(metafunc):
    if "setting" not in metafunc.fixturenames:
        return
    spec = metafunc.config.getoption("hosts", None)
    if not spec:
        metafunc.parametrize("infra_host,setting", [pytest.param(
            None, None, marks=pytest.mark.skip(reason="needs --hosts=ansible://... --ansible-inventory=..."))])
        return
    import testinfra
    opts = metafunc.config.option
    hosts = testinfra.get_hosts(spec.split(","), ansible_inventory=getattr(opts, "ansible_inventory", None),
                                connection=getattr(opts, "connection", None),
                                force_ansible=getattr(opts, "force_ansible", False))
    params = []
    for h in hosts:
        name = h.backend.get_pytest_id()
        for c in host_checks(h, metafunc.config.getoption("hkgpu_profile")):
            params.append(pytest.param(h, c, id=f"{name}::{c.id}"))
    metafunc.parametrize("infra_host,setting", params)
