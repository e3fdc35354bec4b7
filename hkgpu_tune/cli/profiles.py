"""hkgpu-tune profiles list | show [NAME]: the shipped profiles, the node's, and the one in effect."""
from __future__ import annotations

from hkgpu_tune.cli.context import EXIT_OK, Context, nonempty


def add_parser(sub) -> None:
    p = sub.add_parser("profiles", help="list the profiles, or show one")
    psub = p.add_subparsers(dest="profiles_cmd", required=True, metavar="COMMAND")
    q = psub.add_parser("list", help="the shipped profiles and the node's, the one in effect marked")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.set_defaults(run=run_list)
    q = psub.add_parser("show", help="print a profile (checked first) and where it comes from")
    q.add_argument("name", nargs="?", type=nonempty,
                   help="shipped name or file (default: the one commands use now)")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.set_defaults(run=run_show)


def _entries() -> list[dict]:
    import os
    from hkgpu_tune.core.profile import NODE_FILE, PERSIST_FILE, choose_profile, etc_dir, resolve_profile, shipped_profiles

    used = choose_profile(None)
    out = []
    for file, source in ((NODE_FILE, "node"), (PERSIST_FILE, "persist")):
        p = etc_dir() / file
        if os.path.lexists(p):
            out.append({"name": str(p), "source": source, "path": str(p), "in_use": used.path == p})
    for name in shipped_profiles():
        p = resolve_profile(name)
        out.append({"name": name, "source": "shipped", "path": str(p),
                    "in_use": used.source == "default" and used.path == p})
    if used.source == "HKGPU_TUNE_PROFILE":
        for e in out:
            e["in_use"] = e["path"] == str(used.path)
        if not any(e["in_use"] for e in out):
            out.insert(0, {"name": str(used.path), "source": used.source, "path": str(used.path), "in_use": True})
    return out


def _description(path: str) -> str:
    from hkgpu_tune.core.errors import ProfileError
    from hkgpu_tune.core.profile import load_profile
    try:
        return load_profile(path).description
    except ProfileError as e:
        return f"(invalid: {e})"


def run_list(ctx: Context) -> int:
    from rich.text import Text
    from hkgpu_tune.core.report import _table

    rows = _entries()
    for e in rows:
        e["description"] = _description(e["path"])
    if ctx.json:
        ctx.dump({"profiles": rows}, profile=None)
        return EXIT_OK
    t = _table("profiles (* = in use)", [("name", max(len(e["name"]) + 2 for e in rows)), ("source", 8),
                                         ("description", 0)])
    for e in rows:
        t.add_row(Text(("* " if e["in_use"] else "  ") + e["name"]), Text(e["source"]), Text(e["description"]))
    ctx.console.print(t)
    return EXIT_OK


def run_show(ctx: Context) -> int:
    from hkgpu_tune.core.profile import SOURCES, default_profile_path, load_chosen, read_profile_file

    prof = load_chosen(ctx.args.name)   # refused here when it does not parse: the error names file:line
    ctx._profile = prof
    path = str(default_profile_path()) if prof.source == "default" else prof.path
    text = read_profile_file(path, system=prof.source in ("node", "persist"))
    if ctx.json:
        ctx.dump({"path": path, "sections": sorted(prof.sections), "text": text})
    else:
        print(f"# {prof.label} ({SOURCES.get(prof.source, prof.source)}): {path}")
        print(text, end="" if text.endswith("\n") else "\n")
    return EXIT_OK
