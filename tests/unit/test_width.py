"""Every command's report in a pipe (no terminal, no $COLUMNS, as a timer's journal or CI sees it):
at most 80 columns, no trailing blanks, no colour codes, and the same table as on an 80-column
terminal (a real pseudo-terminal, rich reading its size)."""
from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import tempfile
import termios

import pytest

from hkgpu_tune.core import report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from tests.baseline import snapshots as S  # noqa: E402

EXAMPLE = os.path.join(ROOT, "docs", "examples", "triton-resnet50.yaml")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def env(**extra):
    e = {k: v for k, v in os.environ.items() if k not in ("HKGPU_TUNE_PROFILE", "COLUMNS", "LINES")}
    e.update({"HKGPU_TUNE_ETC_DIR": "/nonexistent-hkgpu-etc", "PYTHONPATH": ROOT}, **extra)
    return e


def piped(argv, **extra):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *argv], capture_output=True, text=True,
                          env=env(**extra), cwd=ROOT, timeout=180)


def on_tty(argv, cols=80):
    """The command's stdout on a pseudo-terminal of `cols` columns (colour codes removed)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    p = subprocess.Popen([sys.executable, "-m", "hkgpu_tune", *argv], stdout=slave, stderr=subprocess.DEVNULL,
                         stdin=subprocess.DEVNULL, env=env(TERM="xterm-256color"), cwd=ROOT)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:   # EIO: the child closed its end
            break
        if not chunk:
            break
        out += chunk
    p.wait(timeout=180)
    os.close(master)
    return ANSI.sub("", out.decode().replace("\r\n", "\n"))


def commands(tmp_path) -> dict[str, list[str]]:
    st = ["--state-dir", str(tmp_path / "state")]
    before = S.write(tmp_path / "before.json", S.snapshot())
    after = S.write(tmp_path / "after.json", S.snapshot(tput_scale=0.5, rtt_scale=3.0))
    prom = tempfile.mkdtemp(prefix="prom", dir="/tmp")   # a short path, as node_exporter's own
    return {
        "verify": ["verify", *st],
        "verify example": ["verify", "-p", EXAMPLE, *st],
        "plan": ["plan", *st],
        "apply --dry-run": ["apply", "--dry-run", "-p", EXAMPLE, *st],
        "facts": ["facts", *st],
        "rollback": ["rollback", *st],
        "mps status": ["mps", "status", "-p", EXAMPLE],
        "placement": ["placement", "--gpu", "0"],
        "profiles list": ["profiles", "list"],
        "profiles show": ["profiles", "show", "hk-latency"],
        "health": ["health", "--no-hooks", *st],
        "export": ["export", "--textfile-dir", prom, *st],
        "baseline compare": ["baseline", "compare", before, after],
    }


def check_lines(name, text):
    assert text.strip(), name
    assert not ANSI.search(text), (name, "colour codes in a pipe")
    wide = [ln for ln in text.splitlines() if len(ln) > 80]
    assert not wide, (name, wide)
    blank = [ln for ln in text.splitlines() if ln != ln.rstrip()]
    assert not blank, (name, "trailing blanks", blank[:3])


@pytest.mark.parametrize("columns", [None, "200"])
@pytest.mark.slow
def test_every_report_in_a_pipe_fits_80_columns(tmp_path, columns):
    extra = {"COLUMNS": columns} if columns else {}
    for name, argv in commands(tmp_path).items():
        p = piped(argv, **extra)
        assert p.returncode in (0, 2), (name, p.stderr)
        check_lines(name, p.stdout)


def words(text):
    return [w for w in text.split() if not set(w) <= set("─━-")]


@pytest.mark.parametrize("name", ["verify", "plan", "profiles list", "baseline compare", "health"])
def test_a_pipe_gets_the_same_table_as_an_80_column_terminal(tmp_path, name):
    argv = commands(tmp_path)[name]
    tty = on_tty(argv)
    pipe = piped(argv).stdout
    assert words(tty) and words(tty) == words(pipe), (tty, pipe)
    assert pipe.splitlines() == [ln.rstrip() for ln in tty.splitlines()]


def test_long_reasons_wrap_at_words():
    reason = ("qdisc fq_codel is unsupported by this kernel (sch_fq_codel missing: No such file or "
              "directory); load the module or choose another qdisc")
    res = [report.Result("qdisc", "enp59s0f0np0", "root", "pfifo_fast", "fq_codel", report.UNSUPPORTED, reason)]
    buf = io.StringIO()
    report.print_table(res, report.make_console(file=buf))
    out = buf.getvalue()
    check_lines("table", out)
    # every word of the reason is whole on some line: wrapped at spaces, never folded inside a word
    for w in reason.split():
        assert re.search(rf"(^|\s){re.escape(w)}(\s|$)", out, re.M), (w, out)


def test_rack_summary_and_host_lines_fit(tmp_path):
    from hkgpu_tune.fleet import rack
    run = rack.RackRun("site.yml", 2, "failed", 12.5, {})
    for i in range(3):
        r = rack.HostResult(host=f"gpu-node-hk-tko-a01-{i:02d}.example.internal")
        r.failed, r.state = 1, "failed"
        r.failures = [{"subsystem": "sysctl", "target": "host", "key": "net.ipv4.tcp_rmem",
                       "current": "4096 131072 6291456", "desired": "4096 87380 268435456", "status": "drift"}]
        run.hosts[r.host] = r
    buf = io.StringIO()
    report.make_console(file=buf).print(rack.summary_table(run))
    check_lines("rack summary", buf.getvalue())
    for r in run.hosts.values():
        check_lines("host line", report.wrap(rack.host_line(r)) + "\n")
        assert " ".join(report.wrap(rack.host_line(r)).split()) == " ".join(rack.host_line(r).split())
