"""hkgpu-tune completion bash|zsh|tcsh and hkgpu-tune man: both generated from the parser itself.

    hkgpu-tune completion bash > /usr/share/bash-completion/completions/hkgpu-tune
    hkgpu-tune man > /usr/local/share/man/man8/hkgpu-tune.8

Completion scripts are static (shtab writes them once; nothing runs at each TAB press): files and
directories where an option takes one, the shipped profile names beside files for --profile, the
subsystem names (comma-separated) for --only. The man page (section 8: it tunes the host, as root)
is roff written here from argparse's own actions, so it never lags behind --help.
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


# options that take a file or a directory, by dest (the rest of the options take words)
FILES = {"prometheus", "junit", "png", "out", "output", "inventory", "model_file", "before", "after",
         "snapshot", "snapshots", "file", "files", "path"}
DIRS = {"state_dir", "textfile_dir", "root", "dir", "model_repository", "run_dir", "dest"}


def _completers(shipped: list[str]) -> tuple[dict, dict, dict]:
    """(profile, only, preamble): shtab's per-shell completion of --profile and --only."""
    names = " ".join(shipped)
    from hkgpu_tune import subsystems
    subs = " ".join([*subsystems.ORDER, "persist"])   # --only: the registered subsystems and persist's files
    bash = (f"_shtab_hkgpu_tune_profile_file() {{ compgen -f -- \"$1\"; compgen -W \"{names}\" -- \"$1\"; }}\n"
            "_shtab_hkgpu_tune_only() {\n"
            "  local cur=\"$1\" pre=\"\"\n"
            "  [[ $cur == *,* ]] && pre=\"${cur%,*},\"\n"
            f"  compgen -P \"$pre\" -W \"{subs}\" -- \"${{cur##*,}}\"\n"
            "}\n")
    profile = {"bash": "_shtab_hkgpu_tune_profile_file",
               "zsh": f"_alternative 'files:profile file:_files' 'names:shipped profile:({names})'"}
    only = {"bash": "_shtab_hkgpu_tune_only", "zsh": f"_values -s , subsystem {subs}"}
    return profile, only, {"bash": bash}


def _complete(p: argparse.ArgumentParser, shtab, profile: dict, only: dict) -> None:
    """Mark each action of the parser and its subparsers with what it completes."""
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sp in a.choices.values():
                _complete(sp, shtab, profile, only)
            continue
        if a.choices or a.nargs == 0:
            continue
        if a.dest == "profile" or (a.dest == "name" and not a.option_strings):
            a.complete = profile
        elif a.dest == "only":
            a.complete = only
        elif a.dest in DIRS or (a.metavar or "") == "DIR":
            a.complete = shtab.DIRECTORY
        elif a.dest in FILES or (a.metavar or "") in ("FILE", "PATH"):
            a.complete = shtab.FILE


def run_completion(ctx: Context) -> int:
    from hkgpu_tune.core.errors import HkError
    from hkgpu_tune.core.profile import shipped_profiles
    try:
        import shtab
    except ImportError:
        raise HkError("shell completion needs shtab: pip install shtab") from None
    p = _full_parser()
    profile, only, preamble = _completers(shipped_profiles())
    _complete(p, shtab, profile, only)
    print(shtab.complete(p, shell=ctx.args.shell, preamble=preamble), end="")
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


EXIT_STATUS = [("0", "ok: every setting as the profile says, the command did what it was asked"),
               ("1", "error: a bad profile or usage, no permission, a failed apply (one line on "
                     "standard error)"),
               ("2", "drift: a setting differs, a required setting is unsupported, or a service is "
                     "degraded")]
ENVIRONMENT = [
    ("HKGPU_TUNE_PROFILE", "the profile to use when --profile is not given"),
    ("HKGPU_TUNE_STATE_DIR", "where apply keeps the originals (default /var/lib/hkgpu-tune)"),
    ("HKGPU_TUNE_HOST_DIR", "the host lock and registry of journals, one per host whatever state directory "
                            "a run names (default /var/lib/hkgpu-tune; only for simulated hosts sharing a kernel)"),
    ("HKGPU_TUNE_TEXTFILE_DIR", "node_exporter's textfile directory for export "
                                "(default /var/lib/prometheus/node-exporter)"),
    ("HKGPU_TUNE_ETC_DIR", "the directory of node.yaml and profile.yaml (default /etc/hkgpu-tune)"),
    ("HKGPU_TUNE_ANSIBLE_DIR", "the playbooks and roles rack runs (default: those inside the package)"),
    ("HKGPU_TUNE_DEBUG", "1 prints the traceback of an internal error"),
    ("COLUMNS", "the width of a report that is not on a terminal (at most 80, the default)"),
]
FILES = [
    ("/etc/hkgpu-tune/node.yaml", "the node's profile, written by the Ansible roles"),
    ("/etc/hkgpu-tune/profile.yaml", "the profile apply --persist keeps for the boot unit"),
    ("/var/lib/hkgpu-tune/", "saved originals and the journal of apply (rollback reads them)"),
    ("/var/lib/hkgpu-tune/host.lock", "the host lock: one apply, rollback, persist or health run at a time, "
                                      "whatever state directory each names"),
    ("/var/lib/hkgpu-tune/journals.json", "the state directories whose journal holds entries (a setting lives "
                                          "in one of them)"),
    ("/var/lib/prometheus/node-exporter/hkgpu-tune.prom", "the textfile export writes (one writer: "
                                                          "a second file with the same series is refused)"),
    ("/etc/systemd/system/hkgpu-tune.service", "re-applies the persisted profile at boot"),
]
SEE_ALSO = ["sysctl(8)", "ethtool(8)", "tc(8)", "ip(8)", "nvidia-smi(1)", "systemd.timer(5)",
            "ansible-playbook(1)", "prometheus-node-exporter(1)"]


def _pairs(rows) -> list[str]:
    out = []
    for k, v in rows:
        out += [".TP", f"\\fB{_esc(k)}\\fR", _esc(v)]
    return out


def manpage(p: argparse.ArgumentParser) -> str:
    """Section 8 (system administration: it tunes the host as root); NAME, SYNOPSIS, DESCRIPTION,
    COMMANDS from the parser, then EXIT STATUS, ENVIRONMENT, FILES, NOTES and SEE ALSO."""
    import os
    from hkgpu_tune.core.version import __version__
    when = int(os.environ.get("SOURCE_DATE_EPOCH", "0") or 0) or time.time()   # reproducible builds
    date = time.strftime("%Y-%m-%d", time.gmtime(when))
    out = [f'.TH HKGPU\\-TUNE 8 "{date}" "hkgpu-tune {_esc(__version__)}" "System Administration"',
           ".SH NAME", "hkgpu\\-tune \\- " + _esc(p.description or ""),
           ".SH SYNOPSIS", "\\fBhkgpu\\-tune\\fR \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
           ".SH DESCRIPTION", _esc(p.description or ""), ".SH COMMANDS"]
    for name, h, sp in _subparsers(p):
        _section(name, sp, h, out)
    out += [".SH EXIT STATUS"] + _pairs(EXIT_STATUS)
    out += [".SH ENVIRONMENT"] + _pairs(ENVIRONMENT)
    out += [".SH FILES"] + _pairs(FILES)
    if p.epilog:
        out += [".SH NOTES", ".nf", _esc(p.epilog), ".fi"]
    out += [".SH SEE ALSO", ", ".join(f"\\fB{_esc(x.split('(')[0])}\\fR({x.split('(')[1]}" for x in SEE_ALSO)]
    return "\n".join(out) + "\n"
