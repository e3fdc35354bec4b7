"""One transaction (issue 35): the MTU proof and the Triton gate are checks that the engine's
transaction runs; a failed check undoes every write of the run (earlier subsystems too) through the
one journal, and no subsystem undoes anything by itself."""
import ast
import json
import os

from hkgpu_tune import subsystems
from hkgpu_tune.core.errors import CheckFailed, HkError
from hkgpu_tune.subsystems.base import Check

from .fakes import FakeCmd
from .test_engine import engine, host


def originals(b):
    return {"rmem": b.sysctl.values["net.core.rmem_max"], "mtu": b.net.links()[0]["mtu"],
            "gro": b.ethtool.devs["ens1f0"]["features"]["gro"]["on"], "qdisc": b.tc.qdiscs(2)["children"]["1:1"]}


def test_a_failed_check_undoes_every_write_of_the_run_through_the_journal(tmp_path):
    """A check of the last subsystem fails: the writes of sysctl, link, ethtool and qdisc are all
    undone, newest first, by restore() of each journal entry; the reason is the error."""
    b = host()
    before = originals(b)
    eng = engine(tmp_path, b)
    undone = []
    for s in eng.subs:
        orig = s.restore
        s.restore = lambda c, orig=orig: (undone.append((c.subsystem, c.target, c.key)), orig(c))[1]
    seen = {}

    def check():
        seen.update(originals(b))   # runs after every write of the transaction
        raise HkError("the qdisc check says no")

    eng.by_name["qdisc"].checks = lambda changes: [Check("qdisc check", check)] if changes else []
    rep = eng.apply()
    assert rep.rolled_back and rep.error == "the qdisc check says no", rep.error
    assert seen == {"rmem": "268435456", "mtu": 9000, "gro": True, "qdisc": "fq_codel"}
    assert originals(b) == before
    written = [(c.subsystem, c.target, c.key) for c in rep.changes if c.applied]
    assert {s for s, _, _ in written} == {"sysctl", "link", "ethtool", "qdisc"}
    assert undone == written[::-1]   # every write, newest first
    assert not (tmp_path / "state" / "state.json").exists()


def test_the_mtu_proof_is_a_check_and_its_failure_undoes_the_whole_run(tmp_path):
    b = host(cmd=FakeCmd({"198.18.0.2": 1}))
    before = originals(b)
    eng = engine(tmp_path, b)
    assert eng.by_name["link"].checks([]) == []   # nothing raised: nothing to prove
    rep = eng.apply()
    assert rep.rolled_back
    assert rep.error == ("MTU probe failed: fabric peer 198.18.0.2 did not answer a 8972-byte don't-fragment "
                         "ping via ens1f0; the old MTU is restored"), rep.error
    assert originals(b) == before


def test_a_check_failure_whose_undo_fails_says_so(tmp_path):
    b = host()
    eng = engine(tmp_path, b)
    link = eng.by_name["link"]

    def fail():
        raise CheckFailed("proof failed", undone="all back", undo_failed="putting it back failed")

    link.checks = lambda changes: [Check("proof", fail)]
    link.restore = lambda c: (_ for _ in ()).throw(HkError("device busy"))
    rep = eng.apply()
    assert rep.error == "proof failed; putting it back failed: link ens1f0 mtu: device busy", rep.error
    assert b.sysctl.values["net.core.rmem_max"] == "212992"   # the others are back all the same
    saved = json.load(open(tmp_path / "state" / "state.json"))
    assert [e["type"] for e in saved["entries"]] == ["link.mtu"]   # kept for rollback
    assert [e["event"] for e in saved["log"] if e["event"].startswith("check")] == ["check-failed"]


def test_a_passing_check_is_logged_in_the_journal(tmp_path):
    rep = engine(tmp_path).apply()
    assert rep.error == ""
    log = json.load(open(tmp_path / "state" / "state.json"))["log"]
    assert [(e["subsystem"], e["key"]) for e in log if e["event"] == "check"] == [("link", "mtu proof")]


def test_no_subsystem_undoes_by_itself():
    """after_apply and checks never call restore() or the old private undo; a restore never skips
    an entry because a subsystem put it back already."""
    here = os.path.dirname(subsystems.__file__)
    for name in sorted(os.listdir(here)):
        if not name.endswith(".py"):
            continue
        src = open(os.path.join(here, name)).read()
        assert '"restored"' not in src and "_put_back" not in src and "_undo_restart" not in src, name
        for fn in ast.walk(ast.parse(src)):
            if isinstance(fn, ast.FunctionDef) and fn.name in ("after_apply", "checks"):
                calls = {n.func.attr for n in ast.walk(fn) if isinstance(n, ast.Call)
                         and isinstance(n.func, ast.Attribute)}
                assert not calls & {"restore", "_restore_model", "_put_files_back", "_restore_launch",
                                    "put_back"}, (name, fn.name, calls)


def test_triton_undo_order_leaves_each_load_to_the_right_change(tmp_path):
    """Newest first, the journal undoes a Triton plan as _put_back did: a served_config whose model's
    files changed too is not loaded (its repository undo loads the previous files and config
    together); with a launch change in the plan, no model is loaded (the previous server, started
    last, loads the files back in place); the launch is planned first, so undone last."""
    from hkgpu_tune.core.report import DRIFT, OK, Result
    from hkgpu_tune.subsystems.triton import Plugin, Service

    def r(key, model=None, status=DRIFT):
        return Result("triton", model or "svc", key, "x", "y", status, "", write="w", data={"model": model})

    hot = Service._undo_order([r("repository", "a"), r("repository", "b", OK), r("served_config", "a"),
                               r("served_config", "b")])
    assert [x.data.get("files") for x in hot] == [None, None, True, None]
    assert not any(x.data.get("restart") for x in hot)
    res = Service._undo_order([r("repository", "a"), r("command"), r("served_config", "b")])
    assert [x.data.get("restart") for x in res] == [True, None, True]

    class Fake(Plugin):
        def compare(self, state):
            return [r("repository", "a"), r("unit"), r("service"), r("served_config", "a")]

    changes, _ = Fake(None, None).plan({})
    assert [c.key for c in changes] == ["unit", "repository", "service", "served_config"]

    loads = []
    svc = Service(None, None, None, [])
    from hkgpu_tune.serve.running import forms
    orig = forms.ServiceRef.from_dict
    try:
        forms.ServiceRef.from_dict = lambda d: loads.append(d) or (_ for _ in ()).throw(AssertionError("loaded"))
        for c in [hot[2], res[0], res[2]]:
            svc._load_previous(c)   # each load left to another change: none contacts the server
    finally:
        forms.ServiceRef.from_dict = orig
    assert loads == []


def test_triton_undo_keeps_the_copy_an_earlier_apply_needs(tmp_path):
    """Undoing a second apply puts its own copy back and keeps the first apply's copy, which the
    first apply's entry (still in the journal) restores on rollback."""
    from hkgpu_tune.serve.repository import redeploy
    from hkgpu_tune.subsystems.triton import Service
    repo = tmp_path / "srv" / "models"
    (repo / "m").mkdir(parents=True)
    first = redeploy.backup_path(str(repo), "m", "1")
    second = redeploy.backup_path(str(repo), "m", "2")
    for p in (first, second):
        os.makedirs(p)
    Service._drop_copies({"repository": str(repo), "model": "m", "backup": second, "original": first})
    assert redeploy.copies(str(repo), "m") == [first]
    Service._drop_copies({"repository": str(repo), "model": "m", "backup": first, "original": None})
    assert redeploy.copies(str(repo), "m") == []
