"""The one way this tool writes a file: a temporary file made exclusively in the destination's
directory, fsync of file and directory, then rename; links are never followed and nothing but a
regular file is ever replaced. And the one way it reads a file it did not make (read_regular).

>>> atomic_write("/tmp/x.prom", b"up 1\\n", mode=0o644)   # doctest: +SKIP
"""
from __future__ import annotations

import errno as _errno
import os
import stat

from hkgpu_tune.core.errors import HkError


class FileRefused(Exception):
    """Why read_regular did not read a file. kind: "missing", "link" (not followed), "unreadable"
    (strerror, errno), "not regular", "too large" (size: from fstat), "grew" (past the limit while
    read). Each caller words it in its own error."""

    def __init__(self, kind: str, path: str, strerror: str = "", errno: int | None = None, size: int = 0):
        super().__init__(f"{path}: {kind}{': ' + strerror if strerror else ''}")
        self.kind, self.path, self.strerror, self.errno, self.size = kind, path, strerror, errno, size


def read_regular(path: str, limit: int, follow: bool = True, check=None) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, read safely: opened without blocking
    (a FIFO or a device is refused on the open descriptor, never waited on), a last link followed
    only when `follow`, `check(st)` run on the descriptor's stat (it may raise), and read to
    limit + 1 so that a file growing past the limit is refused, never cut. FileRefused otherwise.

    >>> read_regular("/etc/hostname", 4096)   # doctest: +SKIP
    b'node1\\n'
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as e:
        raise FileRefused("missing", path, e.strerror, e.errno) from None
    except OSError as e:
        raise FileRefused("link" if e.errno == _errno.ELOOP and not follow else "unreadable", path, e.strerror,
                          e.errno) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused("not regular", path)
        if check is not None:
            check(st)
        if st.st_size > limit:
            raise FileRefused("too large", path, size=st.st_size)
        chunks, total = [], 0
        while total <= limit:
            b = os.read(fd, limit + 1 - total)
            if not b:
                break
            chunks.append(b)
            total += len(b)
    except OSError as e:
        raise FileRefused("unreadable", path, e.strerror, e.errno) from None
    finally:
        os.close(fd)
    if total > limit:
        raise FileRefused("grew", path, size=total)
    return b"".join(chunks)


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



def _open_to_others(st: os.stat_result) -> bool:
    """Writable by a user other than root and the owner: world-writable, or group-writable with a
    group other than root's. A root-owned sticky directory (/tmp) is not: others may add entries
    but never replace one they do not own."""
    if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid == 0:
        return False
    return bool(st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != 0))


def _prefixes(path: str) -> list[str]:
    parts = os.path.normpath(path).split("/")[1:]
    return ["/"] + ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1) if parts[i - 1]]


def untrusted_reason(path: str, what: str = "file") -> str | None:
    """Why root must not run, source, copy into /etc, kill on the word of, or act on `path` (None:
    it may). One rule for every surface: every component of the path, each link on it, and every
    component of what it resolves to is owned by root or the user running the tool, and no one
    else can write it (a root-owned sticky directory such as /tmp excepted)."""
    owners = {0, os.geteuid()}
    if not isinstance(path, str) or not os.path.isabs(path):
        return f"{path}: the {what} is not an absolute path"
    real = os.path.realpath(path)
    seen = set()
    for p in _prefixes(path) + _prefixes(real):
        if p in seen:
            continue
        seen.add(p)
        kind = what if p in (os.path.normpath(path), real) else "directory"
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return f"{p}: the {kind} does not exist"
        except OSError as e:
            return f"{p}: cannot check the {kind}: {e.strerror}"
        if st.st_uid not in owners:
            return f"{p}: the {kind} is owned by uid {st.st_uid}, not root"
        if not stat.S_ISLNK(st.st_mode) and _open_to_others(st):
            return (f"{p}: the {kind} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}, "
                    f"group {st.st_gid})")
    return None


def program_refusal(path: str) -> str | None:
    """Why root must not run the program at `path` found on PATH (None: it may, or not root)."""
    if os.geteuid() != 0:
        return None
    why = untrusted_reason(os.path.abspath(path), "program")
    return f"{why}: refused (root runs only programs no other user owns or can write)" if why else None


def ensure_trusted_dir(path: str, what: str = "directory") -> str:
    """Make `path` (and what is missing above it) where root may write: each existing component is
    checked by the trust rule before anything is made below it, so a link or a directory another
    user planted on the way is refused before root writes through it. Returns the path."""
    path = os.path.abspath(path)
    for p in _prefixes(path):
        try:
            os.lstat(p)
        except FileNotFoundError:
            try:
                os.mkdir(p, 0o755)
            except FileExistsError:
                pass
            except OSError as e:
                raise HkError(f"{p}: cannot make the {what}: {e.strerror}", e.errno) from None
        why = untrusted_reason(p, what if p == path else "directory")
        if why:
            raise HkError(f"{why}: refused (root writes only where no other user can change the path)")
    return path


def check_trusted(path: str, what: str = "file", error=HkError) -> None:
    """untrusted_reason() as an exception (HkError unless `error` names another)."""
    why = untrusted_reason(path, what)
    if why:
        raise error(f"{why}: refused (root acts only on what no other user owns or can write)")


class _Pinned:
    """A file read in chunks while its sha256 is taken; at the end, HkError unless it is `sha256`."""

    def __init__(self, f, path: str, sha256: str, what: str):
        import hashlib
        self.f, self.path, self.want, self.what = f, path, sha256, what
        self.h = hashlib.sha256()

    def read(self, n: int) -> bytes:
        chunk = self.f.read(n)
        if chunk:
            self.h.update(chunk)
        elif self.h.hexdigest() != self.want:
            raise HkError(f"{self.what}: {self.path} has sha256 {self.h.hexdigest()}, not the {self.want} pinned")
        return chunk


def open_regular(path: str, what: str):
    """A binary file object for a regular file (a link is followed; a FIFO, device or directory is refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise HkError(f"{what}: {path}: cannot read: {e.strerror}", e.errno) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise HkError(f"{what}: {path}: not a regular file")
    return os.fdopen(fd, "rb")


def copy_pinned(src: str, dst: str, sha256: str, what: str, mode: int = 0o644) -> None:
    """Copy src to dst (atomic_write) only if its content has the sha256 the caller pins: the bytes
    hashed are the bytes written, so a file swapped or altered meanwhile never lands. Content pinned by
    a trusted profile needs no trusted owner; nothing else is read from src."""
    with open_regular(src, what) as f:
        atomic_write(dst, _Pinned(f, src, sha256, what), mode)
