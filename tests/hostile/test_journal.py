"""The journal on its own: originals on disk before any write, the oldest original kept, refusals,
and the undo of one run that keeps what earlier runs saved."""
import json

import pytest

from hkgpu_tune.core.errors import ApplyError, StateError
from hkgpu_tune.tune.journal import Journal
from hkgpu_tune.core.report import Change
from hkgpu_tune.tune.state import State


def sysctl(key, cur, want):
    return Change("sysctl", "host", key, cur, want)


def on_disk(d):
    return json.load(open(d / "state.json"))


def test_originals_are_on_disk_before_the_first_write_and_the_oldest_wins(tmp_path):
    d = tmp_path / "st"
    j = Journal(State(str(d)))
    j.originals([sysctl("net.ipv4.tcp_mtu_probing", "0", "1")])
    doc = on_disk(d)
    assert doc["format"] == 2
    assert [(e["type"], e["key"], e["original"]) for e in doc["entries"]] == \
        [("sysctl.key", "net.ipv4.tcp_mtu_probing", "0")]
    j.wrote(j.this_run[0])
    j.finish()
    # a second run sees the value the first wrote; its original must not replace the first one
    j2 = Journal(State(str(d)))
    j2.originals([sysctl("net.ipv4.tcp_mtu_probing", "1", "2")])
    assert [e["original"] for e in on_disk(d)["entries"]] == ["0"]
    assert [e["event"] for e in on_disk(d)["log"]][:2] == ["original", "write"]


def test_a_refusal_put_back_drops_its_entry_and_one_not_put_back_keeps_it(tmp_path):
    d = tmp_path / "st"
    j = Journal(State(str(d)))
    a, b = sysctl("net.ipv4.tcp_ecn", "2", "1"), sysctl("net.ipv4.tcp_sack", "1", "0")
    j.originals([a, b])
    j.refused(a, "the kernel said no", put_back=True)
    j.refused(b, "the kernel said no", put_back=False)
    assert [e["key"] for e in on_disk(d)["entries"]] == ["net.ipv4.tcp_sack"]
    assert j.refusals == {a.ident: "the kernel said no", b.ident: "the kernel said no"}
    events = [e["event"] for e in on_disk(d)["log"]]
    assert events.count("refused") == 2 and "undo-failed" in events


def test_undo_run_newest_first_keeps_earlier_runs_and_failed_undos(tmp_path):
    d = tmp_path / "st"
    first = Journal(State(str(d)))
    old = sysctl("net.ipv4.tcp_ecn", "2", "1")
    first.originals([old])
    first.wrote(old)
    first.finish()

    j = Journal(State(str(d)))
    again = sysctl("net.ipv4.tcp_ecn", "1", "0")         # saved by the first run: its original stays
    ok, bad, never = (sysctl("net.ipv4.tcp_sack", "1", "0"), sysctl("net.ipv4.tcp_dsack", "1", "0"),
                      sysctl("net.ipv4.tcp_fack", "1", "0"))
    j.originals([again, ok, bad, never])
    for c in (again, ok, bad):
        j.wrote(c)
    order = []

    def restore(c):
        order.append(c.key)
        if c is bad:
            raise ApplyError("device busy")

    errs = j.undo_run(restore)
    assert order == ["net.ipv4.tcp_dsack", "net.ipv4.tcp_sack", "net.ipv4.tcp_ecn"]
    assert [m for _, m in errs] == ["sysctl host net.ipv4.tcp_dsack: device busy"]
    kept = {e["key"]: e["original"] for e in on_disk(d)["entries"]}
    # the earlier run's original (2, not 1), the one whose undo failed; not the undone, not the unwritten
    assert kept == {"net.ipv4.tcp_ecn": "2", "net.ipv4.tcp_dsack": "1"}


def test_a_change_no_setting_type_covers_is_never_saved(tmp_path):
    j = Journal(State(str(tmp_path / "st")))
    with pytest.raises(StateError, match="not a sysctl under /proc/sys"):
        j.originals([sysctl("..etc.passwd", "root:x:0:0", "x")])
    assert not (tmp_path / "st" / "state.json").exists()
