"""The qdisc support cache (/run/hkgpu-tune/qdisc-support.json) that root reads back: a cache of
another owner, open to writing by others, of another shape, huge or a FIFO is ignored (the kernel
is asked again), never trusted, never a traceback or a hang; the answer is then written safely."""
import json
import os
import signal
import stat

import pytest

from hkgpu_tune.backends.netlink import Tc

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="probing a qdisc needs a network namespace (root)")

FAKE = "hknosuchqdisc"      # no kernel has it: the real probe answers unsupported


def cache(tmp_path, doc, mode=0o644, uid=None):
    d = tmp_path / "run"
    d.mkdir(mode=0o755, exist_ok=True)
    f = d / "qdisc-support.json"
    if doc == "fifo":
        os.mkfifo(f, 0o644)
    else:
        f.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        os.chmod(f, mode)
    if uid is not None:
        os.chown(f, uid, -1)
    tc = Tc()
    tc.cache_file = str(f)
    return tc, f


def boot():
    return Tc()._boot()


class Hung(BaseException):
    """Not an OSError: code that catches those cannot swallow it."""


def supported(tc):
    def late(*_):
        raise Hung("supported() still running after 10 s")
    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(10)
    try:
        return tc.supported(FAKE)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_a_cache_of_ours_is_used(tmp_path):
    tc, _ = cache(tmp_path, {"boot": boot(), "kinds": {FAKE: [True, "from the cache"]}})
    assert supported(tc) == (True, "from the cache")


@pytest.mark.parametrize("how", ["writable by others", "writable by the group", "another owner"])
def test_a_cache_others_could_write_is_not_trusted(tmp_path, how):
    doc = {"boot": boot(), "kinds": {FAKE: [True, ""]}}
    tc, f = cache(tmp_path, doc, mode={"writable by others": 0o646, "writable by the group": 0o664}.get(how, 0o644),
                  uid=65534 if how == "another owner" else None)
    ok, why = supported(tc)
    assert not ok and "unsupported" in why
    st = os.lstat(f)    # answered by the kernel and written back as ours
    assert st.st_uid == os.geteuid() and not st.st_mode & 0o022
    assert json.loads(f.read_text())["kinds"][FAKE][0] is False


def test_a_cache_in_a_directory_others_can_write_is_not_trusted(tmp_path):
    tc, f = cache(tmp_path, {"boot": boot(), "kinds": {FAKE: [True, ""]}})
    os.chmod(f.parent, 0o777)
    assert supported(tc)[0] is False


@pytest.mark.parametrize("doc", [
    "[1, 2]", '{"boot": 5, "kinds": {}}', "BOOT_LIST_KINDS", "BOOT_INT", "BOOT_STR_PAIR", "BOOT_BAD_BOOL",
    "not json", "\u00ff\u00fe", "DEEP", "fifo", "HUGE",
])
def test_a_cache_of_another_shape_is_ignored(tmp_path, doc):
    b = boot()
    doc = {"BOOT_LIST_KINDS": {"boot": b, "kinds": [FAKE]}, "BOOT_INT": {"boot": b, "kinds": {FAKE: 5}},
           "BOOT_STR_PAIR": {"boot": b, "kinds": {FAKE: "yes"}},
           "BOOT_BAD_BOOL": {"boot": b, "kinds": {FAKE: ["true", ""]}},
           "DEEP": "[" * 100000, "HUGE": json.dumps({"boot": b, "kinds": {FAKE: [True, "x" * (1 << 20)]}})}.get(doc, doc)
    tc, f = cache(tmp_path, doc)
    assert supported(tc)[0] is False
    if stat.S_ISREG(os.lstat(f).st_mode):
        assert json.loads(f.read_text())["kinds"][FAKE][0] is False


def test_a_link_is_neither_followed_nor_replaced(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text(json.dumps({"boot": boot(), "kinds": {FAKE: [True, ""]}}))
    (tmp_path / "run").mkdir()
    f = tmp_path / "run/qdisc-support.json"
    os.symlink(victim, f)
    tc = Tc()
    tc.cache_file = str(f)
    assert supported(tc)[0] is False
    assert os.path.islink(f) and json.loads(victim.read_text())["kinds"][FAKE][0] is True
