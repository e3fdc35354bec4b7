"""The one way this tool writes a file: a temporary file made exclusively in the destination's
directory, fsync of file and directory, then rename; links are never followed and nothing but a
regular file is ever replaced.

>>> atomic_write("/tmp/x.prom", b"up 1\\n", mode=0o644)   # doctest: +SKIP
"""
from __future__ import annotations

import os
import stat

from hkgpu_tune.core.errors import HkError


def _check_dest(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        kind = "a link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise HkError(f"{path}: refusing to replace it: it is {kind}")


def fsync_dir(directory: str) -> None:
    fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data, mode: int = 0o644, uid: int | None = None,
                 gid: int | None = None) -> None:
    """Write `data` (bytes, str, or a binary file object, copied in chunks) to `path` atomically.
    Raises HkError naming the path on any failure."""
    if isinstance(data, str):
        data = data.encode()
    directory = os.path.dirname(path) or "."
    _check_dest(path)
    tmp = None
    try:
        for i in range(100):
            cand = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{i}.tmp")
            try:
                fd = os.open(cand, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
            except FileExistsError:
                continue
            tmp = cand
            break
        else:
            raise HkError(f"{path}: cannot make a temporary file in {directory}")
        try:
            os.fchmod(fd, mode)
            if uid is not None or gid is not None:
                os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
            for chunk in iter(lambda: data.read(1 << 20), b"") if hasattr(data, "read") else (data,):
                view = memoryview(chunk)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        _check_dest(path)
        os.replace(tmp, path)
        tmp = None
        fsync_dir(directory)
    except PermissionError as e:
        raise HkError(f"{path}: cannot write: permission denied", e.errno) from None
    except OSError as e:
        raise HkError(f"{path}: cannot write: {e.strerror}", e.errno) from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
