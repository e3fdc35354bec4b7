"""Root writing into a directory that a package owns part of (Debian's node_exporter textfile
directory sits under /var/lib/prometheus, owned by the system account `prometheus`).

The directory is opened one component at a time from /, never following a link
(O_NOFOLLOW|O_DIRECTORY, each open relative to the previous directory's descriptor), and every
write is made relative to the final descriptor. The rule (docs/security.md, "Writing under a
directory a system account owns"):
- every directory above it is owned by root, the user running the tool or a system account
  (uid 1..SYS_UID_MAX of /etc/login.defs), and no one else can write it;
- the directory itself is owned by root (or the user running the tool) and no one else can write it.
What the owner of an ancestor can still do is rename entries of its own tree: the descriptor then
names a root-owned directory inside that tree, never a path outside it, and nobody else can add,
swap or link a file in it.

>>> fd = open_dir("/var/lib/prometheus/node-exporter", "textfile directory")   # doctest: +SKIP
>>> write_at(fd, "hkgpu-tune.prom", b"up 1\\n", "/var/lib/prometheus/node-exporter")  # doctest: +SKIP
"""
from __future__ import annotations

import errno
import os
import stat

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.fsutil import _open_to_others

SYS_UID_MAX_DEFAULT = 999


def sys_uid_max(login_defs: str = "/etc/login.defs") -> int:
    """The highest uid of a system account (login.defs' SYS_UID_MAX, 999 when unset)."""
    try:
        with open(login_defs, errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "SYS_UID_MAX" and parts[1].isdigit():
                    return min(int(parts[1]), SYS_UID_MAX_DEFAULT)
    except OSError:
        pass
    return SYS_UID_MAX_DEFAULT


def _mode(st) -> str:
    return f"mode {stat.S_IMODE(st.st_mode):04o}, group {st.st_gid}"


def open_dir(path: str, what: str) -> int:
    """A descriptor of the directory `path` under the rule above; HkError naming the component
    and the reason otherwise."""
    if not isinstance(path, str) or not path:
        raise HkError(f"{path!r}: the {what} is not a path")
    path = os.path.normpath(os.path.abspath(path))
    mine = {0, os.geteuid()}
    system = range(1, sys_uid_max() + 1)
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    here = "/"
    try:
        for name in [p for p in path.split("/") if p]:
            st = os.fstat(fd)
            if st.st_uid not in mine and st.st_uid not in system:
                raise HkError(f"{here}: the directory above the {what} is owned by uid {st.st_uid}, "
                              f"not root or a system account: refused (that user could swap the {what})")
            if _open_to_others(st):
                raise HkError(f"{here}: the directory above the {what} is writable by other users "
                              f"({_mode(st)}): refused (they could swap the {what})")
            nxt = os.path.join(here, name)
            try:
                new = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                if e.errno == errno.ENOTDIR and _is_link(fd, name):   # O_DIRECTORY|O_NOFOLLOW on a link
                    e.errno = errno.ELOOP
                if e.errno == errno.ELOOP:
                    raise HkError(f"{nxt}: the {what} is a symbolic link or lies under one: refused "
                                  f"(name the directory itself)") from None
                if e.errno == errno.ENOENT:
                    raise HkError(f"{nxt}: the {what} does not exist (create it, or name another)") from None
                if e.errno == errno.ENOTDIR:
                    raise HkError(f"{nxt}: not a directory (the {what})") from None
                raise HkError(f"{nxt}: cannot open the {what}: {e.strerror}", e.errno) from None
            os.close(fd)
            fd, here = new, nxt
        st = os.fstat(fd)
        if st.st_uid not in mine:
            raise HkError(f"{path}: the {what} is owned by uid {st.st_uid}, not root: refused "
                          f"(its owner could link the file root writes anywhere)")
        if _open_to_others(st):
            raise HkError(f"{path}: the {what} is writable by other users ({_mode(st)}): refused")
        if os.fstatvfs(fd).f_flag & os.ST_RDONLY:
            raise HkError(f"{path}: the {what} is not writable (a read-only file system)")
        if not os.access(".", os.W_OK | os.X_OK, dir_fd=fd, effective_ids=os.access in os.supports_effective_ids):
            raise HkError(f"{path}: the {what} is not writable (permissions)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(dirfd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def write_at(dirfd: int, name: str, data, where: str, mode: int = 0o644) -> None:
    """Write `data` to `name` inside the open directory atomically: a temporary file made
    exclusively (O_EXCL|O_NOFOLLOW) beside it, fsync, rename, fsync of the directory. Only a
    regular file is ever replaced. `where` names the directory in errors."""
    if isinstance(data, str):
        data = data.encode()
    path = os.path.join(where, name)
    tmp = None
    try:
        _regular_or_absent(dirfd, name, path)
        for i in range(100):
            cand = f".{name}.{os.getpid()}.{i}.tmp"
            try:
                fd = os.open(cand, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                             dir_fd=dirfd)
            except FileExistsError:
                continue
            tmp = cand
            break
        else:
            raise HkError(f"{path}: cannot make a temporary file in {where}")
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        _regular_or_absent(dirfd, name, path)
        os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        tmp = None
        os.fsync(dirfd)
    except OSError as e:
        raise HkError(f"{path}: cannot write: {e.strerror}", e.errno) from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp, dir_fd=dirfd)
            except OSError:
                pass


def _regular_or_absent(dirfd: int, name: str, path: str) -> None:
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        kind = "a link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise HkError(f"{path}: refusing to replace it: it is {kind}")


def read_at(dirfd: int, name: str, limit: int) -> str | None:
    """Up to `limit` bytes of a regular file in the open directory (None: absent, a link, not regular)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode(errors="replace")
    finally:
        os.close(fd)
