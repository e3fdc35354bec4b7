"""The CLI as an adversary uses it: real `python -m hkgpu_tune` processes, closed or broken stdout,
markup in values, empty options, bad usage, unexpected exceptions. Never a traceback."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 60


def hk(*args, stdout=subprocess.PIPE, preexec_fn=None, env=None, code=None):
    argv = [sys.executable, "-m", "hkgpu_tune", *args] if code is None else [sys.executable, "-c", code, *args]
    return subprocess.run(argv, stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=TIMEOUT,
                          preexec_fn=preexec_fn, env={**os.environ, **(env or {})})


def no_traceback(p):
    assert "Traceback" not in p.stderr, p.stderr
    assert "Exception ignored" not in p.stderr, p.stderr


@pytest.fixture
def ok_profile(tmp_path):
    f = tmp_path / "ok.yaml"
    f.write_text("sysctl:\n  kernel.ostype: {value: Linux, compare: exact}\n")
    return str(f)


def _close_stdout():
    os.close(1)


@pytest.mark.parametrize("fmt", [[], ["--json"]], ids=["table", "json"])
def test_closed_stdout(ok_profile, fmt):
    p = hk("verify", "-p", ok_profile, *fmt, stdout=None, preexec_fn=_close_stdout)
    no_traceback(p)
    assert p.returncode == 0  # the verdict stands; only the report is lost
    assert p.stderr == "hkgpu-tune: warning: standard output is closed; the report was not printed\n"


@pytest.mark.parametrize("cmd", [["verify"], ["verify", "--json"], ["facts", "--only", "sysctl"],
                                 ["facts", "--only", "sysctl", "--json"]])
def test_broken_pipe(ok_profile, cmd):
    """The reader is gone before the first write (as after `| head -1`): quiet, the command's own exit code."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = hk(*cmd, "-p", ok_profile, stdout=w)
    finally:
        os.close(w)
    no_traceback(p)
    assert p.stderr == ""
    assert p.returncode == 0


@pytest.mark.slow
def test_head_in_a_shell_pipeline(tmp_path):
    """A report larger than the pipe buffer, cut by `head -1` with pipefail: the verify's exit code (2)."""
    f = tmp_path / "many.yaml"
    f.write_text("sysctl:\n" + "".join(f"  kernel.no_such_key_{i:04d}: {i}\n" for i in range(1500)))
    cmd = f"{sys.executable} -m hkgpu_tune verify -p {f} | head -1"
    p = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, cwd=ROOT,
                       timeout=TIMEOUT)
    no_traceback(p)
    assert p.stderr == "" and p.stdout.count("\n") == 1
    assert p.returncode == 2


def test_markup_in_values_is_printed_literally(tmp_path):
    f = tmp_path / "markup.yaml"
    value = "[red]1[/]:smile:"  # plan and verify only: nothing is written (short: a cell folds at 80 columns)
    # one word: the key holds one value (two words are refused at load)
    f.write_text(f'sysctl:\n  net.ipv4.tcp_mtu_probing: "{value}"\n')
    for cmd in ("verify", "plan"):
        p = hk(cmd, "-p", str(f), env={"COLUMNS": "300"})
        no_traceback(p)
        assert value in p.stdout, (cmd, p.stdout)
        assert p.returncode == 2, (cmd, p.stderr)


@pytest.mark.parametrize("cmd", ["verify", "plan", "apply", "rollback", "facts"])
@pytest.mark.parametrize("opt", ["--only", "--state-dir", "--profile"])
def test_empty_option_is_a_usage_error(tmp_path, ok_profile, cmd, opt):
    """'' (an unset shell variable) used to mean the default: all subsystems, /var/lib/hkgpu-tune, the
    shipped profile. The other options point somewhere harmless, and apply is a dry run, in case it runs."""
    safe = {"--only": "sysctl", "--state-dir": str(tmp_path / "state"), "--profile": ok_profile}
    for value in ("", " ") + ((",",) if opt == "--only" else ()):
        others = [x for k, v in safe.items() if k != opt for x in (k, v)]
        p = hk(cmd, opt, value, *others, "--json", *(["--dry-run"] if cmd == "apply" else []))
        no_traceback(p)
        assert p.returncode == 1, (cmd, opt, value, p.stdout)
        assert p.stdout == ""
        lines = p.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("hkgpu-tune: error: argument ") and opt in lines[0], p.stderr
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("argv", [["nope"], [], ["verify", "--no-such-flag"], ["triton"], ["mps", "jump"],
                                  ["placement", "--gpu", "x"]])
def test_usage_errors_exit_1_in_one_line(argv):
    p = hk(*argv)
    no_traceback(p)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hkgpu-tune: error: ") and "--help" in lines[0], p.stderr


def test_help_and_version_exit_0():
    assert hk("--help").returncode == 0
    p = hk("--version")
    assert p.returncode == 0 and p.stdout.startswith("hkgpu-tune ")


RAISE = ("import sys, hkgpu_tune.cli.core as core\n"
         "def boom(ctx):\n    raise {exc}\n"
         "core.run_facts = boom\n"
         "from hkgpu_tune.cli import main\nmain(sys.argv[1:])\n")


def test_unexpected_exception_is_one_line_exit_1():
    p = hk("facts", code=RAISE.format(exc="RuntimeError('boom\\nsecond line')"), env={"HKGPU_TUNE_DEBUG": ""})
    no_traceback(p)
    assert p.returncode == 1
    assert p.stderr == ("hkgpu-tune: internal error: RuntimeError: boom second line "
                        "(HKGPU_TUNE_DEBUG=1 shows the traceback)\n")
    p = hk("facts", code=RAISE.format(exc="RuntimeError('boom')"), env={"HKGPU_TUNE_DEBUG": "1"})
    assert p.returncode == 1 and "Traceback" in p.stderr and "internal error: RuntimeError: boom" in p.stderr


def test_keyboard_interrupt():
    p = hk("facts", code=RAISE.format(exc="KeyboardInterrupt"))
    no_traceback(p)
    assert p.returncode == 130 and p.stderr == "hkgpu-tune: interrupted\n"
