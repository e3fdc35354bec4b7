"""bench/serve_h200.py's summary on recorded runs: the targets, and the warning when the service
serves far less than the sweep measured for the same config (the 2026-12-03 --write bug)."""
from __future__ import annotations

import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
serve_h200 = pytest.importorskip("serve_h200", reason="bench/serve_h200.py imports what the bench needs")


def recorded(name: str) -> dict:
    with open(os.path.join(REPO, "docs", "perf", name)) as f:
        rec = json.load(f)
    for k in ("targets", "warnings", "served_x_sweep"):
        rec.pop(k, None)
    return rec


def test_the_run_with_the_dropped_setting_warns():
    rec = serve_h200.summarise(recorded("serve-h200-2026-12-03-writeback.json"))
    assert rec["served_x_sweep"] == pytest.approx(7165.2 / 11842.0, abs=0.01)
    assert len(rec["warnings"]) == 1 and "7165 img/s" in rec["warnings"][0]


def test_a_run_that_served_what_it_measured_does_not_warn():
    rec = serve_h200.summarise(recorded("serve-h200-2026-12-03b.json"))
    assert rec["served_x_sweep"] == pytest.approx(11085.7 / 11813.0, abs=0.01)
    assert "warnings" not in rec
    t = rec["targets"]
    assert t["tuned_p99_ms"]["pass"] and t["throughput_x_naive"]["pass"] and not t["x_limit"]["pass"]


def test_a_final_load_other_than_the_sweeps_is_not_compared():
    rec = recorded("serve-h200-2026-12-03-writeback.json")
    rec["tuned"]["load"]["concurrency"] = 40   # --concurrency-final chose another load
    rec = serve_h200.summarise(rec)
    assert rec["served_x_sweep"] is not None and "warnings" not in rec


def test_a_headline_where_the_load_generator_is_over_the_slo_fails_its_target():
    # 2026-12-06 (H100): the plain client held 15 ms at 120 in flight, the load generator measured 16.26 ms
    rec = recorded("serve-h100-2026-12-06.json")
    rec["tuned"]["headline_agreed"] = False
    rec["tuned"]["headline_tries"] = [{"concurrency": 120, "loadgen_p99_ms": 16.26, "plain_p99_ms": 14.52,
                                       "agreed": False}]
    t = serve_h200.summarise(rec)["targets"]
    assert t["headline_agreed"] == {"value": False, "target": True, "pass": False}
    rec["tuned"]["headline_agreed"] = True
    assert serve_h200.summarise(rec)["targets"]["headline_agreed"]["pass"] is True


def test_a_record_from_before_the_agreement_rule_has_no_such_target():
    assert "headline_agreed" not in serve_h200.summarise(recorded("serve-h100-2026-12-06.json"))["targets"]


def test_a_ladder_over_the_slo_everywhere_steps_down_at_most_three_times():
    over = [{"concurrency": c, "p99_ms": 16.5, "lowered": False} for c in (96, 104, 112)]
    assert serve_h200.lower_levels(over, 15.0) == [72]                    # a quarter under 96, a multiple of 8
    over.append({"concurrency": 72, "p99_ms": 15.2, "lowered": True})
    assert serve_h200.lower_levels(over, 15.0) == [48]
    over += [{"concurrency": c, "p99_ms": 15.1, "lowered": True} for c in (48, 32)]
    assert serve_h200.lower_levels(over, 15.0) == []                      # three steps taken
    assert serve_h200.lower_levels([{"concurrency": 96, "p99_ms": 14.0, "lowered": False}], 15.0) == []
    assert serve_h200.lower_levels([{"concurrency": 8, "p99_ms": 16.0, "lowered": False}], 15.0) == []
