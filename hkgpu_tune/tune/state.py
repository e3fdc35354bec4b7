"""The state directory: state.json (the saved originals, typed and validated entries) and its lock.

Nothing on disk is trusted: the directory must belong to the user running the tool and not be
writable by group or others; state.json must be a regular file of ours (not a link), of bounded
size, and every entry must pass its setting type's validation, or the whole file is refused
before anything is written.

>>> st = State("/var/lib/hkgpu-tune")          # doctest: +SKIP
>>> with st.lock():                              # doctest: +SKIP
...     changes = st.load()
"""
from __future__ import annotations

import errno
import json
import os
import stat
import time
from contextlib import contextmanager

from hkgpu_tune.tune import settings
from hkgpu_tune.core import lockfile
from hkgpu_tune.core.errors import HkError, LockError, StateError
from hkgpu_tune.core.fsutil import atomic_write
from hkgpu_tune.core.report import Change
from hkgpu_tune.tune.host import Host, owned_problem

DEFAULT_STATE_DIR = "/var/lib/hkgpu-tune"
STATE_FILE = "state.json"
LOCK_FILE = "lock"
MAX_BYTES = 16 * 1024 * 1024
LOG_MAX = 500          # journal events kept in the file (the latest)

def _check_owned(path: str, st: os.stat_result, what: str) -> None:
    why = owned_problem(path, st, what)
    if why:
        raise StateError(why)


class State:
    """The originals of everything apply changed, on disk (atomic, owner-only)."""

    def __init__(self, state_dir: str | None = None, host_dir: str | None = None):
        d = state_dir or os.environ.get("HKGPU_TUNE_STATE_DIR") or DEFAULT_STATE_DIR
        self.dir = os.path.abspath(d)
        self.host = Host(host_dir)    # the host-wide lock and registry of journals (tune/host.py)
        self.path = os.path.join(self.dir, STATE_FILE)
        self.log: list[dict] = []     # the journal's events, kept with the entries

    # ------------------------------------------------------------ the directory
    def check_dir(self, create: bool = False) -> bool:
        """True when the directory exists and is trusted; False when it is missing (and not made).
        Raises StateError for a link, a non-directory, a foreign owner or a group/world-writable mode."""
        try:
            st = os.lstat(self.dir)
        except FileNotFoundError:
            if not create:
                return False
            try:
                os.makedirs(os.path.dirname(self.dir), mode=0o755, exist_ok=True)
                os.mkdir(self.dir, 0o700)
                os.chmod(self.dir, 0o700)
            except FileExistsError:
                pass
            except PermissionError as e:
                raise HkError(f"{self.dir}: cannot make the state directory: permission denied (run as root "
                              f"or pass --state-dir)", e.errno) from None
            except OSError as e:
                raise HkError(f"{self.dir}: cannot make the state directory: {e.strerror}", e.errno) from None
            st = os.lstat(self.dir)
        except OSError as e:
            raise StateError(f"{self.dir}: cannot read the state directory: {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise StateError(f"{self.dir}: the state directory is a symbolic link: refused")
        if not stat.S_ISDIR(st.st_mode):
            raise StateError(f"{self.dir}: the state directory is not a directory: refused")
        _check_owned(self.dir, st, "state directory")
        return True

    # ------------------------------------------------------------ the lock
    lock_wait_s: float = 0.0   # how long lock() waits for another holder (apply/rollback --lock-wait)

    @contextmanager
    def lock(self):
        """Hold the host lock, then the state directory's lock: one apply, rollback, persist or
        health run per host at a time, whatever state directory each names. Another holder: wait
        up to lock_wait_s, then a LockError naming its pid."""
        from contextlib import ExitStack
        deadline = time.monotonic() + max(0.0, float(self.lock_wait_s))
        while True:
            stack = ExitStack()
            try:
                stack.enter_context(self.host.lock(self.dir))
                self.check_dir(create=True)     # made only once the host lock is ours
                stack.enter_context(self._dir_lock())
            except LockError:
                stack.close()
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
                continue
            except BaseException:
                stack.close()
                raise
            break
        with stack:
            yield

    @contextmanager
    def _dir_lock(self):
        path = os.path.join(self.dir, LOCK_FILE)
        try:
            with lockfile.hold(path, "lock file", f"{os.getpid()}\n", owned_problem):
                self._drop_temps()
                yield
        except lockfile.Busy as e:
            pid = e.record.split(b"\n")[0].strip().decode("ascii", "replace")
            raise LockError(f"{self.dir}: another hkgpu-tune apply, rollback or health run holds the lock "
                            f"(pid {pid if pid.isdigit() else 'unknown'}); try again when it has finished") from None

    def _drop_temps(self) -> None:
        """Temporary files a killed writer left in the directory (atomic_write's .NAME.PID.N.tmp):
        under the lock no one else is writing, so every one is stale. Regular files only."""
        import re
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for n in names:
            if re.fullmatch(r"\.[^/]+\.[0-9]+\.[0-9]+\.tmp", n):
                path = os.path.join(self.dir, n)
                try:
                    if stat.S_ISREG(os.lstat(path).st_mode):
                        os.unlink(path)
                except OSError:
                    pass

    # ------------------------------------------------------------ state.json
    def _read(self) -> bytes | None:
        if not self.check_dir():
            return None
        return lockfile.read_private(self.path, "state file", MAX_BYTES, owned_problem)

    def load(self) -> list[Change]:
        """The saved originals, oldest first; [] when there are none. Refuses the whole file when
        anything in it is malformed, foreign or fails validation."""
        data = self._read()
        if data is None:
            self.log = []
            return []
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise StateError(f"{self.path}: not valid JSON ({e}): refused; nothing was changed") from None
        if not isinstance(doc, dict) or doc.get("format") not in (1, 2):
            raise StateError(f"{self.path}: not a hkgpu-tune state file (format 1 or 2 expected): "
                             "refused; nothing was changed")
        key = "changes" if doc["format"] == 1 else "entries"
        items = doc.get(key)
        if not isinstance(items, list):
            raise StateError(f"{self.path}: '{key}' is not a list: refused; nothing was changed")
        out = []
        for i, e in enumerate(items):
            try:
                c = settings.from_v1(e) if doc["format"] == 1 else settings.from_entry(e)
            except ValueError as err:
                raise StateError(f"{self.path}: {key}[{i}]{settings.describe(e)}: {err}: refused; "
                                 "nothing was changed") from None
            out.append(c)
        log = doc.get("log", [])
        self.log = log[-LOG_MAX:] if isinstance(log, list) else []
        return out

    def save(self, changes: list[Change], register: bool = True) -> None:
        """Write the entries (and the journal's events); no entries left: the file is removed and
        the directory leaves the host's registry. register: list it there (apply; a rollback, which
        only removes entries, does not need the registry and works when it is broken)."""
        if not changes:
            self.clear()
            return
        self.check_dir(create=True)
        entries = []
        for c in changes:
            try:
                entries.append(settings.to_entry(c))
            except ValueError as e:
                raise StateError(f"{self.path}: will not save {c.subsystem} {c.target} {c.key}: {e} "
                                 "(a setting no type allows)") from None
        doc = {"format": 2, "tool": "hkgpu-tune", "saved": time.time(), "entries": entries,
               "log": self.log[-LOG_MAX:]}
        atomic_write(self.path, json.dumps(doc, indent=1, default=str) + "\n", mode=0o600)
        if register:
            self.host.note(self.dir, True)

    def clear(self) -> None:
        if not self.check_dir():
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return
        except OSError as e:
            raise HkError(f"{self.path}: cannot remove: {e.strerror}", e.errno) from None
        from hkgpu_tune.core.fsutil import fsync_dir
        fsync_dir(self.dir)
        self.host.note(self.dir, False)
