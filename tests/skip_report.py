"""A pytest plugin: every skipped test with its reason, at the end of the run, and a failed run when a
skip gives none (a bare `pytest.skip()`, a `@pytest.mark.skip` without reason=).

Registered for the whole suite from tests/conftest.py; elsewhere `-p tests.skip_report`.
$HKGPU_SKIPS_JSON names a file that gets the list as JSON ([{"test", "reason"}]) for CI to keep.
"""
from __future__ import annotations

import json
import os

import pytest

NAME = "hkgpu-skip-report"
# what pytest says when the test gave no reason
NO_REASON = {"", "skipped", "unconditional skip"}


def reason_of(report) -> str:
    """The reason a skipped report carries ("Skipped: " taken off); "" when it gave none."""
    lr = report.longrepr
    text = (lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr or "")).removeprefix("Skipped:").strip()
    return "" if text.rstrip(".").lower() in NO_REASON else text


def has_reason(reason: str) -> bool:
    return bool(reason)


class SkipReport:
    def __init__(self):
        self.skips: list[dict] = []

    def _record(self, report):
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips.append({"test": report.nodeid, "reason": reason_of(report)})

    def pytest_runtest_logreport(self, report):
        self._record(report)

    def pytest_collectreport(self, report):
        self._record(report)

    def missing(self) -> list[dict]:
        return [s for s in self.skips if not has_reason(s["reason"])]

    def pytest_sessionfinish(self, session, exitstatus):
        path = os.environ.get("HKGPU_SKIPS_JSON")
        if path:
            with open(path, "w") as f:
                json.dump(self.skips, f, indent=1)
        if self.missing() and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if not self.skips:
            return
        terminalreporter.section(f"skipped: {len(self.skips)}, each with its reason")
        for s in self.skips:
            terminalreporter.write_line(f"{s['test']}: {s['reason'] if has_reason(s['reason']) else 'NO REASON'}")
        bad = self.missing()
        if bad:
            terminalreporter.write_line(f"FAILED: {len(bad)} skipped test(s) give no reason: say why in "
                                        "pytest.skip(...) or reason=", red=True)


def register(config) -> None:
    if not config.pluginmanager.has_plugin(NAME):
        config.pluginmanager.register(SkipReport(), NAME)


def pytest_configure(config):
    register(config)
