"""Nothing on disk is trusted: a tampered, truncated, foreign or foreign-owned state file, or a
state directory others can write, is refused as a whole before anything is written."""
import hashlib
import json
import os
import subprocess
import sys

import pytest

from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.errors import StateError
from hkgpu_tune.core.profile import parse_profile_text

from ..unit.test_engine import PROFILE, host

GOOD = {"type": "sysctl.key", "version": 1, "subsystem": "sysctl", "target": "host",
        "key": "net.core.rmem_max", "original": "4096", "desired": "268435456", "data": {}}


def entry(**over):
    return {**GOOD, **over}


def run_rollback(tmp_path, doc=None, raw=None):
    d = tmp_path / "st"
    d.mkdir(mode=0o700, exist_ok=True)
    (d / "state.json").write_bytes(raw if raw is not None else json.dumps(doc).encode())
    os.chmod(d / "state.json", 0o600)
    b = host()
    eng = Engine(parse_profile_text(PROFILE, "t.yaml"), state_dir=str(d), backends=b)
    with pytest.raises(StateError) as e:
        eng.rollback()
    # nothing was written: not even the valid entry before the bad one
    assert b.sysctl.writes == [] and b.net.links()[0]["mtu"] == 1500
    assert (d / "state.json").exists()
    return str(e.value)


VALID = json.dumps({"format": 2, "entries": [GOOD, GOOD]})
BAD = {
    "truncated": (VALID[: len(VALID) // 2], "not valid JSON"),
    "not JSON": ("hello", "not valid JSON"),
    "foreign format": ({"format": 7, "entries": []}, "not a hkgpu-tune state file"),
    "a list": ([GOOD], "not a hkgpu-tune state file"),
    "entries not a list": ({"format": 2, "entries": {"a": 1}}, "'entries' is not a list"),
    "unknown type": ({"format": 2, "entries": [GOOD, entry(type="shell.command")]},
                     "entries[1] (shell.command sysctl host net.core.rmem_max): unknown setting type"),
    "unknown version": ({"format": 2, "entries": [GOOD, entry(version=9)]}, "payload version 9"),
    "extra field": ({"format": 2, "entries": [GOOD, entry(exec="rm -rf /")]}, "unexpected field(s) exec"),
    "sysctl at /etc/passwd": ({"format": 2, "entries": [GOOD, entry(key="..etc.passwd")]},
                              "not a sysctl under /proc/sys"),
    "sysctl value with a line break": ({"format": 2, "entries": [GOOD, entry(original="1\nkernel.x=2")]},
                                       "line breaks"),
    "mtu out of range": ({"format": 2, "entries": [GOOD, {
        "type": "link.mtu", "version": 1, "subsystem": "link", "target": "ens1f0", "key": "mtu",
        "original": 70000, "desired": 9000, "data": {"index": 2}}]}, "expected an integer 68..65535"),
    "interface name with a slash": ({"format": 2, "entries": [GOOD, {
        "type": "link.mtu", "version": 1, "subsystem": "link", "target": "../../x", "key": "mtu",
        "original": 1500, "desired": 9000, "data": {}}]}, "not a valid interface name"),
    "MPS directory at /etc": ({"format": 2, "entries": [GOOD, {
        "type": "mps.param", "version": 1, "subsystem": "mps", "target": "mps", "key": "pipe_dir",
        "original": "0700 root", "desired": "0755 root", "data": {"path": "/etc", "mode": 0o755}}]},
        "not a directory the tool may manage"),
    "irqbalance file at /etc/shadow": ({"format": 2, "entries": [GOOD, {
        "type": "affinity.irq", "version": 1, "subsystem": "affinity", "target": "irqbalance",
        "key": "banned_irqs", "original": [], "desired": "x", "data": {"file": "/etc/shadow", "old": "x"}}]},
        "data.file"),
    "persist entry at /etc/passwd": ({"format": 2, "entries": [GOOD, {
        "type": "persist.file", "version": 1, "subsystem": "persist", "target": "/etc/passwd", "key": "file",
        "original": None, "desired": {"sha256": ["0" * 64]}, "data": {}}]}, "not a file apply --persist writes"),
    "type and subsystem disagree": ({"format": 2, "entries": [GOOD, entry(subsystem="link")]},
                                    "does not go with type"),
    "format 1 with a bad key": ({"format": 1, "changes": [{"subsystem": "sysctl", "target": "host",
                                                           "key": "..etc.shadow", "current": "x"}]},
                                "changes[0]"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_tampered_state_file_is_refused_whole(tmp_path, case):
    doc, why = BAD[case]
    msg = run_rollback(tmp_path, raw=doc.encode() if isinstance(doc, str) else None,
                       doc=None if isinstance(doc, str) else doc)
    assert str(tmp_path / "st" / "state.json") in msg and why in msg, msg


def test_a_format_1_file_is_still_rolled_back(tmp_path):
    d = tmp_path / "st"
    d.mkdir(mode=0o700)
    (d / "state.json").write_text(json.dumps({"format": 1, "changes": [
        {"subsystem": "sysctl", "target": "host", "key": "net.core.rmem_max", "current": "4096",
         "desired": "268435456", "data": {}, "applied": True}]}))
    b = host()
    restored, errs = Engine(parse_profile_text(PROFILE, "t.yaml"), state_dir=str(d), backends=b).rollback()
    assert not errs and b.sysctl.values["net.core.rmem_max"] == "4096"
    assert not (d / "state.json").exists()


def _saved_state(tmp_path):
    b = host()
    d = tmp_path / "st"
    rep = Engine(parse_profile_text(PROFILE, "t.yaml"), only=["sysctl"], state_dir=str(d), backends=b).apply()
    assert not rep.error and (d / "state.json").exists()
    return d


def _refused(tmp_path, d, why):
    b = host()
    for verb in ("rollback", "apply"):
        eng = Engine(parse_profile_text(PROFILE, "t.yaml"), state_dir=str(d), backends=b)
        with pytest.raises(StateError, match=why):
            getattr(eng, verb)()
        assert b.sysctl.writes == [] and b.net.links()[0]["mtu"] == 1500, verb


def test_a_state_file_of_another_owner_is_refused(tmp_path):
    d = _saved_state(tmp_path)
    os.chown(d / "state.json", 65534, 65534)
    _refused(tmp_path, d, "belongs to uid 65534")


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_state_directory_others_can_write_is_refused(tmp_path, mode):
    d = _saved_state(tmp_path)
    os.chmod(d, mode)
    _refused(tmp_path, d, "writable by group or others")


def test_a_state_directory_that_is_a_link_is_refused(tmp_path):
    d = _saved_state(tmp_path)
    os.symlink(d, tmp_path / "ln")
    _refused(tmp_path, tmp_path / "ln", "is a symbolic link")


def test_a_state_file_that_is_a_link_is_refused(tmp_path):
    d = _saved_state(tmp_path)
    os.rename(d / "state.json", tmp_path / "elsewhere.json")
    os.symlink(tmp_path / "elsewhere.json", d / "state.json")
    _refused(tmp_path, d, "is a symbolic link")


def test_an_oversized_state_file_is_refused_without_reading_it(tmp_path):
    d = _saved_state(tmp_path)
    os.truncate(d / "state.json", 17 * 1024 * 1024)
    _refused(tmp_path, d, "over the 16777216 allowed")


def test_a_new_state_directory_is_made_owner_only(tmp_path):
    d = _saved_state(tmp_path)
    assert os.stat(d).st_mode & 0o777 == 0o700 and os.stat(d / "state.json").st_mode & 0o777 == 0o600


# ---------------------------------------------------------------- through the real CLI
def cli(*args):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.root
def test_a_sysctl_entry_aimed_at_a_file_writes_nothing(tmp_path):
    """A key whose dots turn into an absolute path ('..x.y' -> '//x/y') would make rollback write
    its 'original' into any file root can write."""
    target = tmp_path / "victim"
    target.write_text("untouched\n")
    key = "." + str(target).replace("/", ".")
    d = tmp_path / "st"
    d.mkdir(mode=0o700)
    (d / "state.json").write_text(json.dumps({"format": 1, "changes": [
        {"subsystem": "sysctl", "target": "host", "key": key, "current": "owned", "desired": "x", "data": {}}]}))
    p = cli("rollback", "--state-dir", str(d))
    assert target.read_text() == "untouched\n"
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stdout + p.stderr
    assert "state.json" in p.stderr and "not a sysctl under /proc/sys" in p.stderr, p.stderr


@pytest.mark.root
def test_a_persist_record_of_an_older_version_deletes_nothing(tmp_path):
    victim = tmp_path / "etc" / "important.conf"
    victim.parent.mkdir()
    victim.write_text("keep me\n")
    d = tmp_path / "st"
    d.mkdir(mode=0o700)
    (d / "persist.json").write_text(json.dumps([{"path": str(victim), "backup": None}]))
    p = cli("rollback", "--state-dir", str(d))
    assert victim.read_text() == "keep me\n"
    assert p.returncode == 1 and "persist.json" in p.stderr and "Traceback" not in p.stderr, p.stdout + p.stderr


def test_a_persist_entry_for_a_file_the_tool_did_not_write_keeps_it(tmp_path):
    conf = tmp_path / "root/etc/sysctl.d/60-hkgpu-tune.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("someone else's\n")
    d = tmp_path / "st"
    d.mkdir(mode=0o700)
    other = hashlib.sha256(b"what hkgpu-tune wrote\n").hexdigest()
    (d / "state.json").write_text(json.dumps({"format": 2, "entries": [{
        "type": "persist.file", "version": 1, "subsystem": "persist", "target": str(conf), "key": "file",
        "original": None, "desired": {"sha256": [other]}, "data": {}}]}))
    rep = Engine(parse_profile_text(PROFILE, "t.yaml"), state_dir=str(d), backends=host()).rollback()
    assert conf.read_text() == "someone else's\n"
    assert rep.files == [f"kept {conf}: changed since hkgpu-tune wrote it (not removed, not restored)"]


def test_a_killed_writers_temporary_file_is_removed_at_the_next_lock(tmp_path):
    """A writer killed between atomic_write's temporary file and its rename leaves .state.json.PID.N.tmp
    behind; the next run that takes the lock removes it (a real leftover: a kill -9 of a writer that
    stopped before its rename). Only regular files of that name: a link or a directory named like one
    is left alone, and nothing it points at is touched."""
    d = tmp_path / "st"
    d.mkdir(mode=0o700)
    child = subprocess.run([sys.executable, "-c", f"""
import os, signal
from hkgpu_tune.core import fsutil
real = os.replace
def stop(src, dst):      # the writer dies where a kill would leave the file: before its rename
    os.kill(os.getpid(), signal.SIGKILL)
os.replace = stop
fsutil.atomic_write({str(d / 'state.json')!r}, b'{{}}', mode=0o600)
"""], capture_output=True, text=True, timeout=60)
    assert child.returncode == -9, child.stderr
    left = [n for n in os.listdir(d) if n.endswith(".tmp")]
    assert len(left) == 1 and left[0].startswith(".state.json."), os.listdir(d)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, d / ".x.1.2.tmp")
    os.mkdir(d / ".y.1.2.tmp")
    eng = Engine(parse_profile_text(PROFILE, "t.yaml"), state_dir=str(d), backends=host())
    eng.rollback()
    names = sorted(os.listdir(d))
    assert left[0] not in names, names
    assert ".x.1.2.tmp" in names and ".y.1.2.tmp" in names and victim.read_text() == "keep", names
