"""hkgpu-tune completion bash|zsh|tcsh and hkgpu-tune man: both generated from the parser itself.

    hkgpu-tune completion bash > /etc/bash_completion.d/hkgpu-tune
    hkgpu-tune man > /usr/local/share/man/man1/hkgpu-tune.1

Completion scripts are static (shtab writes them once; nothing runs at each TAB press). The man
page is roff written here from argparse's own actions, so it never lags behind --help.
"""
from __future__ import annotations

import argparse
import time

from hkgpu_tune.cli.context import EXIT_OK, Context


def add_parser(sub) -> None:
    p = sub.add_parser("completion", help="print a shell completion script (static, from the parser)")
    p.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    p.set_defaults(run=run_completion)
    p = sub.add_parser("man", help="print the man page (roff, from the parser)")
    p.set_defaults(run=run_man)


def _full_parser() -> argparse.ArgumentParser:
    from hkgpu_tune.cli import parser
    return parser([])   # no command named: every group is added


def run_completion(ctx: Context) -> int:
    from hkgpu_tune.core.errors import HkError
    try:
        import shtab
    except ImportError:
        raise HkError("shell completion needs shtab: pip install shtab") from None
    print(shtab.complete(_full_parser(), shell=ctx.args.shell), end="")
    return EXIT_OK


def run_man(ctx: Context) -> int:
    print(manpage(_full_parser()), end="")
    return EXIT_OK


# ---------------------------------------------------------------- roff
def _esc(s: str) -> str:
    s = str(s).replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + ln if ln[:1] in (".", "'") else ln for ln in s.split("\n"))


def _subparsers(p: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    out = []
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            helps = {c.dest: c.help or "" for c in a._choices_actions}
            out += [(name, helps.get(name, ""), sp) for name, sp in a.choices.items()]
    return out


def _options(p: argparse.ArgumentParser) -> list[str]:
    lines = []
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if a.option_strings:
            flag = ", ".join(a.option_strings)
            if a.nargs != 0:
                flag += " " + (a.metavar or a.dest.upper())
        else:
            flag = a.metavar or (("{" + ",".join(a.choices) + "}") if a.choices else a.dest)
        lines += [".TP", f"\\fB{_esc(flag)}\\fR", _esc(a.help or "")]
    return lines


def _section(path: str, p: argparse.ArgumentParser, help_text: str, out: list) -> None:
    subs = _subparsers(p)
    if not subs or any(a.option_strings and not isinstance(a, argparse._HelpAction) for a in p._actions):
        out += [".SS " + _esc(path), _esc(help_text)] if help_text else [".SS " + _esc(path)]
        usage = " ".join(p.format_usage().split())
        out += [".PP", f"\\fI{_esc(usage.removeprefix('usage: '))}\\fR"]
        out += _options(p)
        if p.epilog:
            out += [".PP", ".nf", _esc(p.epilog), ".fi"]
    for name, h, sp in subs:
        _section(f"{path} {name}", sp, h, out)


def manpage(p: argparse.ArgumentParser) -> str:
    from hkgpu_tune import __version__
    date = time.strftime("%Y-%m-%d", time.gmtime())
    out = [f'.TH HKGPU\\-TUNE 1 "{date}" "hkgpu-tune {_esc(__version__)}" "User Commands"',
           ".SH NAME", "hkgpu\\-tune \\- " + _esc(p.description or ""),
           ".SH SYNOPSIS", "\\fBhkgpu\\-tune\\fR \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
           ".SH DESCRIPTION", _esc(p.description or ""), ".SH COMMANDS"]
    for name, h, sp in _subparsers(p):
        _section(name, sp, h, out)
    if p.epilog:
        out += [".SH NOTES", ".nf", _esc(p.epilog), ".fi"]
    return "\n".join(out) + "\n"
