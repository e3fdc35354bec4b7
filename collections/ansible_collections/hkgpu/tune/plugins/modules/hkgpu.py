#!/usr/bin/python
"""Ansible module: apply, verify or roll back a node's hkgpu-tune profile through the library."""
from __future__ import annotations

DOCUMENTATION = r"""
module: hkgpu
short_description: Apply, verify or roll back an hkgpu-tune profile on a GPU inference node
author:
  - hkgpu-tune maintainers
requirements:
  - the hkgpu_tune Python package (the hkgpu-tune wheel) importable by the node's ansible_python_interpreter
    (the hkgpu.tune.hkgpu_install role installs it into hkgpu_prefix)
  - root on the node (it writes /proc/sys, links, ethtool settings, qdiscs and /etc files)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: the library plans and reports the changes it would make; nothing is written.
  diff_mode:
    support: full
    details: the node profile's text and each setting's current and desired values.
  platform:
    support: full
    platforms: posix
description:
  - A thin shell over the hkgpu_tune library. The library plans, applies (saving the
    originals first), verifies and rolls back; this module only passes arguments and
    returns the library's results.
  - With I(profile) as a dict, its top-level sections are merged into the node profile at
    I(profile_path) (the sections other roles own are kept); the merged profile is validated
    before anything is written or changed.
options:
  profile:
    description: A dict of profile sections, or the path of a profile file on the node.
    type: raw
  profile_path:
    description: The node profile that a dict I(profile) is merged into.
    type: path
    default: /etc/hkgpu-tune/node.yaml
  only:
    description: Subsystems to act on; default those of the sections in a dict I(profile), else all.
    type: list
    elements: str
  state:
    description: applied (plan, then apply unless in check mode), verified (read-only), rolled_back.
    type: str
    choices: [applied, verified, rolled_back]
    default: applied
  state_dir:
    description: Where apply keeps the originals.
    type: path
    default: /var/lib/hkgpu-tune
  host_dir:
    description:
      - The host lock and registry of journals, one per host whatever I(state_dir) names (default the
        host's own, /var/lib/hkgpu-tune). Only for simulated hosts that share one kernel.
    type: path
  files:
    description:
      - Small files the role owns on the node (e.g. a systemd unit), written when their content
        differs (not in check mode); each item has path, content and optional mode (octal string).
    type: list
    elements: dict
    default: []
  fail_on_drift:
    description: With state=verified, fail when a setting failed (drift, error, required unsupported).
    type: bool
    default: true
  persist:
    description: After a change, make the whole node profile survive a reboot (apply --persist).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Apply the network sections
  hkgpu.tune.hkgpu:
    profile: {network: {interfaces: [{match: {name: eth0}, mtu: 9000}]}, sysctl: {net.ipv4.tcp_mtu_probing: 1}}
    persist: true
  vars:
    ansible_python_interpreter: /opt/hkgpu-tune/bin/python
"""

RETURN = r"""
results: {description: "Result.to_dict() of every setting after the run", type: list, returned: always}
failures: {description: the results that failed (drift, error, required unsupported), type: list, returned: always}
changes: {description: the changes planned (check mode) or applied, type: list, returned: state=applied}
failed_check: {description: "verify or apply: which read-back found the failures (absent when something else failed)", type: str, returned: on failure}
"""

from ansible.module_utils.basic import AnsibleModule


def run(module) -> dict:
    """Arguments -> hkgpu_tune.fleet.converge.converge(); its result is the module's result."""
    from hkgpu_tune.fleet.converge import converge

    p = module.params
    arg = p["profile"]
    if arg is not None and not isinstance(arg, (dict, str)):
        from hkgpu_tune.core.errors import ProfileError
        raise ProfileError("profile: expected a dict of sections or a path")
    return converge(arg if isinstance(arg, dict) else None, module.check_mode,
                    profile=arg if isinstance(arg, str) else None, profile_path=p["profile_path"],
                    only=p["only"], state=p["state"], state_dir=p["state_dir"], host_dir=p["host_dir"], files=p["files"],
                    fail_on_drift=p["fail_on_drift"], persist=p["persist"])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            profile=dict(type="raw"),
            profile_path=dict(type="path", default="/etc/hkgpu-tune/node.yaml"),
            only=dict(type="list", elements="str"),
            state=dict(type="str", choices=["applied", "verified", "rolled_back"], default="applied"),
            state_dir=dict(type="path", default="/var/lib/hkgpu-tune"),
            host_dir=dict(type="path"),
            persist=dict(type="bool", default=False),
            files=dict(type="list", elements="dict", default=[]),
            fail_on_drift=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    try:
        from hkgpu_tune.core.errors import HkError
    except ImportError as e:
        import sys
        module.fail_json(msg=f"hkgpu_tune is not importable by {sys.executable} ({e}): run the hkgpu_install "
                             f"role and set ansible_python_interpreter to hkgpu_python")
    from hkgpu_tune.fleet.converge import ConvergeFailed
    # the one place library errors become module failures
    try:
        module.exit_json(**run(module))
    except ConvergeFailed as e:
        module.fail_json(msg=str(e), **e.result)
    except HkError as e:
        module.fail_json(msg=str(e))


if __name__ == "__main__":
    main()
