"""hkgpu-tune facts | plan | apply | verify | rollback. Exit codes: 0 ok, 1 error, 2 drift."""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import __version__
from .errors import HkError

EXIT_OK, EXIT_ERROR, EXIT_DRIFT = 0, 1, 2

# further commands live in their own modules: each has add_parser(subparsers) and run(args) -> int
EXTRA_COMMANDS = ["hkgpu_tune.rack", "hkgpu_tune.triton_cli", "hkgpu_tune.gpu_cli"]


def _extras():
    import importlib
    mods = []
    for name in EXTRA_COMMANDS:
        try:
            mods.append(importlib.import_module(name))
        except ImportError:
            continue
    return mods


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", "-p", help="profile file or shipped profile name (default: hk-inference)")
    p.add_argument("--only", help="comma-separated subsystems (sysctl,link,ethtool,qdisc,gpu,mps,affinity,triton)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--state-dir", help="where apply keeps the originals (default /var/lib/hkgpu-tune)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="hkgpu-tune", description="Tune, verify and roll back GPU inference hosts.")
    ap.add_argument("--version", action="version", version=f"hkgpu-tune {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, helptext in (("facts", "print the live state"), ("plan", "list the changes apply would make"),
                           ("verify", "read back and report drift"), ("rollback", "restore the saved originals")):
        p = sub.add_parser(name, help=helptext)
        _common(p)
        if name == "verify":
            p.add_argument("--prometheus", metavar="FILE", help="also write a Prometheus textfile")
            p.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report")
            p.add_argument("--probe", action="store_true", help="also send don't-fragment pings to the peers")
    p = sub.add_parser("apply", help="apply the profile (originals saved first)")
    _common(p)
    p.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    p.add_argument("--persist", action="store_true", help="also make the settings survive a reboot")
    p.add_argument("--root", default="/", help="file-system root for --persist (tests)")
    for mod in _extras():
        mod.add_parser(sub)
    return ap


def _only(args):
    return [s.strip() for s in args.only.split(",") if s.strip()] if args.only else None


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def run(argv=None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "extra_run", None):
        return args.extra_run(args)
    from . import report
    from .engine import Engine
    from .profile import load_profile

    if args.json:
        con = None  # rich is not needed for JSON: keep the command fast
    else:
        from rich.console import Console
        # into a log or the journal (no terminal): wide rows, so a key stays on one line for grep
        wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
        con = Console(stderr=False, soft_wrap=False, width=200 if wide else None)
    from .errors import ProfileError
    from .profile import Profile
    try:
        profile = load_profile(args.profile)
    except ProfileError as e:
        if args.cmd != "rollback":
            raise
        # rollback needs only the saved originals: a broken profile must not block it
        print(f"hkgpu-tune: warning: {e} (rolling back from the state file alone)", file=sys.stderr)
        profile = Profile(path="(none)")
    eng = Engine(profile, only=_only(args), state_dir=args.state_dir)
    try:
        if args.cmd == "facts":
            facts = eng.facts()
            if args.json:
                print(json.dumps(facts, indent=2, default=str))
            else:
                con.print_json(json.dumps(facts, default=str))
            return EXIT_OK

        if args.cmd == "verify":
            res = eng.verify()
            if args.probe and "link" in eng.by_name:
                res += eng.by_name["link"].probe()
            if args.prometheus:
                _write(args.prometheus, report.to_prometheus(res))
            if args.junit:
                _write(args.junit, report.to_junit(res))
            if args.json:
                print(report.to_json(res))
            else:
                report.print_table(res, con)
            return report.exit_code(res)

        if args.cmd == "plan" or (args.cmd == "apply" and args.dry_run):
            changes, res = eng.plan()
            if args.json:
                print(report.to_json(res, {"changes": [c.to_dict() for c in changes]}))
            else:
                report.print_changes(changes, res, con)
            return EXIT_OK if not [r for r in res if r.failed] else EXIT_DRIFT

        if args.cmd == "apply":
            rep = eng.apply()
            persisted = []
            if not rep.error and args.persist:
                from .persist import persist
                persisted = persist(eng, args.root, profile_path=profile.path)
            if args.json:
                print(report.to_json(rep.results, {"changes": [c.to_dict() for c in rep.changes],
                                                   "error": rep.error, "rolled_back": rep.rolled_back,
                                                   "persisted": persisted}))
            else:
                report.print_changes(rep.changes, (), con, title="applied" if not rep.error else "attempted")
                if rep.error:
                    con.print(f"[red]error:[/] {rep.error}" + (" (rolled back)" if rep.rolled_back else ""))
                else:
                    for p in persisted:
                        con.print(f"persisted: {p}")
                    report.print_table(rep.results, con)
            if rep.error:
                return EXIT_ERROR
            return report.exit_code(rep.results)

        if args.cmd == "rollback":
            restored, errs = eng.rollback()
            from .persist import unpersist
            files = unpersist(eng.state.dir)
            if args.json:
                print(json.dumps({"restored": [c.to_dict() for c in restored], "files": files, "errors": errs},
                                 indent=2, default=str))
            else:
                for f in files:
                    con.print(f)
                if not restored and not files:
                    con.print(f"nothing to roll back (no saved originals in {eng.state.dir})")
                for c in reversed(restored):
                    con.print(f"restored {c.subsystem} {c.target} {c.key} = {c.current}")
                for e in errs:
                    con.print(f"[red]error:[/] {e}")
            return EXIT_ERROR if errs else EXIT_OK
    finally:
        eng.b.close()
    return EXIT_ERROR


def main(argv=None) -> None:
    try:
        code = run(argv)
    except HkError as e:
        print(f"hkgpu-tune: error: {e}", file=sys.stderr)
        code = EXIT_ERROR
    except KeyboardInterrupt:
        code = 130
    except OSError as e:  # an answer from the kernel we did not map: one line, keep the errno
        print(f"hkgpu-tune: error: {e.__class__.__name__}: {e}", file=sys.stderr)
        code = EXIT_ERROR
    except Exception as e:  # noqa: BLE001 - pyroute2's NetlinkError is not an OSError
        if type(e).__name__ != "NetlinkError":
            raise
        print(f"hkgpu-tune: error: netlink: {e}", file=sys.stderr)
        code = EXIT_ERROR
    sys.exit(code)
