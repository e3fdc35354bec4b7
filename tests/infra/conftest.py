"""testinfra checks of tuned hosts: one test per setting per host.

    pytest tests/infra --hosts=ansible://all --ansible-inventory=inventory/hk -l ... 

The checks are not a second implementation: each host runs the library's own verifier
(`hkgpu-tune verify --json` on its node profile, the same code the module and the boot unit
use) and every Result becomes one test, named host::subsystem::target::key.
"""
from __future__ import annotations

import json
import shlex

import pytest

DEFAULTS = {"hkgpu_prefix": "/opt/hkgpu-tune", "hkgpu_profile_path": "/etc/hkgpu-tune/node.yaml",
            "hkgpu_state_dir": "/var/lib/hkgpu-tune"}


def _var(hostvars: dict, name: str) -> str:
    """An inventory variable, rendered the way Ansible would (simple Jinja over the host's vars)."""
    import jinja2
    v = str(hostvars.get(name, DEFAULTS.get(name, "")))
    for _ in range(3):
        if "{{" not in v:
            break
        v = jinja2.Template(v).render(**{**DEFAULTS, **hostvars})
    return v


def verify_host(host) -> list[dict]:
    """Run the library's verifier on the host; returns its Result dicts."""
    hv = host.ansible.get_variables() if host.backend.NAME == "ansible" else {}
    cli = _var(hv, "hkgpu_cli") if "hkgpu_cli" in hv else _var(hv, "hkgpu_prefix") + "/bin/hkgpu-tune"
    cmd = (f"{shlex.quote(cli)} verify --json --profile {shlex.quote(_var(hv, 'hkgpu_profile_path'))} "
           f"--state-dir {shlex.quote(_var(hv, 'hkgpu_state_dir'))}")
    out = host.run(cmd)
    if out.rc not in (0, 2):
        return [{"subsystem": "verify", "target": "-", "key": "run", "current": out.stderr.strip()[-500:],
                 "desired": "exit 0 or 2", "status": "error", "reason": f"`{cmd}` exited {out.rc}",
                 "required": True}]
    return json.loads(out.stdout)["results"]


def pytest_generate_tests(metafunc):
    if "setting" not in metafunc.fixturenames:
        return
    spec = metafunc.config.getoption("hosts", None)
    if not spec:
        metafunc.parametrize("host_name,setting", [pytest.param(
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
        for r in verify_host(h):
            params.append(pytest.param(name, r, id=f"{name}::{r['subsystem']}::{r['target']}::{r['key']}"))
    metafunc.parametrize("host_name,setting", params)
