"""Conventions every command keeps, checked over the whole parser and the CLI's source: --json
on each command, JSON printed only through report.envelope, an example and the exit codes in
--help, a man page and completion scripts that name every command, a cheap start-up."""
from __future__ import annotations

import argparse
import ast
import glob
import os
import shutil
import subprocess
import sys

import pytest

from hkgpu_tune.cli import parser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# commands whose output is a script or a page, not a report; a server that runs until stopped
NO_JSON = {"completion", "man", "baseline serve"}


def leaves(p: argparse.ArgumentParser, path=()):
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), p
    for a in subs:
        for name, sp in a.choices.items():
            yield from leaves(sp, path + (name,))


def test_every_command_takes_json():
    missing = [name for name, p in leaves(parser([]))
               if name not in NO_JSON and name.split()[0] not in NO_JSON
               and not any("--json" in a.option_strings for a in p._actions)]
    assert not missing, missing


def test_every_top_level_command_has_an_example_and_the_exit_codes():
    sub = next(a for a in parser([])._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        assert p.epilog and "example:\n  hkgpu-tune " in p.epilog and "exit codes:" in p.epilog, name


def _printed_json_not_enveloped(path: str) -> list[str]:
    tree = ast.parse(open(path).read(), path)
    bad = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print" and node.args):
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Call) and getattr(arg.func, "attr", None) == "dumps":
            inner = arg.args[0] if arg.args else None
            name = getattr(getattr(inner, "func", None), "attr", None) or getattr(getattr(inner, "func", None), "id", None)
            if name != "envelope":
                bad.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    return bad


def test_json_is_printed_only_inside_the_envelope():
    files = glob.glob(os.path.join(ROOT, "hkgpu_tune", "cli", "*.py")) + [os.path.join(ROOT, "hkgpu_tune", "fleet", "rack.py"), os.path.join(ROOT, "hkgpu_tune", "fleet", "baseline_rack.py")]
    bad = [b for f in files for b in _printed_json_not_enveloped(f)]
    assert not bad, f"print(json.dumps(...)) without report.envelope: {bad}"


def test_the_check_catches_a_bare_dump(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("import json\nprint(json.dumps({'a': 1}))\nprint(json.dumps(envelope('c', {})))\n")
    assert _printed_json_not_enveloped(str(f)) == [f"{os.path.relpath(f, ROOT)}:2"]


def hk(*args):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_man_page_names_every_command():
    p = hk("man")
    assert p.returncode == 0 and p.stdout.startswith(".TH HKGPU\\-TUNE 8 ")   # section 8: system administration
    for name, _ in leaves(parser([])):
        assert f".SS {name}".replace("-", "\\-") in p.stdout, name
    assert "exit codes:" in p.stdout
    if shutil.which("groff"):
        r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z"], input=p.stdout, capture_output=True, text=True)
        assert r.returncode == 0 and r.stderr == "", r.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_script_names_every_command(shell):
    pytest.importorskip("shtab", reason="completion scripts are written by shtab (pip install shtab)")
    p = hk("completion", shell)
    assert p.returncode == 0, p.stderr
    sub = next(a for a in parser([])._actions if isinstance(a, argparse._SubParsersAction))
    for name in sub.choices:
        assert name in p.stdout, name
    if shell == "bash":
        assert "--skip-tags" in p.stdout and "--only" in p.stdout
        r = subprocess.run(["bash", "-n"], input=p.stdout, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_a_report_does_not_load_the_doc_tools(tmp_path):
    """The parser of every command is built only for --help and errors; a run imports only its own
    group, and --json never imports rich or shtab."""
    prof = tmp_path / "p.yaml"
    prof.write_text("sysctl:\n  kernel.ostype: Linux\n")
    code = ("import sys\nfrom hkgpu_tune.cli import run\nrc = run(['verify', '--json', '-p', sys.argv[1]])\n"
            "print(sorted(m for m in ('rich', 'shtab', 'hkgpu_tune.cli.meta', 'hkgpu_tune.cli.triton', "
            "'hkgpu_tune.fleet.rack') if m in sys.modules), file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code, str(prof)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip() == "[]"
