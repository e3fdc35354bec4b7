"""`triton sweep --write` without a server: whatever the sweep measured (preferred sizes added,
changed or dropped; flow or block YAML) is what the rewritten profile renders, or nothing is written.
(Before, a best config with preferred sizes was written without them when the profile had none, so
the service ran a config nobody measured.)"""
from __future__ import annotations

import pytest
import yaml

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.serve.measuring import sweep

MODEL = """\
name: t
# the operator's comment
triton:
  model_repository: {root}/models
  run_dir: {root}/run
  models:
    - name: m
      backend: python
      model_file: {root}/model.py
      max_batch_size: 16
      inputs: [{{name: IN, data_type: FP32, dims: [4]}}]
      outputs: [{{name: OUT, data_type: FP32, dims: [4]}}]
{batching}
      instance_group:
        - count: 1
          kind: KIND_CPU
"""
BLOCK = "      dynamic_batching:\n        max_queue_delay_microseconds: 100   # tuned by hand\n"
FLOW = "      dynamic_batching: {max_queue_delay_microseconds: 100}\n"
BLOCK_PREF = ("      dynamic_batching:\n        preferred_batch_size: [4, 8]\n"
              "        max_queue_delay_microseconds: 100\n")
FLOW_PREF = "      dynamic_batching: {preferred_batch_size: [4, 8], max_queue_delay_microseconds: 100}\n"
FLOW_PREF_LAST = "      dynamic_batching: {max_queue_delay_microseconds: 100, preferred_batch_size: [4, 8]}\n"
# block collections as the last value: PyYAML ends them where the next key starts, not at a line end
BLOCK_SEQ_PREF = ("      dynamic_batching:\n        max_queue_delay_microseconds: 100\n"
                  "        preferred_batch_size:\n          - 4\n          - 8   # by hand\n")
BLOCK_NESTED = ("      dynamic_batching:\n        max_queue_delay_microseconds: 100\n"
                "        default_queue_policy:\n          timeout_action: REJECT\n")
LAYOUTS = [BLOCK, FLOW, BLOCK_PREF, FLOW_PREF, FLOW_PREF_LAST, BLOCK_SEQ_PREF, BLOCK_NESTED]


def unswept(text: str):
    """The profile as data without the values a sweep may change."""
    doc = yaml.safe_load(text)
    m = doc["triton"]["models"][0]
    for k in ("max_batch_size",):
        m.pop(k)
    m["dynamic_batching"].pop("max_queue_delay_microseconds")
    m["dynamic_batching"].pop("preferred_batch_size", None)
    m["instance_group"][0].pop("count")
    return doc


def write_and_read(tmp_path, batching: str, grid: sweep.Grid, nl: str = "\n"):
    (tmp_path / "model.py").write_text("# model\n")
    path = tmp_path / "node.yaml"
    path.write_bytes(MODEL.format(root=tmp_path, batching=batching.rstrip("\n")).replace("\n", nl).encode())
    model = parse_profile_text(path.read_text(), str(path)).section("triton").model("m")
    cfg, label, mps = sweep.configs(model, grid, False)[0]
    pt = sweep.Point(cfg, label, mps, best={"img_s": 100.0, "p99_ms": 5.0, "concurrency": 8, "transport": "http"})
    rep = sweep.Report("m", 10.0, 60.0, points=[pt], best=pt, date="2026-12-03T00:00:00+00:00")
    before = path.read_bytes().decode()
    sweep.write_back(str(path), "m", rep)
    text = path.read_bytes().decode()
    served = parse_profile_text(text, str(path)).section("triton").model("m").config
    return before, text, served, cfg


@pytest.mark.parametrize("batching", LAYOUTS)
@pytest.mark.parametrize("pref", ["8,16", "none", "max"])
@pytest.mark.parametrize("nl", ["\n", "\r\n"])
def test_the_profile_renders_what_was_measured(tmp_path, batching, pref, nl):
    grid = sweep.Grid(max_batch=[32], delay_us=[2000], instances=[4], preferred=[pref])
    before, text, served, cfg = write_and_read(tmp_path, batching, grid, nl)
    for key in ("max_batch_size", "dynamic_batching", "instance_group"):
        assert served[key] == cfg[key], (key, text)
    assert unswept(text) == unswept(before), text            # nothing else moved
    assert text.count("\n") == text.count(nl), "line endings kept"
    assert ("preferred_batch_size" in served["dynamic_batching"]) == (pref != "none"), text
    # only the swept values and the sweep's comment changed: the operator's lines are kept
    assert "# the operator's comment" in text and text.count("# hkgpu-tune triton sweep") == 1
    for note in ("# tuned by hand", "# by hand"):
        if note in before and pref != "none":
            assert note in text
    assert -3 <= len(text.splitlines()) - len(before.splitlines()) <= 2   # a comment, a key, a block list


def test_a_measured_setting_the_profile_cannot_carry_writes_nothing(tmp_path):
    """The guard: a config part --write does not know (here a queue policy) is reported, not dropped."""
    (tmp_path / "model.py").write_text("# model\n")
    path = tmp_path / "node.yaml"
    path.write_text(MODEL.format(root=tmp_path, batching=BLOCK.rstrip("\n")))
    model = parse_profile_text(path.read_text(), str(path)).section("triton").model("m")
    cfg, label, _ = sweep.configs(model, sweep.Grid(delay_us=[500]), False)[0]
    cfg["dynamic_batching"]["default_queue_policy"] = {"timeout_action": "REJECT"}
    pt = sweep.Point(cfg, label, False, best={"img_s": 1.0, "p99_ms": 1.0, "concurrency": 1, "transport": "http"})
    before = path.read_text()
    with pytest.raises(HkError, match=r"dynamic_batching would differ from the measured config.*unchanged"):
        sweep.write_back(str(path), "m", sweep.Report("m", 10.0, 60.0, points=[pt], best=pt, date="d"))
    assert path.read_text() == before


@pytest.mark.parametrize("profile_mps,measured_mps", [(True, False), (False, True)])
def test_a_config_measured_with_other_mps_than_the_node_runs_writes_nothing(tmp_path, profile_mps, measured_mps):
    (tmp_path / "model.py").write_text("# model\n")
    path = tmp_path / "node.yaml"
    text = MODEL.format(root=tmp_path, batching=BLOCK.rstrip("\n"))
    if profile_mps:
        text += f"mps:\n  enabled: true\n  pipe_dir: {tmp_path}/pipe\n  log_dir: {tmp_path}/log\n"
    path.write_text(text)
    model = parse_profile_text(text, str(path)).section("triton").model("m")
    cfg, label, _ = sweep.configs(model, sweep.Grid(delay_us=[500]), False)[0]
    pt = sweep.Point(cfg, label, measured_mps,
                     best={"img_s": 1.0, "p99_ms": 1.0, "concurrency": 1, "transport": "http"})
    with pytest.raises(HkError, match=f"measured {'with' if measured_mps else 'without'} MPS.*unchanged"):
        sweep.write_back(str(path), "m", sweep.Report("m", 10.0, 60.0, points=[pt], best=pt, date="d"))
    assert path.read_text() == text


def test_an_edit_that_would_change_another_model_writes_nothing(tmp_path):
    """A YAML anchor shares the batching with a second model: writing it would retune that model too."""
    (tmp_path / "model.py").write_text("# model\n")
    path = tmp_path / "node.yaml"
    text = MODEL.format(root=tmp_path, batching=FLOW.rstrip("\n")).replace("dynamic_batching: {", "dynamic_batching: &db {")
    text += (f"    - name: other\n      backend: python\n      model_file: {tmp_path}/model.py\n"
             "      max_batch_size: 8\n      inputs: [{name: IN, data_type: FP32, dims: [4]}]\n"
             "      outputs: [{name: OUT, data_type: FP32, dims: [4]}]\n      dynamic_batching: *db\n"
             "      instance_group: [{count: 1, kind: KIND_CPU}]\n")
    path.write_text(text)
    model = parse_profile_text(text, str(path)).section("triton").model("m")
    cfg, label, _ = sweep.configs(model, sweep.Grid(delay_us=[2000]), False)[0]
    pt = sweep.Point(cfg, label, False, best={"img_s": 1.0, "p99_ms": 1.0, "concurrency": 1, "transport": "http"})
    with pytest.raises(HkError, match="changes more than the swept values.*unchanged"):
        sweep.write_back(str(path), "m", sweep.Report("m", 10.0, 60.0, points=[pt], best=pt, date="d"))
    assert path.read_text() == text
