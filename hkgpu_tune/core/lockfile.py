"""The files the tool keeps for itself: a lock file held with flock (the state directory's and the
host's) and private files read back (state, registry, health state). Opened without following a
link, a regular file the caller trusts, the holder's record written in it, re-entrant within one
process (apply then persist take it twice). A kill releases it."""
from __future__ import annotations

import errno
import fcntl
import os
import stat
from contextlib import contextmanager

from hkgpu_tune.core.errors import HkError, StateError
from hkgpu_tune.core.fsutil import FileRefused, read_regular

# per process: lock path -> [fd, depth]
_held: dict[str, list] = {}


def holding(path: str) -> bool:
    """Whether this process holds the lock at `path` already."""
    return path in _held


class Busy(Exception):
    """Another process holds the lock; `record` is what it wrote in the file (untrusted bytes)."""

    def __init__(self, record: bytes):
        super().__init__("busy")
        self.record = record


@contextmanager
def hold(path: str, what: str, record: str, refusal):
    """Hold the lock at `path` (non-blocking: Busy when another process has it). `refusal(path,
    st, what)` says why the opened file is not to be trusted (None: it is)."""
    held = _held.get(path)
    if held:
        held[1] += 1
        try:
            yield
        finally:
            held[1] -= 1
        return
    try:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        except OSError as e:
            if e.errno != errno.EROFS:
                raise
            # a read-only directory: an existing lock file still locks (flock needs no write access),
            # so a rollback can restore the host when its journal cannot be rewritten
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StateError(f"{path}: the {what} is a symbolic link: refused") from None
        raise HkError(f"{path}: cannot open the {what}: {e.strerror}", e.errno) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StateError(f"{path}: the {what} is not a regular file: refused")
        why = refusal(path, st, what)
        if why:
            raise StateError(why)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(os.pread(fd, 4200, 0)) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, record.encode(), 0)
        except OSError:
            pass   # the holder's record is for people; a full or read-only disk still locks
    except BaseException:
        os.close(fd)
        raise
    _held[path] = [fd, 1]
    try:
        yield
    finally:
        del _held[path]
        os.close(fd)   # releases the lock


def read_private(path: str, what: str, max_bytes: int, refusal) -> bytes | None:
    """The bytes of a file the tool keeps for itself (state, registry, health state); None when it
    is missing. A link, a non-regular file, one `refusal(path, st, what)` names, or one over
    `max_bytes` is a StateError, never half-read."""
    def check(st):
        why = refusal(path, st, what)
        if why:
            raise StateError(why)
    try:
        return read_regular(path, max_bytes, follow=False, check=check)
    except FileRefused as e:
        if e.kind == "missing":
            return None
        raise StateError({"link": f"{path}: the {what} is a symbolic link: refused",
                          "unreadable": f"{path}: cannot read the {what}: {e.strerror}",
                          "not regular": f"{path}: the {what} is not a regular file: refused",
                          "too large": f"{path}: the {what} is {e.size} bytes, over the {max_bytes} allowed: refused",
                          "grew": f"{path}: the {what} grew over {max_bytes} bytes: refused"}[e.kind]) from None
