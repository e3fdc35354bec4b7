"""One transaction over the state file: each original saved before its write, each write, each
refusal and each undo, recorded as it happens.

An apply (or `--persist`) opens one Journal under the state directory's lock:

>>> j = Journal(State(d))                      # doctest: +SKIP
>>> j.originals(changes)                       # on disk before anything is written
>>> j.wrote(c) / j.refused(c, why, put_back)   # per change
>>> j.checked(sub, name, error)                # each check of the transaction (the MTU proof)
>>> j.undo_run(restore)                        # on failure: this run's writes, newest first

The oldest original of a setting is the one kept: a second apply never replaces what the first
saved. Entries of earlier runs are never dropped by this one (their originals are older).
"""
from __future__ import annotations

import time
from typing import Callable

from hkgpu_tune.core.errors import HkError, StateError
from hkgpu_tune.core.place import same_setting
from hkgpu_tune.core.report import Change
from hkgpu_tune.tune.state import State


class Journal:
    def __init__(self, state: State):
        self.state = state
        self.entries: list[Change] = state.load()    # every saved original, oldest first
        self.earlier = {c.setting for c in self.entries}
        self.earlier_entries = list(self.entries)
        self.this_run: list[Change] = []
        self.written: list[Change] = []
        self.refusals: dict[tuple, str] = {}
        self.stuck: list[Change] = []     # refused, and the original could not be put back either
        self.save_error: str = ""         # the state file could not be rewritten while undoing (a full disk)

    # ------------------------------------------------------------ events
    def _log(self, event: str, c: Change, detail: str = "") -> None:
        e = {"t": round(time.time(), 3), "event": event, "subsystem": c.subsystem, "target": c.target,
             "key": c.key}
        if detail:
            e["detail"] = detail[:500]
        self.state.log.append(e)

    def _entry(self, c: Change) -> Change | None:
        """c's saved entry: the same setting in the same place (a replaced device or another
        namespace is another setting); an entry saved before places were kept matches by name."""
        return next((e for e in self.entries if same_setting(e, c)), None)

    def save(self) -> None:
        self.state.save(self.entries)

    def refuse_recorded_elsewhere(self, changes: list[Change]) -> None:
        """StateError when a setting this journal would save a new original of is already in
        another state directory's journal on this host: that journal's "original" is the true
        one, and this one would save the other run's write as its own."""
        new = [c for c in changes if self._entry(c) is None]
        if not new:
            return
        for d in self.state.host.journals(exclude=self.state.dir):
            other = State(d, host_dir=self.state.host.dir).load()
            for c in new:
                e = next((e for e in other if same_setting(e, c)), None)
                if e is not None:
                    raise StateError(f"{c.subsystem} {c.target} {c.key} is recorded in the journal at {d} "
                                     f"(original {repr(e.current)[:80]}): apply with --state-dir {d} or roll it "
                                     "back there first")

    def originals(self, changes: list[Change]) -> None:
        """Save the originals of `changes` (the oldest one wins), on disk before any is written."""
        self.refuse_recorded_elsewhere(changes)
        for c in changes:
            self.this_run.append(c)
            if self._entry(c) is None:
                self.entries.append(Change(c.subsystem, c.target, c.key, c.current, c.desired, dict(c.data)))
                self._log("original", c, repr(c.current)[:200])
        if changes:
            self.save()

    def update(self, c: Change) -> None:
        """Replace the saved entry of c's setting (persist: the content hashes it wrote) and save."""
        e = self._entry(c)
        if e is None:
            self.refuse_recorded_elsewhere([c])
            self.entries.append(c)
        else:
            self.entries[self.entries.index(e)] = c
        self.save()

    def wrote(self, c: Change) -> None:
        c.applied = True
        self.written.append(c)
        e = self._entry(c)
        if e is not None:
            e.applied = True
        self._log("write", c, repr(c.desired)[:200])

    def checked(self, subsystem: str, name: str, error: str = "") -> None:
        """A check of the transaction passed (or failed, with the reason): kept in the log."""
        e = {"t": round(time.time(), 3), "event": "check-failed" if error else "check", "subsystem": subsystem,
             "target": "-", "key": name}
        if error:
            e["detail"] = error[:500]
        self.state.log.append(e)

    def refused(self, c: Change, why: str, put_back: bool) -> None:
        """The kernel or driver would not take c. Put back: its entry goes (unless an earlier run
        saved it); not put back: the original stays for a later rollback."""
        self.refusals[c.ident] = why
        self._log("refused", c, why)
        if put_back:
            self._drop(c)
        else:
            self.stuck.append(c)
            self._log("undo-failed", c, "the original could not be put back")
            self.save()

    def _drop(self, c: Change) -> None:
        if c.setting in self.earlier or any(same_setting(e, c) for e in self.earlier_entries):
            return
        e = self._entry(c)
        if e is not None:
            self.entries.remove(e)
            self._save_undoing()

    def _save_undoing(self) -> None:
        """Save while undoing: a state file that cannot be rewritten (a full or read-only
        directory) never stops the undo; the failure is kept for the report. The entries left on
        disk are originals already put back: a later rollback writes them again, harmlessly."""
        try:
            self.save()
            self.save_error = ""
        except (HkError, OSError) as e:
            self.save_error = str(e)

    # ------------------------------------------------------------ undo
    def undo_run(self, restore: Callable[[Change], None]) -> list[tuple[Change, str]]:
        """Undo this run's writes, newest first; then keep only the originals still needed:
        earlier runs' entries, what could not be restored and what was refused and stuck."""
        errs = []
        for c in reversed(self.written):
            try:
                restore(c)
            except HkError as e:
                errs.append((c, f"{c.subsystem} {c.target} {c.key}: {e}"))
                self._log("undo-failed", c, str(e))
                continue
            self._log("undo", c)
            self._drop(c)
        keep = {c.setting for c, _ in errs} | {c.setting for c in self.stuck}
        mine = {c.setting for c in self.this_run} - keep - self.earlier
        self.entries = [e for e in self.entries if e.setting not in mine]
        self._save_undoing()
        return errs

    def finish(self) -> None:
        self.save()
