#!/usr/bin/env python3
"""Generate the module and subsystem tables of docs/architecture.md from the package itself.

    python3 scripts/module_table.py           # rewrite the tables in docs/architecture.md
    python3 scripts/module_table.py --check   # exit 1 when the doc is not current (tests do this)

Modules are read with ast (each one's docstring, first sentence); subsystems from the registry
(hkgpu_tune/subsystems: each module's SPEC)."""
from __future__ import annotations

import argparse
import ast
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "hkgpu_tune")
DOC = os.path.join(ROOT, "docs", "architecture.md")
LAYERS = ["core", "backends", "serve", "subsystems", "tune", "observe", "baseline", "fleet", "cli"]
BEGIN, END = "<!-- BEGIN {} (scripts/module_table.py writes this) -->", "<!-- END {} -->"


def summary(doc: str | None) -> str:
    if not doc:
        return ""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    m = re.search(r"(?<=[a-z0-9)`'][.?!])\s", para)
    s = para[:m.start()] if m else para
    if len(s) > 160:
        s = s[:157].rsplit(" ", 1)[0] + " ..."
    return s.replace("|", "\\|")


def modules() -> list[tuple[str, str, str]]:
    """(layer, module, summary), by layer then name."""
    out = []
    for d, dirs, files in os.walk(PKG):
        dirs.sort()
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            with open(path, encoding="utf-8") as fh:
                doc = ast.get_docstring(ast.parse(fh.read(), path))
            top = parts[1] if len(parts) > 2 else ""
            out.append((top if top in LAYERS else "(package)", name, summary(doc)))
    order = {k: i for i, k in enumerate(["(package)", *LAYERS])}
    return sorted(out, key=lambda t: (order[t[0]], t[1]))


def module_table() -> str:
    rows = ["| layer | module | what it is |", "|---|---|---|"]
    rows += [f"| {layer} | `{name}` | {text} |" for layer, name, text in modules()]
    return "\n".join(rows)


def subsystem_table() -> str:
    sys.path.insert(0, ROOT)
    from hkgpu_tune import subsystems
    from hkgpu_tune.core import sections
    own = sections.owners()
    rows = ["| order | subsystem | section (owned here) | setting types (state.json) | survives a reboot by | per netns |",
            "|---|---|---|---|---|---|"]
    for s in subsystems.specs():
        owned = ", ".join(f"`{n}`" for n in s.sections) or "-"
        types = ", ".join(f"`{t.name}`" for t in s.types) or "- (facts only)"
        ns = "net.* keys" if callable(s.netns) else ("yes" if s.netns else "no")
        rows.append(f"| {s.order} | `{s.name}` | `{s.section}` ({owned}) | {types} | {s.persist} | {ns} |")
    others = sorted(n for n, o in own.items() if not o.startswith("subsystem "))
    rows.append("")
    rows.append("Sections no subsystem applies: " + ", ".join(f"`{n}` ({own[n]})" for n in others) + ".")
    return "\n".join(rows)


def render(text: str) -> str:
    for tag, table in (("SUBSYSTEMS", subsystem_table()), ("MODULES", module_table())):
        b, e = BEGIN.format(tag), END.format(tag)
        if b not in text or e not in text:
            raise SystemExit(f"{DOC}: the markers {b} and {e} are missing")
        head, rest = text.split(b, 1)
        text = head + b + "\n" + table + "\n" + e + rest.split(e, 1)[1]
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/architecture.md is not current")
    a = ap.parse_args()
    with open(DOC, encoding="utf-8") as f:
        old = f.read()
    new = render(old)
    if a.check:
        if new != old:
            print(f"{DOC} is not current: run python3 scripts/module_table.py", file=sys.stderr)
            return 1
        return 0
    if new != old:
        with open(DOC, "w", encoding="utf-8") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
