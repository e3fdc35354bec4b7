"""hkgpu-tune facts | plan | apply | verify | rollback | mps | placement | triton | rack.

Exit codes: 0 ok, 1 error, 2 drift. Each command group is one module here with add_parser(sub);
each command sets `run`, a function of the shared Context returning the exit code."""
from __future__ import annotations

import argparse
import sys

from .. import __version__, rack
from ..errors import HkError
from . import core, gpu, triton
from .context import EXIT_DRIFT, EXIT_ERROR, EXIT_OK, Context

__all__ = ["main", "run", "parser", "EXIT_OK", "EXIT_ERROR", "EXIT_DRIFT"]


def _run_rack(ctx: Context) -> int:
    return rack.cli_run(ctx.args)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="hkgpu-tune", description="Tune, verify and roll back GPU inference hosts.")
    ap.add_argument("--version", action="version", version=f"hkgpu-tune {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    core.add_parser(sub)
    gpu.add_parser(sub)
    triton.add_parser(sub)
    rack.add_parser(sub)
    sub.choices["rack"].set_defaults(run=_run_rack)
    return ap


def run(argv=None) -> int:
    args = parser().parse_args(argv)
    ctx = Context(args)
    try:
        return args.run(ctx)
    finally:
        ctx.close()


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
