"""The man page and the shell completion as installed (scripts/install-docs.sh into a staging root):
man(1) finds the page in section 8, groff renders it without a warning, it has EXIT STATUS,
ENVIRONMENT, FILES and SEE ALSO; bash completes files, profile names and --only values."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMANDS = ("facts", "plan", "verify", "apply", "rollback", "mps", "placement", "triton", "rack", "health",
            "export", "profiles", "completion", "man", "baseline")


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    root = tmp_path_factory.mktemp("stage")
    env = {**os.environ, "DESTDIR": str(root), "PREFIX": "/usr/local", "PYTHONPATH": ROOT}
    p = subprocess.run([os.path.join(ROOT, "scripts", "install-docs.sh"), sys.executable], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    return root / "usr" / "local" / "share"


@pytest.mark.skipif(not shutil.which("groff"), reason="needs groff (Debian's groff-base)")
def test_the_page_renders_without_warnings(staged):
    page = staged / "man" / "man8" / "hkgpu-tune.8"
    p = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(page)], capture_output=True, text=True)
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr
    text = subprocess.run(["groff", "-man", "-Tutf8", "-P-cbou", str(page)], capture_output=True, text=True,
                          env={**os.environ, "MANWIDTH": "80"}).stdout
    assert text.startswith("HKGPU-TUNE(8)")
    heads = [ln for ln in text.splitlines() if ln[:1].isupper() and ln == ln.upper() and ln.strip()]
    for h in ("NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "EXIT STATUS", "ENVIRONMENT", "FILES", "SEE ALSO"):
        assert h in heads, (h, heads)
    assert heads.index("EXIT STATUS") < heads.index("ENVIRONMENT") < heads.index("FILES") < heads.index("SEE ALSO")
    for c in COMMANDS:
        assert f"\n   {c}" in text or f"\n       {c}" in text, c
    for var in ("HKGPU_TUNE_PROFILE", "HKGPU_TUNE_STATE_DIR", "HKGPU_TUNE_TEXTFILE_DIR"):
        assert var in text, var


@pytest.mark.skipif(not shutil.which("man"), reason="needs man-db")
def test_man_finds_it_in_section_8(staged):
    env = {**os.environ, "MANPATH": str(staged / "man"), "MANWIDTH": "80", "MAN_KEEP_FORMATTING": "0"}
    w = subprocess.run(["man", "-w", "8", "hkgpu-tune"], capture_output=True, text=True, env=env)
    assert w.returncode == 0 and w.stdout.strip() == str(staged / "man" / "man8" / "hkgpu-tune.8"), w.stderr
    p = subprocess.run(["man", "--warnings", "8", "hkgpu-tune"], capture_output=True, text=True, env=env)
    out = re.sub(".\x08", "", p.stdout)    # overstrike bold, as man writes it into a pipe
    assert p.returncode == 0 and "EXIT STATUS" in out and not p.stderr.strip(), p.stderr


def complete(script, *words) -> list[str]:
    """Run the installed bash completion as bash would at a TAB after `words`."""
    ws = " ".join(f"'{w}'" for w in words)
    prog = (f"source '{script}'; COMP_WORDS=({ws}); COMP_CWORD=$((${{#COMP_WORDS[@]}}-1)); "
            'COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}; COMPREPLY=(); '
            '_shtab_hkgpu_tune hkgpu-tune "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}"; printf "%s\\n" "${COMPREPLY[@]}"')
    p = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return [ln for ln in p.stdout.splitlines() if ln]


def test_bash_completes_profiles_only_and_files(staged, tmp_path):
    script = staged / "bash-completion" / "completions" / "hkgpu-tune"
    assert complete(script, "hkgpu-tune", "verify", "--only", "sysctl,li") == ["sysctl,link"]
    assert set(complete(script, "hkgpu-tune", "plan", "--only", "")) >= {"sysctl", "ethtool", "gpu", "triton"}
    assert {"hk-inference", "hk-latency"} <= set(complete(script, "hkgpu-tune", "apply", "--profile", "hk-"))
    (tmp_path / "rack-a.yaml").write_text("name: a\n")
    assert complete(script, "hkgpu-tune", "verify", "-p", str(tmp_path / "rack")) == [str(tmp_path / "rack-a.yaml")]
    assert complete(script, "hkgpu-tune", "verify", "--junit", str(tmp_path / "rack")) == [str(tmp_path / "rack-a.yaml")]
    (tmp_path / "textfiles").mkdir()
    assert complete(script, "hkgpu-tune", "export", "--textfile-dir", str(tmp_path / "textf")) == [
        str(tmp_path / "textfiles")]
    assert complete(script, "hkgpu-tune", "profiles", "show", "hk-l") == ["hk-latency"]
    assert "export" in complete(script, "hkgpu-tune", "ex")


def test_zsh_script_names_the_same_completers(staged):
    text = (staged / "zsh" / "site-functions" / "_hkgpu-tune").read_text()
    assert "_values -s , subsystem sysctl link" in text and "shipped profile:(hk-inference" in text
    assert "_files" in text and "_files -/" in text
