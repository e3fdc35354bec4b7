"""plan / apply (save originals first) / rollback (reverse order) / verify.

>>> eng = Engine(load_profile("hk-inference"), only=["sysctl"])   # doctest: +SKIP
>>> [r.status for r in eng.verify()]                               # doctest: +SKIP
['ok', 'drift', ...]
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field

from . import subsystems
from .backends import Backends
from .errors import HkError, StateError, UnsupportedError
from .report import ERROR, UNSUPPORTED, Change, Result

DEFAULT_STATE_DIR = "/var/lib/hkgpu-tune"
STATE_FILE = "state.json"


class State:
    """The originals of everything apply changed, on disk (atomic, root-only)."""

    def __init__(self, state_dir: str | None = None):
        self.dir = state_dir or os.environ.get("HKGPU_TUNE_STATE_DIR") or DEFAULT_STATE_DIR
        self.path = os.path.join(self.dir, STATE_FILE)

    def load(self) -> list[Change]:
        try:
            with open(self.path) as f:
                doc = json.load(f)
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as e:
            raise StateError(f"{self.path}: cannot read the saved originals: {e}") from None
        if doc.get("format") != 1:
            raise StateError(f"{self.path}: not a hkgpu-tune state file")
        return [Change.from_dict(c) for c in doc["changes"]]

    def save(self, changes: list[Change]) -> None:
        try:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".state.")
            with os.fdopen(fd, "w") as f:
                json.dump({"format": 1, "saved": time.time(), "changes": [c.to_dict() for c in changes]}, f,
                          indent=1, default=str)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
            dfd = os.open(self.dir, os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except PermissionError as e:
            raise HkError(f"{self.dir}: cannot write the state file: permission denied (run as root "
                          f"or pass --state-dir)", e.errno) from None
        except OSError as e:
            raise HkError(f"{self.dir}: cannot write the state file: {e.strerror}", e.errno) from None

    def clear(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


@dataclass
class ApplyReport:
    changes: list[Change] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)  # verify after apply
    error: str = ""
    rolled_back: bool = False


class Engine:
    """One run over the profile's subsystems. Backends are swappable (tests)."""

    def __init__(self, profile, only: list[str] | None = None, state_dir: str | None = None,
                 backends: Backends | None = None):
        self.profile = profile
        self.b = backends or Backends()
        self.state = State(state_dir)
        if only:
            bad = [n for n in only if n not in subsystems.ORDER]
            if bad:
                raise HkError(f"--only: unknown subsystem {', '.join(bad)} "
                              f"(have: {', '.join(subsystems.ORDER)})")
        # import only the subsystems this run needs: a section the profile lacks costs nothing
        names = [n for n in subsystems.for_sections(profile.sections) if not only or n in only]
        self.subs = [subsystems.get(n)(profile, self.b) for n in names]
        self.by_name = {s.name: s for s in self.subs}

    @staticmethod
    def _failed(sub, e: HkError) -> list[Result]:
        status = UNSUPPORTED if isinstance(e, UnsupportedError) else ERROR
        return [Result(sub.name, "-", "-", None, None, status, str(e))]

    def facts(self) -> dict:
        out = {}
        for s in self.subs:
            try:
                out[s.name] = s.facts()
            except HkError as e:
                out[s.name] = {"error": str(e)}
        return out

    def verify(self) -> list[Result]:
        res = []
        for s in self.subs:
            try:
                res += s.verify()
            except HkError as e:
                res += self._failed(s, e)
        return res

    def plan(self) -> tuple[list[Change], list[Result]]:
        changes, results = [], []
        for s in self.subs:
            try:
                c, r = s.plan()
            except HkError as e:
                c, r = [], self._failed(s, e)
            changes += c
            results += r
        return changes, results

    def apply(self, dry_run: bool = False) -> ApplyReport:
        changes, results = self.plan()
        rep = ApplyReport(changes=changes, results=results)
        if dry_run or not changes:
            if not dry_run:
                rep.results = self.verify()
            return rep
        saved = self.state.load()
        known = {c.ident for c in saved}
        done: list[Change] = []
        refused: dict[tuple, str] = {}
        stuck: list[Change] = []   # refused, and the original could not be put back either
        this_run: list[Change] = []
        try:
            for s in self.subs:
                mine = [c for c in changes if c.subsystem == s.name]
                if done or refused:
                    # earlier writes can change what this subsystem must do (more channels bring
                    # more transmit queues, each with a qdisc): plan it again, now
                    try:
                        mine = s.plan()[0]
                    except HkError:
                        mine = []   # verify reports it
                this_run += mine
                self._write(mine, saved, done, refused, stuck)
            rep.changes = this_run
            for s in self.subs:
                s.after_apply([c for c in done if c.subsystem == s.name])
        except HkError as e:
            rep.changes = this_run
            rep.error = str(e)
            errs = self._undo(done)
            rep.rolled_back = True
            if errs:
                rep.error += "; rollback also failed: " + "; ".join(m for _, m in errs)
            # keep the originals of earlier applies and of what could not be restored
            ours = {c.ident for c in this_run} - {c.ident for c, _ in errs} - {c.ident for c in stuck}
            keep = [c for c in saved if c.ident not in ours or c.ident in known]
            if keep:
                self.state.save(keep)
            else:
                self.state.clear()
            return rep
        rep.results = self.verify()
        for r in rep.results:
            if (r.subsystem, r.target, r.key) in refused and r.status == "drift":
                r.status, r.reason = UNSUPPORTED, refused[(r.subsystem, r.target, r.key)]
        return rep

    def _write(self, changes, saved, done, refused, stuck) -> None:
        # originals first: merge with what was saved before (keep the oldest original)
        have = {c.ident for c in saved}
        for c in changes:
            if c.ident not in have:
                saved.append(Change(c.subsystem, c.target, c.key, c.current, c.desired, c.data))
        if changes:
            self.state.save(saved)
        for c in changes:
            try:
                self.by_name[c.subsystem].apply(c)
            except UnsupportedError as e:
                # the kernel or driver would not take it: keep the original, go on
                refused[c.ident] = str(e)
                try:
                    self.by_name[c.subsystem].restore(c)
                except HkError:
                    stuck.append(c)
                continue
            c.applied = True
            done.append(c)

    def _undo(self, changes: list[Change]) -> list[tuple[Change, str]]:
        errs = []
        for c in reversed(changes):
            try:
                sub = self.by_name.get(c.subsystem) or self._sub(c.subsystem)
                sub.restore(c)
            except HkError as e:
                errs.append((c, f"{c.subsystem} {c.target} {c.key}: {e}"))
        return errs

    def _sub(self, name):
        if name not in subsystems.SECTION:
            raise StateError(f"the state file names subsystem {name!r}, which this version lacks")
        return subsystems.get(name)(self.profile, self.b)

    def rollback(self) -> tuple[list[Change], list[str]]:
        """Restore every saved original, newest first; works after a crash mid-apply."""
        saved = self.state.load()
        if not saved:
            return [], []
        errs = self._undo(saved)
        if errs:  # keep only what could not be restored
            self.state.save([c for c, _ in errs])
        else:
            self.state.clear()
        return saved, [m for _, m in errs]
