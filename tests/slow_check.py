"""A pytest plugin: the `slow` marker is honest. A test without it that takes more than LIMIT_S seconds
(set-up, call and tear-down of its own fixtures) is listed at the end of the run, and the run fails
when one in the fast tier (FAST_TIER) takes more than LIMIT_S times the allowance.

Why an allowance, and which time: wall time is what the fast tier's budget pays (CPU time would miss a
test that waits: a poll, a sleep, a subprocess), but on a busy machine wall time stretches with the
load. So a test fails the run only past LIMIT_S x max(FACTOR, load): FACTOR (HKGPU_SLOW_FACTOR,
default 2) for the noise of a quiet machine, and the 1-minute load average per CPU, read when the
test ends, for a machine other work keeps busy (two busy loops on two CPUs double it). Between
LIMIT_S and that, the test is listed as a warning, so `--durations` is not the only place it shows.
A module- or session-scoped fixture's set-up is charged to the first test that uses it: mark that
test (or the module) slow when the shared set-up is slow.

Registered for the whole suite from tests/conftest.py; HKGPU_SLOW_CHECK=0 turns it off.
"""
from __future__ import annotations

import os

import pytest

NAME = "hkgpu-slow-check"
# the fast tier (scripts/test.sh --fast): an unmarked test there fails the run far past the limit;
# elsewhere it is listed only (those tiers' budgets are not the 2 minutes of this one)
FAST_TIER = ("tests/unit/", "tests/hostile/", "tests/gpu_unit/")
LIMIT_S = float(os.environ.get("HKGPU_SLOW_LIMIT_S", "5"))   # the env: for this plugin's own tests


def factor() -> float:
    try:
        base = float(os.environ.get("HKGPU_SLOW_FACTOR", "2"))
    except ValueError:
        base = 2.0
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return max(base, load)


class SlowCheck:
    def __init__(self):
        self.took: dict[str, float] = {}
        self.allow: dict[str, float] = {}
        self.marked: set[str] = set()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        if item.get_closest_marker("slow"):
            self.marked.add(item.nodeid)

    def pytest_runtest_logreport(self, report):
        if report.nodeid in self.marked or report.skipped:
            return
        self.took[report.nodeid] = self.took.get(report.nodeid, 0.0) + report.duration
        if report.when == "teardown":
            self.allow[report.nodeid] = LIMIT_S * factor()

    def over(self) -> list[tuple[str, float, float]]:
        return sorted(((n, t, self.allow.get(n, LIMIT_S)) for n, t in self.took.items() if t > LIMIT_S),
                      key=lambda x: -x[1])

    def failing(self):
        return [(n, t, a) for n, t, a in self.over() if t > a and n.startswith(FAST_TIER)]

    def pytest_sessionfinish(self, session, exitstatus):
        if self.failing() and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        over = self.over()
        if not over:
            return
        terminalreporter.section(f"tests over {LIMIT_S:g} s without @pytest.mark.slow: {len(over)}")
        for n, t, a in over:
            fails = t > a and n.startswith(FAST_TIER)
            terminalreporter.write_line(f"{'FAILED' if fails else 'warning'}: {n}: {t:.1f} s "
                                        f"({'fast tier: fails' if n.startswith(FAST_TIER) else 'listed'} past "
                                        f"{a:.1f} s on this load)", red=fails, yellow=not fails)
        if self.failing():
            terminalreporter.write_line("mark them @pytest.mark.slow (tests/slow_check.py says why)", red=True)


def register(config) -> None:
    if os.environ.get("HKGPU_SLOW_CHECK", "1") != "0" and not config.pluginmanager.has_plugin(NAME):
        config.pluginmanager.register(SlowCheck(), NAME)


def pytest_configure(config):
    register(config)
