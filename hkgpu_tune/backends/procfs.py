"""/proc/sys and /sys."""
from __future__ import annotations

import errno
import os

from hkgpu_tune.core.errors import ApplyError, HkError, UnsupportedError


class ProcSys:
    """sysctl through /proc/sys (per network namespace for net.*: the caller's namespace)."""

    root = "/proc/sys"

    def path(self, key: str) -> str:
        return os.path.join(self.root, key.replace(".", "/"))

    def read(self, key: str) -> str | None:
        """The value as the kernel prints it, or None where the kernel has no such key."""
        try:
            with open(self.path(key)) as f:
                return f.read().strip()
        except FileNotFoundError:
            return None
        except PermissionError as e:
            raise HkError(f"sysctl {key}: cannot read: {e.strerror}", e.errno) from None

    def read_only(self, key: str) -> bool:
        """True where the kernel offers no write (global keys seen from a non-initial namespace)."""
        try:
            return not (os.stat(self.path(key)).st_mode & 0o222)
        except OSError:
            return False

    def write(self, key: str, value: str) -> None:
        try:
            with open(self.path(key), "w") as f:
                f.write(str(value))
        except FileNotFoundError:
            raise UnsupportedError(f"sysctl {key}: not in this kernel or namespace", errno.ENOENT) from None
        except OSError as e:
            if e.errno in (errno.EPERM, errno.EACCES):
                raise HkError(f"sysctl {key}: permission denied (run as root)", e.errno) from None
            if e.errno in (errno.ENOENT, errno.EINVAL, errno.EOPNOTSUPP):
                raise UnsupportedError(f"sysctl {key}={value}: rejected by the kernel ({e.strerror})", e.errno) from None
            raise ApplyError(f"sysctl {key}={value}: {e.strerror}", e.errno) from None


class SysFs:
    """Reads from /sys and /proc (devices, NUMA, interrupts); a root prefix lets tests replay trees."""

    def __init__(self, root: str = "/"):
        self.root = root

    def p(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def read(self, path: str) -> str | None:
        try:
            with open(self.p(path)) as f:
                return f.read().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write(self, path: str, value: str) -> None:
        with open(self.p(path), "w") as f:
            f.write(value)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self.p(path)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def readlink(self, path: str) -> str | None:
        try:
            return os.readlink(self.p(path))
        except OSError:
            return None

    def exists(self, path: str) -> bool:
        return os.path.exists(self.p(path))
