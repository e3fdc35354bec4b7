"""A replaced GPU's MIG entry is handled like its GPU entry: rollback never writes the old board's
layout to the new one, reports it and keeps it; `rollback --forget` drops it; the old board back,
its layout is restored."""
from ..gpu_unit.test_mig import engine, layout, mig_profile


def swap(eng, i=0):
    g = eng.b.nvml.facts["gpus"][i]
    old = g["uuid"]
    g["uuid"] = "GPU-" + "1" * 8 + old[12:]
    return old, g["uuid"]


def test_a_replaced_gpus_mig_layout_is_kept_then_forgotten(tmp_path):
    eng = engine("mig-a30.json", mig_profile(layout={"1g.6gb": 4}), tmp_path)
    before = layout(eng)[0]
    assert not eng.apply().error
    old, new = swap(eng)
    writes = list(eng.b.nvml.writes)
    rep = eng.rollback()
    assert eng.b.nvml.writes == writes, "the old board's layout reached the new one"
    assert len(rep.kept) == 1 and f"is {new}, not {old}" in rep.errors[0], rep.errors
    assert layout(eng)[0] == ["1g.6gb"] * 4
    rep = eng.rollback(forget=True)
    assert not rep.errors and len(rep.forgotten) == 1 and eng.state.load() == []
    assert eng.b.nvml.writes == writes and before != layout(eng)[0]


def test_the_old_board_back_gets_its_layout(tmp_path):
    eng = engine("mig-a30.json", mig_profile(layout={"1g.6gb": 4}), tmp_path)
    before = layout(eng)[0]
    assert not eng.apply().error
    old, new = swap(eng)
    assert eng.rollback().kept
    eng.b.nvml.facts["gpus"][0]["uuid"] = old
    rep = eng.rollback()
    assert not rep.errors and layout(eng)[0] == before
