"""tests/skip_report.py: every skip listed with its reason; a skip without one fails the run.
Each case is a pytest run of its own (a subprocess) over test files written here."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests import skip_report

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WITH_REASONS = '''
import pytest

def test_runs():
    pass

@pytest.mark.skip(reason="needs a GPU")
def test_marked():
    pass

@pytest.mark.skipif(True, reason="no netem in this kernel")
def test_skipif():
    pass

def test_inside():
    pytest.skip("ping is not installed")

def test_import():
    pytest.importorskip("no_such_module_hk")

@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False
'''


def run(tmp_path, files: dict, *extra):
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")      # the run's own rootdir, not the repository's
    env = {**os.environ, "PYTHONPATH": REPO, "HKGPU_SKIPS_JSON": str(tmp_path / "skips.json")}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.skip_report",
                        *extra, str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    with open(tmp_path / "skips.json") as f:
        return p, json.load(f)


def test_skips_with_reasons_are_listed_and_pass(tmp_path):
    p, skips = run(tmp_path, {"test_a.py": WITH_REASONS})
    assert p.returncode == 0, p.stdout + p.stderr
    got = {s["test"].split("::")[1]: s["reason"] for s in skips}
    assert got == {"test_marked": "needs a GPU", "test_skipif": "no netem in this kernel",
                   "test_inside": "ping is not installed",
                   "test_import": "could not import 'no_such_module_hk': No module named 'no_such_module_hk'"}
    assert "skipped: 4, each with its reason" in p.stdout
    assert "test_a.py::test_skipif: no netem in this kernel" in p.stdout and "NO REASON" not in p.stdout


@pytest.mark.parametrize("bad", ["pytest.skip()", "pytest.skip('')", "@pytest.mark.skip"])
def test_a_skip_without_reason_fails_the_run(tmp_path, bad):
    body = f"{bad}\ndef test_bare():\n    pass\n" if bad.startswith("@") else f"def test_bare():\n    {bad}\n"
    p, skips = run(tmp_path, {"test_a.py": WITH_REASONS, "test_b.py": "import pytest\n" + body})
    assert p.returncode == 1, p.stdout + p.stderr
    assert "test_b.py::test_bare: NO REASON" in p.stdout
    assert "FAILED: 1 skipped test(s) give no reason" in p.stdout
    assert len(skips) == 5


def test_a_module_skipped_whole_is_listed(tmp_path):
    p, skips = run(tmp_path, {"test_m.py": "import pytest\npytest.skip('tritonclient is not installed', "
                                            "allow_module_level=True)\n",
                              "test_n.py": "import pytest\npytest.skip(allow_module_level=True)\n"})
    assert p.returncode == 1, p.stdout + p.stderr
    assert [(s["test"], s["reason"]) for s in skips] == [("test_m.py", "tritonclient is not installed"),
                                                         ("test_n.py", "")]


def test_a_failing_run_stays_failed(tmp_path):
    p, _ = run(tmp_path, {"test_f.py": "def test_f():\n    assert False\n"})
    assert p.returncode == 1


def test_the_suite_registers_it(pytestconfig):
    assert isinstance(pytestconfig.pluginmanager.get_plugin(skip_report.NAME), skip_report.SkipReport)
