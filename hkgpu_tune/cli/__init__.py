"""hkgpu-tune facts | plan | apply | verify | rollback | mps | placement | triton | rack | profiles | ...

Exit codes: 0 ok, 1 error (usage errors included), 2 drift. Each command group is one module here
with add_parser(sub); each command sets `run`, a function of the shared Context returning the exit code."""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from hkgpu_tune.core.version import __version__
from hkgpu_tune.core.errors import HkError
from hkgpu_tune.cli import stdio
from hkgpu_tune.cli.context import EXIT_DRIFT, EXIT_ERROR, EXIT_OK, Context

__all__ = ["main", "run", "parser", "EXIT_OK", "EXIT_ERROR", "EXIT_DRIFT", "UsageError"]


class UsageError(HkError):
    pass


class Parser(argparse.ArgumentParser):
    """argparse exits 2 on a usage error, and 2 means drift here: raise instead (main exits 1)."""

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def _add_rack(sub) -> None:
    from hkgpu_tune.fleet import rack
    rack.add_parser(sub)
    sub.choices["rack"].set_defaults(run=_rack_run)


def _rack_run(ctx) -> int:
    if ctx.args.action == "baseline":
        from hkgpu_tune.fleet import baseline_rack
        return baseline_rack.cli_run(ctx.args)
    from hkgpu_tune.fleet import rack
    return rack.cli_run(ctx.args)


def _adder(group: str):
    if group == "rack":
        return _add_rack
    return importlib.import_module(f"{__name__}.{group}").add_parser


# command -> the group that adds it; a run imports only its own group (--help and errors: all of them)
GROUPS = {"facts": "core", "plan": "core", "verify": "core", "rollback": "core", "apply": "core",
          "mps": "gpu", "placement": "gpu", "triton": "triton", "rack": "rack",
          "health": "health", "export": "monitor"}

GROUPS.update({"profiles": "profiles", "completion": "meta", "man": "meta"})
GROUPS["baseline"] = "baseline"   # capture / serve / compare (docs/baseline.md)
GROUPS["mig-env"] = "gpu"         # a service unit's ExecStartPre: a MIG position to its UUID

EXIT_CODES = """exit codes:
  0  ok
  1  error: bad profile or usage, no permission, a failed apply (stderr)
  2  drift, a required setting unsupported, or a degraded service"""

# one example per command for --help (and the man page)
EXAMPLES = {
    "facts": "hkgpu-tune facts --only sysctl,link",
    "plan": "hkgpu-tune plan --profile hk-latency",
    "verify": "hkgpu-tune verify --only sysctl,link --junit verify.xml",
    "apply": "hkgpu-tune apply --persist",
    "rollback": "hkgpu-tune rollback --only sysctl",
    "mps": "hkgpu-tune mps status",
    "placement": "hkgpu-tune placement --gpu 0",
    "mig-env": "hkgpu-tune mig-env mig:0/1 /run/hkgpu-tune/mig-triton.env",
    "triton": "hkgpu-tune triton gate -p /etc/hkgpu-tune/node.yaml",
    "rack": "hkgpu-tune rack verify -i inventory/hk --limit rack_tko_a01 --forks 20",
    "profiles": "hkgpu-tune profiles show hk-latency",
    "completion": "hkgpu-tune completion bash > /usr/share/bash-completion/completions/hkgpu-tune",
    "man": "hkgpu-tune man > /usr/local/share/man/man8/hkgpu-tune.8",
    "health": "hkgpu-tune health --json",
    "export": "hkgpu-tune export --textfile-dir /var/lib/prometheus/node-exporter",
    "baseline": "hkgpu-tune baseline compare before.json after.json --png compare.png",
}


def _epilog(name: str) -> str:
    ex = EXAMPLES.get(name)
    return (f"example:\n  {ex}\n\n" if ex else "") + EXIT_CODES


def parser(argv=None) -> argparse.ArgumentParser:
    ap = Parser(prog="hkgpu-tune", description="Tune, verify and roll back GPU inference hosts.",
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="examples:\n" + "\n".join(f"  {EXAMPLES[c]}" for c in ("verify", "apply", "rack"))
                + "\n\nprofile used: --profile, else $HKGPU_TUNE_PROFILE, else\n"
                  "  /etc/hkgpu-tune/node.yaml, else /etc/hkgpu-tune/profile.yaml, else the\n"
                  "  shipped hk-inference (hkgpu-tune profiles list)\n\n"
                + EXIT_CODES)
    ap.add_argument("--version", action="version", version=f"hkgpu-tune {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser, metavar="COMMAND")
    first = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    for group in [GROUPS[first]] if first in GROUPS else dict.fromkeys(GROUPS.values()):
        _adder(group)(sub)
    for name, p in sub.choices.items():
        if p.epilog is None:
            p.epilog = _epilog(name)
            p.formatter_class = argparse.RawDescriptionHelpFormatter
    return ap


def run(argv=None) -> int:
    args = parser(argv).parse_args(argv)
    ctx = Context(args)
    try:
        return args.run(ctx)
    finally:
        ctx.close()


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split("\n")) or type(e).__name__


def main(argv=None) -> None:
    out = stdio.install()
    try:
        # from here a SIGINT is the KeyboardInterrupt caught below (until now, the command's
        # start-up handler in __main__ ended the run with the same line)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        code = run(argv)
    except HkError as e:
        print(f"hkgpu-tune: error: {_one_line(e)}", file=sys.stderr)
        code = EXIT_ERROR
    except KeyboardInterrupt:
        print("hkgpu-tune: interrupted", file=sys.stderr)
        code = 130
    except SystemExit as e:  # --help and --version print and exit 0
        code = e.code if isinstance(e.code, int) else EXIT_ERROR
    except OSError as e:  # an answer from the kernel we did not map: one line, keep the errno
        print(f"hkgpu-tune: error: {e.__class__.__name__}: {_one_line(e)}", file=sys.stderr)
        code = EXIT_ERROR
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, exit 1
        if type(e).__name__ == "NetlinkError":  # pyroute2's NetlinkError is not an OSError
            print(f"hkgpu-tune: error: netlink: {_one_line(e)}", file=sys.stderr)
        else:
            if os.environ.get("HKGPU_TUNE_DEBUG") == "1":
                import traceback
                traceback.print_exc()
            print(f"hkgpu-tune: internal error: {type(e).__name__}: {_one_line(e)}"
                  + ("" if os.environ.get("HKGPU_TUNE_DEBUG") == "1" else " (HKGPU_TUNE_DEBUG=1 shows the traceback)"),
                  file=sys.stderr)
        code = EXIT_ERROR
    out.flush()
    if out.lost == stdio.CLOSED and out.dropped:
        print("hkgpu-tune: warning: standard output is closed; the report was not printed", file=sys.stderr)
    sys.exit(code)
