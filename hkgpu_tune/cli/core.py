"""hkgpu-tune facts | plan | apply | verify | rollback: one function per command."""
from __future__ import annotations

import json
import sys

from hkgpu_tune.cli.context import EXIT_DRIFT, EXIT_ERROR, EXIT_OK, PROFILE_HELP, Context, nonempty, subsystem_list


def _common(p) -> None:
    p.add_argument("--profile", "-p", type=nonempty, help=PROFILE_HELP)
    p.add_argument("--only", type=subsystem_list,
                   help="comma-separated subsystems (sysctl,link,ethtool,qdisc,firewall,rdma,gpu,mig,mps,"
                        "affinity,triton)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--state-dir", type=nonempty, help="where apply keeps the originals (default /var/lib/hkgpu-tune)")


def add_parser(sub) -> None:
    p = sub.add_parser("facts", help="print the live state")
    _common(p)
    p.set_defaults(run=run_facts)
    p = sub.add_parser("plan", help="list the changes apply would make")
    _common(p)
    p.set_defaults(run=run_plan)
    p = sub.add_parser("verify", help="read back and report drift")
    _common(p)
    p.add_argument("--prometheus", metavar="FILE", help="also write a Prometheus textfile (for node_exporter use `export`: "
                        "a FILE beside a textfile with the same series is refused)")
    p.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report")
    p.add_argument("--probe", action="store_true", help="also send don't-fragment pings to the peers")
    p.set_defaults(run=run_verify)
    p = sub.add_parser("rollback", help="restore the saved originals")
    _common(p)
    p.add_argument("--forget", action="store_true",
                   help="drop the saved originals of targets that are gone (a removed NIC) instead of keeping them")
    _lock_wait(p)
    p.set_defaults(run=run_rollback)
    p = sub.add_parser("apply", help="apply the profile (originals saved first)")
    _common(p)
    p.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    p.add_argument("--persist", action="store_true", help="also make the settings survive a reboot")
    p.add_argument("--root", default="/", help="file-system root for --persist (tests)")
    _lock_wait(p)
    p.set_defaults(run=run_apply)


LOCK_WAIT_S = 30.0


def _lock_wait(p) -> None:
    p.add_argument("--lock-wait", type=float, default=LOCK_WAIT_S, metavar="SECONDS",
                   help=f"wait this long for another apply, rollback or health run to finish (default "
                        f"{LOCK_WAIT_S:g}; 0: refuse at once)")


def _write(path: str, text: str) -> None:
    from hkgpu_tune.core.fsutil import atomic_write
    atomic_write(path, text, mode=0o644)


def run_facts(ctx: Context) -> int:
    facts = ctx.engine.facts()
    if ctx.json:
        ctx.dump({"facts": facts})
    else:
        ctx.header()
        for sub, data in facts.items():
            _print_facts(ctx, sub, data)
    return EXIT_OK


def _flat(prefix: str, v, out: list) -> None:
    """Nested facts as dotted keys with values in the tools' own words (scalar lists joined)."""
    if isinstance(v, dict) and v:
        for k, x in v.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), x, out)
    elif isinstance(v, (list, tuple)) and v and any(isinstance(x, (dict, list, tuple)) for x in v):
        for i, x in enumerate(v):
            _flat(f"{prefix}[{i}]", x, out)
    else:
        out.append((prefix, v))


def _print_facts(ctx: Context, sub: str, data) -> None:
    from rich.text import Text
    from hkgpu_tune.core.report import _key_width, _table, fmt
    rows: list = []
    _flat("", data, rows)
    t = _table(f"facts: {sub}", [("key", _key_width(k for k, _ in rows)), ("value", 0)])
    for k, v in rows:
        t.add_row(Text(k or "-"), Text(fmt(v)))
    ctx.console.print(t)


def run_verify(ctx: Context) -> int:
    from hkgpu_tune.core import report
    args, eng = ctx.args, ctx.engine
    res = eng.verify()
    if args.probe and "link" in eng.by_name:
        res += eng.by_name["link"].probe()
    if args.prometheus:   # refused beside a file with the same series (node_exporter drops duplicates)
        from hkgpu_tune.observe.export import write_textfile
        write_textfile(args.prometheus, report.to_prometheus(res))
    if args.junit:
        _write(args.junit, report.to_junit(res))
    if ctx.json:
        ctx.dump(report.results_doc(res))
    else:
        ctx.header()
        report.print_table(res, ctx.console)
    return report.exit_code(res)


def run_plan(ctx: Context) -> int:
    from hkgpu_tune.core import report
    changes, res = ctx.engine.plan()
    if ctx.json:
        ctx.dump(report.results_doc(res, {"changes": [c.to_dict() for c in changes]}))
    else:
        ctx.header()
        report.print_changes(changes, res, ctx.console)
    return EXIT_OK if not [r for r in res if r.failed] else EXIT_DRIFT


def run_apply(ctx: Context) -> int:
    from hkgpu_tune.core import report
    if ctx.args.dry_run:
        return run_plan(ctx)
    eng = ctx.engine
    eng.state.lock_wait_s = max(0.0, ctx.args.lock_wait)
    if ctx.args.persist:   # what persist would refuse is refused before anything changes
        from hkgpu_tune.tune.persist import precheck
        precheck(eng)
    rep = eng.apply()
    persisted = []
    if not rep.error and ctx.args.persist:
        from hkgpu_tune.tune.persist import persist
        persisted = persist(eng, ctx.args.root, profile_path=ctx.profile.path)
    if ctx.json:
        ctx.dump(report.results_doc(rep.results, {"changes": [c.to_dict() for c in rep.changes],
                                                  "error": rep.error, "rolled_back": rep.rolled_back,
                                                  "persisted": persisted, "notes": rep.notes}))
    else:
        ctx.header()
        con = ctx.console
        report.print_changes(rep.changes, (), con, title="applied" if not rep.error else "attempted")
        if rep.error:
            # the report on stdout, the error on stderr: one whole line
            print(f"error: {' '.join(str(rep.error).split())}" + (" (rolled back)" if rep.rolled_back else ""),
                  file=sys.stderr)
        else:
            for n in rep.notes:
                ctx.line(f"note: {' '.join(n.split())}")
            for p in persisted:
                ctx.line(f"persisted: {p}")
            report.print_table(rep.results, con)
    if rep.error:
        return EXIT_ERROR
    return report.exit_code(rep.results)


def run_rollback(ctx: Context) -> int:
    from hkgpu_tune.tune.engine import Engine
    from hkgpu_tune.core.errors import ProfileError
    from hkgpu_tune.core.profile import Profile
    from hkgpu_tune.core.report import fmt
    try:
        profile = ctx.profile
    except ProfileError as e:
        # rollback needs only the saved originals: a broken profile must not block it
        print(f"hkgpu-tune: warning: {e} (rolling back from the state file alone)", file=sys.stderr)
        profile = ctx._profile = Profile(path="(none)", source="none")
    only = ctx.only()
    # every subsystem stays loadable: --only narrows what is restored (and may name "persist")
    eng = ctx._engine = Engine(profile, state_dir=ctx.args.state_dir)
    eng.state.lock_wait_s = max(0.0, ctx.args.lock_wait)
    rep = eng.rollback(only=only, forget=ctx.args.forget)
    if ctx.json:
        ctx.dump({"restored": [c.to_dict() for c in rep.restored], "files": rep.files,
                  "kept": [c.to_dict() for c in rep.kept], "forgotten": rep.forgotten,
                  "errors": rep.errors})
    else:
        ctx.header()
        for f in rep.files:
            ctx.line(f)
        if not rep.restored and not rep.errors and not rep.forgotten:
            ctx.line(f"nothing to roll back (no saved originals in {eng.state.dir}"
                     + (f" for {','.join(only)})" if only else ")"))
        for c in rep.restored:
            if c.subsystem != "persist":
                ctx.line(f"restored {c.subsystem} {c.target} {c.key} = {fmt(c.current)}")
        for f in rep.forgotten:
            ctx.line(("forgotten:", "yellow"), f" {f}")
        for e in rep.errors:
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        if rep.kept_files:
            print(f"hkgpu-tune: {len(rep.kept_files)} path(s) kept as they are (changed since hkgpu-tune wrote "
                  "them): the host is not as it was before apply; see the 'kept' lines", file=sys.stderr)
    if rep.errors:
        return EXIT_ERROR
    return EXIT_DRIFT if rep.kept_files else EXIT_OK
