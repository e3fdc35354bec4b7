"""tests/slow_check.py: an unmarked test over the limit is listed; far over it (the allowance times the
load), it fails the run; a test marked slow is never listed. Each case is a pytest run of its own
(a subprocess) with a limit of 0.1 s."""
import os
import subprocess
import sys

from tests import slow_check

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TESTS = '''
import time
import pytest

def test_quick():
    pass

def test_a_little_over():
    time.sleep(0.15)

@pytest.mark.slow
def test_marked():
    time.sleep(1)
'''


def run(tmp_path, text, where="tests/unit"):
    (tmp_path / where).mkdir(parents=True, exist_ok=True)
    (tmp_path / where / "test_a.py").write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n  slow: slow\n")
    env = {**os.environ, "PYTHONPATH": REPO, "HKGPU_SLOW_LIMIT_S": "0.1", "HKGPU_SLOW_FACTOR": "2"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.slow_check",
                           str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


def test_over_the_limit_is_listed_and_marked_tests_are_not(tmp_path):
    p = run(tmp_path, TESTS)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "tests over 0.1 s without @pytest.mark.slow: 1" in p.stdout, p.stdout
    assert "warning: tests/unit/test_a.py::test_a_little_over: " in p.stdout and "test_marked" not in p.stdout


def test_far_over_the_limit_fails_the_run(tmp_path):
    p = run(tmp_path, TESTS + "\ndef test_far_over():\n    time.sleep(1.5)\n")
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    assert p.returncode == (1 if 0.1 * max(2, load) < 1.5 else 0), p.stdout + p.stderr
    assert "tests/unit/test_a.py::test_far_over: " in p.stdout and "mark them @pytest.mark.slow" in p.stdout


def test_outside_the_fast_tier_far_over_is_listed_only(tmp_path):
    p = run(tmp_path, TESTS + "\ndef test_far_over():\n    time.sleep(1.5)\n", where="tests/integration")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "warning: tests/integration/test_a.py::test_far_over: " in p.stdout, p.stdout


def test_the_suite_registers_it(pytestconfig):
    assert isinstance(pytestconfig.pluginmanager.get_plugin(slow_check.NAME), slow_check.SlowCheck)
