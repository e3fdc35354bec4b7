"""The host lock and the registry of journals (tune/host.py) are read as root and never trusted: a
link is refused and never followed, a file or directory another user owns or can write is
refused, garbage is refused with one line, a listed directory that does not hold is ignored (and
dropped), and nothing on the host changes on a refusal."""
import fcntl
import json
import os
import subprocess
import sys

import pytest

from hkgpu_tune.core.errors import LockError, StateError
from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.tune.engine import Engine

from ..unit.test_engine import PROFILE, host

NOBODY = 65534


def apply(state, b=None):
    b = b or host()
    return b, Engine(parse_profile_text(PROFILE, "t.yaml"), state_dir=str(state), backends=b)


def untouched(b) -> bool:
    return b.sysctl.writes == [] and b.net.links()[0]["mtu"] == 1500


def test_a_linked_host_lock_is_refused_and_not_followed(tmp_path, host_dir):
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    (host_dir / "host.lock").symlink_to(target)
    b, eng = apply(tmp_path / "st")
    with pytest.raises(StateError, match="host lock file is a symbolic link: refused"):
        eng.apply()
    assert untouched(b) and target.read_text() == "keep\n"


@pytest.mark.parametrize("how", ["owner", "mode", "fifo"])
def test_a_host_lock_of_another_user_or_kind_is_refused(tmp_path, host_dir, how):
    lock = host_dir / "host.lock"
    if how == "fifo":
        os.mkfifo(lock, 0o600)
    else:
        lock.write_text("1\n")
        os.chown(lock, NOBODY, NOBODY) if how == "owner" else os.chmod(lock, 0o622)
    b, eng = apply(tmp_path / "st")
    want = {"owner": f"belongs to uid {NOBODY}", "mode": "writable by group or others",
            "fifo": "not a regular file"}[how]
    with pytest.raises(StateError, match=want):
        eng.apply()
    assert untouched(b)


@pytest.mark.parametrize("how", ["link", "owner", "mode"])
def test_a_host_directory_not_ours_is_refused(tmp_path, monkeypatch, how):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    d = tmp_path / "hostdir"
    if how == "link":
        d.symlink_to(real)
    else:
        d.mkdir(mode=0o700)
        os.chown(d, NOBODY, NOBODY) if how == "owner" else os.chmod(d, 0o777)
    monkeypatch.setenv("HKGPU_TUNE_HOST_DIR", str(d))
    b, eng = apply(tmp_path / "st")
    with pytest.raises(StateError, match="host directory"):
        eng.apply()
    assert untouched(b) and os.listdir(real) == []


def test_garbage_in_a_held_lock_is_never_printed(tmp_path, host_dir):
    """The holder's pid and state directory are shown only as digits and printable text."""
    lock = host_dir / "host.lock"
    lock.write_bytes(b"1; rm -rf /\n\x1b[2J/evil\x07dir\n")
    os.chmod(lock, 0o600)
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        code = ("import sys\nfrom hkgpu_tune.tune.state import State\n"
                "try:\n    State(sys.argv[1]).lock().__enter__()\nexcept Exception as e:\n    print(e)\n")
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "st")], capture_output=True,
                             text=True, timeout=30).stdout
    finally:
        os.close(fd)
    assert "holds the lock (pid unknown) with the state directory [2J/evildir" in out, out
    assert "\x1b" not in out and "\x07" not in out


def test_a_run_with_another_state_dir_gets_a_lock_error_at_once(tmp_path):
    """Another process holds the host lock for its own state directory: LockError naming it, not a
    wait, and nothing written, not even the state directory."""
    code = ("import sys, time\nfrom hkgpu_tune.tune.state import State\n"
            "with State(sys.argv[1]).lock():\n    print('held', flush=True); time.sleep(30)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "one")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        b, eng = apply(tmp_path / "two")
        with pytest.raises(LockError, match=rf"\(pid {holder.pid}\) with the state directory {tmp_path / 'one'};"):
            eng.apply()
        assert untouched(b) and not (tmp_path / "two").exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_linked_registry_is_refused_and_not_followed(tmp_path, host_dir):
    target = tmp_path / "target.json"
    target.write_text(json.dumps({"format": 1, "journals": []}))
    (host_dir / "journals.json").symlink_to(target)
    b, eng = apply(tmp_path / "st")
    with pytest.raises(StateError, match="journal registry is a symbolic link: refused"):
        eng.apply()
    assert untouched(b) and json.loads(target.read_text()) == {"format": 1, "journals": []}


@pytest.mark.parametrize("content", [b"not json", b"[]", b'{"format": 1, "journals": "x"}',
                                     b'{"format": 9, "journals": []}', b"[" * 100000, b"\xff\xfe"])
def test_a_garbage_registry_is_refused_with_one_line(tmp_path, host_dir, content):
    (host_dir / "journals.json").write_bytes(content)
    os.chmod(host_dir / "journals.json", 0o600)
    b, eng = apply(tmp_path / "st")
    with pytest.raises(StateError, match="not a hkgpu-tune journal registry") as e:
        eng.apply()
    assert "\n" not in str(e.value) and untouched(b)


@pytest.mark.parametrize("how", ["owner", "mode", "big"])
def test_a_registry_of_another_user_or_too_big_is_refused(tmp_path, host_dir, how):
    reg = host_dir / "journals.json"
    reg.write_text(json.dumps({"format": 1, "journals": []}) + (" " * (2 << 20) if how == "big" else ""))
    os.chmod(reg, 0o600)
    if how == "owner":
        os.chown(reg, NOBODY, NOBODY)
    elif how == "mode":
        os.chmod(reg, 0o666)
    b, eng = apply(tmp_path / "st")
    with pytest.raises(StateError, match={"owner": "belongs to uid", "mode": "writable by group or others",
                                          "big": "over"}[how]):
        eng.apply()
    assert untouched(b)


def test_the_cli_refuses_a_garbage_registry_with_one_line_and_exit_1(tmp_path, host_dir):
    (host_dir / "journals.json").write_text("garbage")
    os.chmod(host_dir / "journals.json", 0o600)
    prof = tmp_path / "p.yaml"
    prof.write_text("sysctl:\n  net.ipv4.tcp_ecn: 1\n")
    # in a namespace of its own: the sysctl is per namespace, and the host's is never touched
    ns = f"hkt-reg{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        before = subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.tcp_ecn"],
                                capture_output=True, text=True).stdout
        p = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "hkgpu_tune", "apply", "--profile",
                            str(prof), "--state-dir", str(tmp_path / "st")], capture_output=True, text=True, timeout=60)
        after = subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.tcp_ecn"],
                               capture_output=True, text=True).stdout
    finally:
        subprocess.run(["ip", "netns", "del", ns])
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and f"{host_dir}/journals.json: not a hkgpu-tune journal registry" in p.stderr
    assert before == after and before.strip() != "1"


def journal_with(tmp_path, name):
    """A real journal holding the profile's originals (applied to fake backends), made under a host
    directory of its own (so that several can hold the same settings)."""
    eng = Engine(parse_profile_text(PROFILE, "t.yaml"), state_dir=str(tmp_path / name), backends=host(),
                 host_dir=str(tmp_path / f"host-of-{name}"))
    assert not eng.apply().error
    return tmp_path / name


def registry(host_dir, listed):
    (host_dir / "journals.json").write_text(json.dumps({"format": 1, "journals": listed}))
    os.chmod(host_dir / "journals.json", 0o600)


def test_listed_directories_that_do_not_hold_are_ignored_and_dropped(tmp_path, host_dir):
    """A link to a real journal, one another user owns, one others can write, a relative path, a
    path with .., a number, a missing directory and one with no entries: none is read, the apply goes
    on, and the registry keeps only journals that hold."""
    real = journal_with(tmp_path, "real")
    other = journal_with(tmp_path, "other")        # then made foreign
    writable = journal_with(tmp_path, "writable")
    os.chown(other, NOBODY, NOBODY)
    os.chmod(writable, 0o777)
    link = tmp_path / "link"
    link.symlink_to(real)
    (tmp_path / "empty").mkdir(mode=0o700)
    listed = [str(link), str(other), str(writable), "relative/st", str(tmp_path / "x" / ".." / "real"), 7,
              str(tmp_path / "missing"), str(tmp_path / "empty")]
    registry(host_dir, listed)
    b, eng = apply(tmp_path / "mine")
    rep = eng.apply()                    # every one of these records the same settings: none is read
    assert not rep.error and b.net.links()[0]["mtu"] == 9000
    assert json.loads((host_dir / "journals.json").read_text())["journals"] == [str(tmp_path / "mine")]


def test_a_listed_journal_that_holds_is_read(tmp_path, host_dir):
    """The control of the test above: the same journal listed as itself refuses the apply."""
    registry(host_dir, [str(journal_with(tmp_path, "real"))])
    b, eng = apply(tmp_path / "mine")
    with pytest.raises(StateError, match=f"is recorded in the journal at {tmp_path / 'real'} "):
        eng.apply()
    assert untouched(b)


def test_a_listed_journal_that_is_not_valid_refuses_the_apply(tmp_path, host_dir):
    """A listed journal of ours whose content is broken: refused (its originals cannot be known),
    naming the file; nothing is written."""
    st = journal_with(tmp_path, "broken")
    (st / "state.json").write_text('{"format": 2, "entries": [{"kind": "command", "argv": ["rm"]}]}')
    registry(host_dir, [str(st)])
    b, eng = apply(tmp_path / "mine")
    with pytest.raises(StateError, match=f"{st}/state.json"):
        eng.apply()
    assert untouched(b)


def test_journals_from_before_the_registry_are_found(tmp_path, host_dir):
    """The default state directory (the host directory's own journal) counts without a registry."""
    own = journal_with(tmp_path, "x")                  # made elsewhere, then moved in as an older version's
    os.rename(own / "state.json", host_dir / "state.json")
    assert not (host_dir / "journals.json").exists()
    b, eng = apply(tmp_path / "mine")
    with pytest.raises(StateError, match=f"is recorded in the journal at {host_dir} "):
        eng.apply()
    assert untouched(b)


def test_a_broken_registry_never_stops_a_rollback(tmp_path, host_dir):
    """Rollback only removes entries: it restores everything and leaves the broken registry to be
    refused by the next apply."""
    b = host()
    eng = Engine(parse_profile_text(PROFILE, "t.yaml"), state_dir=str(tmp_path / "st"), backends=b)
    assert not eng.apply().error and b.net.links()[0]["mtu"] == 9000
    (host_dir / "journals.json").write_text("garbage")
    restored, errs = eng.rollback()
    assert restored and not errs and not (tmp_path / "st" / "state.json").exists()
    assert b.net.links()[0]["mtu"] == 1500 and b.sysctl.values["net.core.rmem_max"] == "212992"
    assert (host_dir / "journals.json").read_text() == "garbage"
    with pytest.raises(StateError, match="not a hkgpu-tune journal registry"):
        eng.apply()
