"""Every commented `Example:` in every role's defaults/main.yml (issue 33, item 6: the affinity
role's example was refused by the schema). Each example is read as the YAML it shows, must have
the type of the variable's default, and where the role renders a profile section from it, the
section the role would render is parsed by the library's schema (hkgpu_tune.core.profile)."""
from __future__ import annotations

import glob
import os
import re

import pytest
import yaml
from jinja2.nativetypes import NativeEnvironment

from hkgpu_tune.core.errors import ProfileError
from hkgpu_tune.core.profile import parse_profile_text
from tests.helpers import REPO, role_filters

ROLES = sorted(glob.glob(os.path.join(REPO, "roles", "*", "defaults", "main.yml")))
ASSIGN = re.compile(r"^(hkgpu_\w+):")


def examples(path):
    """[(line, variable, value)] of a defaults file's `# ... Example: ...` comments."""
    lines = open(path).read().splitlines()
    out = []
    for i, ln in enumerate(lines):
        m = re.match(r"^#.*\bExample\b[^:]*:\s*(.*)$", ln)
        if not m:
            continue
        nxt = next((x for x in lines[i + 1:] if ASSIGN.match(x)), "")
        var = ASSIGN.match(nxt).group(1) if nxt else None
        text = m.group(1).strip()
        if not text:                        # a block: the comment lines below, '# ' taken off
            block = []
            for x in lines[i + 1:]:
                if not x.startswith("#"):
                    break
                block.append(x[2:] if x.startswith("# ") else x[1:])
            doc = yaml.safe_load("\n".join(block))
        else:
            text = re.split(r"\s{2,}\(", text)[0]       # "value   (a note)"
            try:
                doc = yaml.safe_load(text)
            except yaml.YAMLError:
                doc = text
            if not (isinstance(doc, dict) and len(doc) == 1 and ASSIGN.match(f"{next(iter(doc))}:")):
                doc = {var: doc}
        assert isinstance(doc, dict) and doc, f"{path}:{i + 1}: an example that is not `variable: value`"
        out.append((i + 1, doc))      # the variables of one example go together (launch with its image)
    return out


CASES = [(os.path.relpath(p, REPO), line, doc) for p in ROLES for line, doc in examples(p)]


def defaults():
    v = {}
    for p in ROLES:
        v.update(yaml.safe_load(open(p)) or {})
    return v


def role_vars(role):
    p = os.path.join(REPO, "roles", role, "vars", "main.yml")
    return yaml.safe_load(open(p)) if os.path.exists(p) else {}


def resolve(values: dict) -> dict:
    """Template every value as Ansible would (native types, the collection's and Ansible's filters)."""
    from ansible.plugins.filter.core import FilterModule
    env = NativeEnvironment()
    env.filters.update(FilterModule().filters())
    env.filters.update(role_filters())
    core = env.filters["items2dict"]          # Ansible's takes the generator Jinja's selectattr gives
    env.filters["items2dict"] = lambda x, *a, **k: core(list(x), *a, **k)

    def render(x, ctx):
        if isinstance(x, str) and "{{" in x:
            return env.from_string(x).render(ctx)
        if isinstance(x, dict):
            return {k: render(v, ctx) for k, v in x.items()}
        if isinstance(x, list):
            return [render(v, ctx) for v in x]
        return x
    ctx = dict(values)
    for _ in range(6):
        for k, v in list(ctx.items()):
            try:
                ctx[k] = render(values[k], ctx)
            except Exception:     # noqa: BLE001 - a variable that needs another not yet rendered
                pass
    return ctx


def test_every_role_has_examples_and_they_are_found():
    assert len(CASES) > 40 and {c[0].split("/")[1] for c in CASES} >= {"hkgpu_affinity", "hkgpu_network", "hkgpu_gpu",
                                                                        "hkgpu_triton", "hkgpu_verify"}


@pytest.mark.parametrize("path,line,doc", CASES, ids=[f"{c[0].split('/')[1]}:{c[1]}:{','.join(c[2])}" for c in CASES])
def test_the_example_is_valid(path, line, doc):
    d = defaults()
    for var, value in doc.items():
        assert var in d, f"{path}:{line}: the example names {var}, which the role does not define"
        default = d[var]
        if default is not None:
            kinds = (dict, list, bool, (int, float), str)
            kind = next(k for k in kinds if isinstance(default, k) and not (k == (int, float) and isinstance(default, bool)))
            ok = isinstance(value, kind) or value is None
            assert ok, f"{path}:{line}: {var}: example {value!r} is not a {type(default).__name__} as the default"
    var = next(iter(doc))
    role = path.split("/")[1]
    rv = role_vars(role)
    key = f"__{role}_profile"
    if key not in rv:
        return
    sections = rendered(d, rv, key, doc)
    if not sections:     # a variable that adds to the role's main one (triton: models), with its example
        base = next((x for p, _, x in CASES if p == path and next(iter(x)) != var), None)
        sections = rendered(d, rv, key, {**base, **doc}) if base else {}
    if not sections:
        return           # it feeds no profile section (restart units, files to copy)
    text = yaml.safe_dump({"name": "example", **sections}, sort_keys=False)
    try:
        parse_profile_text(text, f"{path}:{line} ({var} example)")
    except ProfileError as e:
        # a file the example names on the node is not on this machine: not the schema's refusal
        if "no such file" not in str(e):
            raise


def rendered(d, rv, key, over):
    ctx = resolve({**d, **rv, **over, "ansible_run_tags": ["all"]})
    return {k: v for k, v in ctx[key].items() if v not in ({}, [], None, "")}
