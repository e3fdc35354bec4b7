"""The Prometheus rules under monitoring/prometheus/: promtool checks them and runs their unit tests;
every alert has a test where it fires and one where it stays quiet; a changed threshold breaks a test."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "monitoring", "prometheus")
RULES = os.path.join(ROOT, "rules")
TESTS = os.path.join(ROOT, "tests")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian's prometheus package)")


def files(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".yml"))


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def alerts() -> dict[str, dict]:
    out = {}
    for path in files(RULES):
        for g in load(path)["groups"]:
            for r in g["rules"]:
                if "alert" in r:
                    assert r["alert"] not in out, f"{r['alert']} defined twice"
                    out[r["alert"]] = r
    return out


def promtool(*args, cwd=None):
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


@needs_promtool
def test_promtool_check_rules():
    p = promtool("check", "rules", *files(RULES))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("SUCCESS") == len(files(RULES))


@needs_promtool
@pytest.mark.parametrize("test_file", [os.path.basename(f) for f in files(TESTS)])
def test_promtool_unit_tests(test_file):
    p = promtool("test", "rules", test_file, cwd=TESTS)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


def test_every_alert_fires_in_a_test_and_stays_quiet_in_another():
    fired, quiet = set(), set()
    for path in files(TESTS):
        for t in load(path)["tests"]:
            for a in t.get("alert_rule_test") or []:
                (fired if a.get("exp_alerts") else quiet).add(a["alertname"])
    defined = set(alerts())
    assert len(defined) >= 20
    assert defined - fired == set(), "alerts no test fires"
    assert defined - quiet == set(), "alerts with no healthy (not firing) test"
    assert (fired | quiet) - defined == set(), "tests name alerts that do not exist"


def test_alerts_carry_severity_and_text():
    for name, r in alerts().items():
        assert r["labels"]["severity"] in ("warning", "critical"), name
        assert r["annotations"]["summary"] and r["annotations"]["description"], name


@needs_promtool
def test_a_changed_slo_breaks_the_serving_tests(tmp_path):
    """The unit tests can fail: with the p99 SLO raised from 15 ms to 25 ms the 20 ms case no longer fires."""
    shutil.copytree(ROOT, tmp_path / "prometheus")
    th = tmp_path / "prometheus" / "rules" / "hkgpu-thresholds.yml"
    text = th.read_text()
    assert "expr: vector(0.015)" in text
    th.write_text(text.replace("expr: vector(0.015)", "expr: vector(0.025)"))
    p = promtool("test", "rules", "hkgpu-serving.test.yml", cwd=tmp_path / "prometheus" / "tests")
    assert p.returncode != 0
    assert "alertname: HkgpuTritonP99OverSlo" in p.stdout + p.stderr


@needs_promtool
def test_a_broken_rule_file_is_refused(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: rate(hkgpu_tune_failures[5m]\n")
    p = promtool("check", "rules", str(bad))
    assert p.returncode != 0 and "FAILED" in p.stdout + p.stderr
