#!/usr/bin/python
"""Ansible module: apply, verify or roll back a node's hkgpu-tune profile through the library."""
from __future__ import annotations

DOCUMENTATION = r"""
module: hkgpu
short_description: Apply, verify or roll back an hkgpu-tune profile on a GPU inference node
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
supports_check_mode: true
"""

EXAMPLES = r"""
- name: Apply the network sections
  hkgpu:
    profile: {network: {interfaces: [{match: {name: eth0}, mtu: 9000}]}, sysctl: {net.ipv4.tcp_mtu_probing: 1}}
    persist: true
  vars:
    ansible_python_interpreter: /opt/hkgpu-tune/bin/python
"""

RETURN = r"""
results: {description: "Result.to_dict() of every setting after the run", type: list, returned: always}
failures: {description: the results that failed (drift, error, required unsupported), type: list, returned: always}
changes: {description: the changes planned (check mode) or applied, type: list, returned: state=applied}
"""

import os

from ansible.module_utils.basic import AnsibleModule


def _yaml_text(doc) -> str:
    import yaml
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def _subsystems_of(sections):
    from hkgpu_tune import subsystems
    return subsystems.for_sections(sections)


def _node_profile(p):
    """(profile object, text to write or None, old text, only default) for the profile argument."""
    import yaml

    from hkgpu_tune.errors import ProfileError
    from hkgpu_tune.profile import load_profile, parse_profile_text

    arg = p["profile"]
    if arg is None:
        return load_profile(p["profile_path"]), None, None, None
    if isinstance(arg, str):
        return load_profile(arg), None, None, None
    if not isinstance(arg, dict):
        raise ProfileError("profile: expected a dict of sections or a path")
    old = _read(p["profile_path"])
    doc = {}
    if old:
        try:
            doc = yaml.safe_load(old) or {}
        except yaml.YAMLError as e:
            raise ProfileError(f"{p['profile_path']}: not valid YAML: {e}") from None
    doc.setdefault("name", "node")
    doc.setdefault("description", "rendered by the hkgpu Ansible roles")
    for key, value in arg.items():
        if value in (None, {}, []):
            doc.pop(key, None)
        else:
            doc[key] = value
    text = _yaml_text(doc)
    try:
        prof = parse_profile_text(text, p["profile_path"])
    except ProfileError as e:
        raise ProfileError(f"{e} (in the profile rendered from the role variables; nothing written)") from None
    return prof, text, old, _subsystems_of([k for k, v in arg.items() if v not in (None, {}, [])])


def _line(d) -> str:
    return f"{d['subsystem']} {d['target']} {d['key']} = {d['current']}"


def _failure_lines(results) -> str:
    return "; ".join(f"{r.subsystem} {r.target} {r.key}: {r.status}: current {r.current}, "
                     f"desired {r.desired}{' (' + r.reason + ')' if r.reason else ''}" for r in results if r.failed)


def _write(path, text):
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _files(module) -> tuple[bool, list]:
    """Write the role's small files whose content differs; returns (changed, diffs)."""
    changed, diffs = False, []
    for f in module.params["files"]:
        path, content = f["path"], f["content"]
        old = _read(path)
        if old == content:
            continue
        changed = True
        diffs.append({"before": old or "", "after": content, "before_header": path, "after_header": path})
        if not module.check_mode:
            _write(path, content)
            os.chmod(path, int(str(f.get("mode") or "0644"), 8))
    return changed, diffs


def run(module) -> dict:
    from hkgpu_tune.engine import Engine
    from hkgpu_tune.profile import parse_profile_text

    p = module.params
    if p["state"] == "rolled_back":
        from hkgpu_tune.persist import unpersist
        eng = Engine(parse_profile_text("name: rollback\n", "<rollback>"), state_dir=p["state_dir"])
        saved = eng.state.load()
        if module.check_mode:
            return {"changed": bool(saved), "restored": [c.to_dict() for c in saved], "files": []}
        restored, errs = eng.rollback()
        files = unpersist(eng.state.dir)
        if errs:
            module.fail_json(msg="rollback failed: " + "; ".join(errs), restored=[c.to_dict() for c in restored])
        return {"changed": bool(restored or files), "restored": [c.to_dict() for c in restored], "files": files}

    prof, text, old, only = _node_profile(p)
    only = p["only"] if p["only"] is not None else only
    if only is not None and not only:
        return {"changed": False, "results": [], "failures": [], "changes": [], "msg": "nothing selected"}
    eng = Engine(prof, only=only, state_dir=p["state_dir"])
    try:
        if p["state"] == "verified":
            files_changed, file_diffs = _files(module)
            res = eng.verify()
            out = {"changed": files_changed, "results": [r.to_dict() for r in res],
                   "failures": [r.to_dict() for r in res if r.failed]}
            if file_diffs:
                out["diff"] = file_diffs
            if out["failures"] and p["fail_on_drift"]:
                module.fail_json(msg=f"{len(out['failures'])} setting(s) failed: {_failure_lines(res)}", **out)
            return out

        file_changed = text is not None and text != old
        changes, res = eng.plan()
        diff = {"before": "".join(_line(c.to_dict()) + "\n" for c in changes),
                "after": "".join(f"{c.subsystem} {c.target} {c.key} = {c.desired}\n" for c in changes),
                "before_header": "live", "after_header": "profile"}
        if file_changed:
            diff = [{"before": old or "", "after": text, "before_header": p["profile_path"] + " (before)",
                     "after_header": p["profile_path"] + " (after)"}, diff]
        out = {"changed": bool(changes) or file_changed, "diff": diff, "changes": [c.to_dict() for c in changes]}
        if module.check_mode:
            unfixable = [r for r in res if r.failed and r.write is None]
            out.update(results=[r.to_dict() for r in res], failures=[r.to_dict() for r in unfixable])
            return out
        if file_changed:
            _write(p["profile_path"], text)
        if changes:
            rep = eng.apply()
        else:  # nothing to write: the plan's comparison is the verify result (no second read)
            from hkgpu_tune.engine import ApplyReport
            rep = ApplyReport(results=res)
        out.update(results=[r.to_dict() for r in rep.results], failures=[r.to_dict() for r in rep.results if r.failed],
                   changes=[c.to_dict() for c in rep.changes])
        if rep.error:
            module.fail_json(msg=rep.error + (" (rolled back)" if rep.rolled_back else ""),
                             rolled_back=rep.rolled_back, **out)
        if p["persist"] and (out["changed"] or _needs_persist(p, text)):
            from hkgpu_tune.persist import persist
            full = Engine(parse_profile_text(text, p["profile_path"]) if text else prof, state_dir=p["state_dir"],
                          backends=eng.b)
            out["persisted"] = persist(full, "/", profile_path=p["profile_path"] if text else prof.path)
        if out["failures"]:
            module.fail_json(msg=f"{len(out['failures'])} setting(s) failed after apply: "
                                 f"{_failure_lines(rep.results)}", **out)
        return out
    finally:
        eng.b.close()


def _needs_persist(p, text) -> bool:
    """The persisted copy of the node profile is missing or older than the node profile."""
    from hkgpu_tune.persist import PROFILE_FILE
    return text is not None and _read("/" + PROFILE_FILE) != text


def main():
    module = AnsibleModule(
        argument_spec=dict(
            profile=dict(type="raw"),
            profile_path=dict(type="path", default="/etc/hkgpu-tune/node.yaml"),
            only=dict(type="list", elements="str"),
            state=dict(type="str", choices=["applied", "verified", "rolled_back"], default="applied"),
            state_dir=dict(type="path", default="/var/lib/hkgpu-tune"),
            persist=dict(type="bool", default=False),
            files=dict(type="list", elements="dict", default=[]),
            fail_on_drift=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    try:
        from hkgpu_tune.errors import HkError
    except ImportError as e:
        import sys
        module.fail_json(msg=f"hkgpu_tune is not importable by {sys.executable} ({e}): run the hkgpu_install "
                             f"role and set ansible_python_interpreter to hkgpu_python")
    # the one place library errors become module failures
    try:
        module.exit_json(**run(module))
    except HkError as e:
        module.fail_json(msg=str(e))


if __name__ == "__main__":
    main()
