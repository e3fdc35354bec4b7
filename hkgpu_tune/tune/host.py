"""One lock and one registry of journals per host, whatever state directory a run names.

Every apply, rollback, persist and health run takes the host lock before its state directory's
own lock, so two runs with different state directories never work on the host at once. The
registry lists the state directories whose journal holds entries; apply refuses to save, as an
original, a setting that another journal already recorded (it would save the first run's write
as the "original" and the two rollbacks would fight).

Both live in the host directory, /var/lib/hkgpu-tune (root's, not writable by anyone else, so
no other user can plant or hold the lock file; a world-writable place such as /run/lock would let
any user create it first). HKGPU_TUNE_HOST_DIR names another one: for several simulated hosts
that share one kernel (tests), never for a second journal on a real host.

>>> h = Host()                                  # doctest: +SKIP
>>> with h.lock("/srv/state"):                  # doctest: +SKIP
...     h.journals(exclude="/srv/state")
"""
from __future__ import annotations

import errno
import json
import os
import stat
from contextlib import contextmanager

from hkgpu_tune.core import lockfile
from hkgpu_tune.core.errors import HkError, LockError, StateError
from hkgpu_tune.core.fsutil import atomic_write, untrusted_reason

DEFAULT_HOST_DIR = "/var/lib/hkgpu-tune"
LOCK_FILE = "host.lock"
REGISTRY_FILE = "journals.json"
STATE_FILE = "state.json"
MAX_BYTES = 1024 * 1024
MAX_DIRS = 1000

def owned_problem(path: str, st: os.stat_result, what: str) -> str | None:
    """Why `path` (stat st) is not ours to trust: another owner, or writable by group or others."""
    euid = os.geteuid()
    if st.st_uid != euid:
        return (f"{path}: the {what} belongs to uid {st.st_uid}, not to the user running "
                f"hkgpu-tune (uid {euid}): refused")
    if st.st_mode & 0o022:
        return (f"{path}: the {what} is writable by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):04o}): refused (chmod go-w it)")
    return None


def _printable(b: bytes, n: int) -> str:
    return "".join(ch for ch in b.decode("utf-8", "replace") if ch.isprintable())[:n]


def _same_dir(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class Host:
    """The host directory: its lock and its registry of journals."""

    def __init__(self, host_dir: str | None = None):
        d = host_dir or os.environ.get("HKGPU_TUNE_HOST_DIR") or DEFAULT_HOST_DIR
        self.dir = os.path.abspath(d)
        self.lock_path = os.path.join(self.dir, LOCK_FILE)
        self.registry = os.path.join(self.dir, REGISTRY_FILE)

    # ------------------------------------------------------------ the directory
    def check_dir(self) -> None:
        """Make the host directory if it is missing (0700); refuse a link, a non-directory, one
        not ours, or one any other user can write (or any directory above it)."""
        try:
            st = os.lstat(self.dir)
        except FileNotFoundError:
            try:
                os.makedirs(os.path.dirname(self.dir), mode=0o755, exist_ok=True)
                os.mkdir(self.dir, 0o700)
                os.chmod(self.dir, 0o700)
            except FileExistsError:
                pass
            except OSError as e:
                why = "permission denied (run as root)" if e.errno in (errno.EACCES, errno.EPERM) else e.strerror
                raise HkError(f"{self.dir}: cannot make the host directory: {why}", e.errno) from None
            st = os.lstat(self.dir)
        except OSError as e:
            raise StateError(f"{self.dir}: cannot read the host directory: {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise StateError(f"{self.dir}: the host directory is a symbolic link: refused")
        if not stat.S_ISDIR(st.st_mode):
            raise StateError(f"{self.dir}: the host directory is not a directory: refused")
        why = owned_problem(self.dir, st, "host directory") or untrusted_reason(self.dir, "host directory")
        if why:
            raise StateError(why if why.endswith("refused") else why + ": refused")

    # ------------------------------------------------------------ the lock
    @contextmanager
    def lock(self, state_dir: str):
        """Hold the host lock (non-blocking: another holder is a LockError naming its pid and its
        state directory). Re-entrant within one process."""
        if not lockfile.holding(self.lock_path):
            self.check_dir()
        try:
            with lockfile.hold(self.lock_path, "host lock file",
                               f"{os.getpid()}\n{os.path.abspath(state_dir)}\n", owned_problem):
                yield
        except lockfile.Busy as e:
            lines = e.record.split(b"\n")
            pid = lines[0].strip().decode("ascii", "replace")
            other = _printable(lines[1], 300) if len(lines) > 1 else ""
            raise LockError(f"{self.lock_path}: another hkgpu-tune apply, rollback, persist or health run holds "
                            f"the lock (pid {pid if pid.isdigit() else 'unknown'}) with the state directory "
                            f"{other or 'unknown'}; try again when it has finished") from None

    # ------------------------------------------------------------ the registry
    def _read_registry(self) -> list | None:
        """The listed directories as stored (None: no registry yet). Refuses a link, a file not
        ours, an oversized one or one that is not a registry."""
        path = self.registry
        data = lockfile.read_private(path, "journal registry", MAX_BYTES, owned_problem)
        if data is None:
            return None
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict) or doc.get("format") != 1 or not isinstance(doc.get("journals"), list):
            raise StateError(f"{path}: not a hkgpu-tune journal registry (format 1, a list 'journals'): "
                             "refused; nothing was changed")
        return doc["journals"]

    @staticmethod
    def _valid(d) -> bool:
        """A listed directory is kept only when it is an absolute, plain path to a directory of ours
        (not a link, not writable by others) whose journal has entries (state.json)."""
        if not isinstance(d, str) or not d.startswith("/") or "\0" in d or len(d) > 4096 or os.path.normpath(d) != d:
            return False
        try:
            st = os.lstat(d)
            sf = os.lstat(os.path.join(d, STATE_FILE))
        except OSError:
            return False
        return (stat.S_ISDIR(st.st_mode) and owned_problem(d, st, "") is None and stat.S_ISREG(sf.st_mode)
                and sf.st_size > 0)

    def journals(self, exclude: str | None = None) -> list[str]:
        """The state directories whose journal holds entries (each re-validated; `exclude`: not this
        one). The host directory's own journal (the default state directory's) always counts, also
        one an older version wrote before there was a registry."""
        listed = self._read_registry() or []
        out = []
        for d in [self.dir] + listed[:MAX_DIRS]:
            if self._valid(d) and d not in out and not (exclude and _same_dir(d, exclude)):
                out.append(d)
        return out

    def note(self, state_dir: str, has_entries: bool) -> None:
        """Record (or drop) state_dir in the registry; entries that no longer hold are dropped too.
        Called under the host lock. A registry that cannot be read is refused when adding (apply
        refused it before writing anything) and left alone when dropping (rollback goes on; the next
        apply refuses it, naming it)."""
        try:
            listed = self._read_registry()
        except StateError:
            if has_entries:
                raise
            return
        d = os.path.abspath(state_dir)
        keep = [x for x in (listed or [])[:MAX_DIRS] if self._valid(x) and not _same_dir(x, d)]
        if has_entries:
            keep.append(d)
        keep = list(dict.fromkeys(keep))
        if listed is None and not keep:
            return
        if listed == keep:
            return
        self.check_dir()
        atomic_write(self.registry, json.dumps({"format": 1, "tool": "hkgpu-tune", "journals": keep}, indent=1) + "\n",
                     mode=0o600)
