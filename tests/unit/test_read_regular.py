"""core/fsutil.read_regular: the one safe reader of files the tool did not make (profiles, network
managers' files, snapshots, state). Each refusal on real files: a FIFO (never waited on), a link,
a directory, a file over the limit; and the callers' words for them are unchanged."""
import os
import threading

import pytest

from hkgpu_tune.core.errors import HkError, ProfileError, StateError
from hkgpu_tune.core.fsutil import FileRefused, read_regular


def test_a_regular_file_is_read_whole(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 10)
    assert read_regular(str(tmp_path / "f"), 10) == b"x" * 10


@pytest.mark.parametrize("make, follow, kind", [
    (lambda p: os.mkfifo(p), True, "not regular"),
    (lambda p: os.mkdir(p), True, "not regular"),
    (lambda p: os.symlink("/etc/hostname", p), False, "link"),
    (lambda p: p.write_bytes(b"x" * 11), True, "too large"),
    (lambda p: None, True, "missing"),
])
def test_each_refusal(tmp_path, make, follow, kind):
    p = tmp_path / "f"
    make(p)
    done = []
    t = threading.Thread(daemon=True, target=lambda: done.append(pytest.raises(FileRefused, read_regular, str(p), 10,
                                                                  follow=follow)))
    t.start()
    t.join(10)
    assert done, "read_regular blocked (a FIFO must be refused, never waited on)"
    assert done[0].value.kind == kind


def test_check_runs_on_the_open_file(tmp_path):
    (tmp_path / "f").write_text("x")

    def refuse(st):
        raise StateError(f"uid {st.st_uid}")
    with pytest.raises(StateError, match=f"uid {os.getuid()}"):
        read_regular(str(tmp_path / "f"), 10, check=refuse)


def test_the_callers_keep_their_words(tmp_path):
    from hkgpu_tune.baseline.compare import SnapshotError, load
    from hkgpu_tune.core.lockfile import read_private
    from hkgpu_tune.core.profile import read_profile_file
    from hkgpu_tune.tune.persist import _read_config, _read_regular
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    os.symlink(fifo, link)
    with pytest.raises(ProfileError, match="not a regular file: a profile must be a plain file"):
        read_profile_file(fifo)
    with pytest.raises(ProfileError, match="no such profile file"):
        read_profile_file(tmp_path / "none.yaml")
    with pytest.raises(HkError, match="fifo: not a regular file: refused"):
        _read_config(str(fifo))
    with pytest.raises(HkError, match="link: cannot read: Too many levels of symbolic links"):
        _read_regular(str(link))
    with pytest.raises(SnapshotError, match="fifo: not a regular file"):
        load(str(fifo))
    with pytest.raises(StateError, match="the state file is a symbolic link: refused"):
        read_private(str(link), "state file", 100, lambda *a: None)
    assert read_private(str(tmp_path / "none"), "state file", 100, lambda *a: None) is None
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(StateError, match="the state file is 101 bytes, over the 100 allowed: refused"):
        read_private(str(big), "state file", 100, lambda *a: None)
